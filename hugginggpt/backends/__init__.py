"""Where a model runs: the local models server, hosted inference, or the LLM itself.

Every backend takes TaskInputs and returns a JARVIS-shaped inference result (`generated image`,
`predicted`, ...), so the rest of the pipeline never cares where a model ran.
"""

from __future__ import annotations

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


class Backend(Protocol):
    name: str  # "local" | "huggingface"

    def is_available(self, model_id: str) -> bool: ...

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]: ...


class HostedFailure(BackendError):
    """A hosted model failed on every provider tried. `tried`: one {"model", "hosted_on", "provider", "error"} per
    provider; `final`: the account itself was refused (a bad token, no credits left), so no other hosted model
    would fare better."""

    def __init__(self, message: str, tried: list[dict[str, str]], final: bool = False):
        super().__init__(message)
        self.tried = tried
        self.final = final
