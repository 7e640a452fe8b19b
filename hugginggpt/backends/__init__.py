"""Where a model runs: the local models server, hosted inference, or the LLM itself.

Every backend takes TaskInputs and returns a JARVIS-shaped inference result (`generated image`,
`predicted`, ...), so the rest of the pipeline never cares where a model ran.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BackendError
from ..resources import Resource


@dataclass(frozen=True)
class TaskInputs:
    task: str
    text: str | None = None
    image: Resource | None = None
    audio: Resource | None = None


@dataclass(frozen=True)
class ModelStatus:
    """Whether a backend can run a model now and, if not, why (a line the user reads in the selection's error).
    `lasting`: an answer worth remembering for status_cache_seconds; False when the question could not be asked
    (the Hub failed or was slow), so the next request asks again."""

    available: bool
    why: str = ""
    lasting: bool = True


class Backend(Protocol):
    name: str  # "local" | "huggingface"

    def is_available(self, model_id: str) -> bool: ...

    # optional: `model_status(model_id) -> ModelStatus`, the same answer with the reason (select.Availability)

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]: ...


class HostedFailure(BackendError):
    """A hosted model failed on every provider tried. `tried`: one {"model", "hosted_on", "provider", "error"} per
    provider; `final`: no other hosted model would fare better; `account`: because the account itself was refused
    (a bad token, no credits left: the rest of the request sends nothing there), which is what `final` means
    unless said otherwise (the request's deadline passing is final, but no refusal)."""

    def __init__(self, message: str, tried: list[dict[str, str]], final: bool = False, account: bool | None = None):
        super().__init__(message)
        self.tried = tried
        self.final = final
        self.account = final if account is None else account


CUT_OFF = "cut off: the request's deadline passed while it ran"
# the task's listener for attempts in flight (execute.py sets it per task): called with one model's attempts so
# far, the last one still running, so a deadline that cuts the task off still shows what was tried
_ATTEMPTS: contextvars.ContextVar[Callable[[list[dict[str, str]]], None] | None] = contextvars.ContextVar(
    "attempts", default=None)


def note_attempts(tried: list[dict[str, str]], running: dict[str, str]) -> None:
    """Tell the task's listener (if any) what this model has tried so far and what runs now."""
    listener = _ATTEMPTS.get()
    if listener is not None:
        listener([*tried, {**running, "error": CUT_OFF}])


def listening_to_attempts(listener: Callable[[list[dict[str, str]]], None] | None) -> contextvars.Token:
    return _ATTEMPTS.set(listener)


def stop_listening(token: contextvars.Token) -> None:
    _ATTEMPTS.reset(token)
