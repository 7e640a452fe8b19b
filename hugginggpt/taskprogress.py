"""A running task's progress, from the backend that runs it to the request's event stream (issue 48).

The models server reports where a call is (queued, downloading, loading, running with its steps); a hosted
provider may report a queue or a status. A backend hands each report to `report()`; the executor listens
(`listening`) for the one task whose model call it runs and relays what it hears as `task_progress` events:
each change of phase and a task's last step at once, other steps at most once per `interval` seconds, so a
50-step run on a fast GPU sends a few events a second, not fifty.

What is relayed is rebuilt from known fields with checked types (`clean`): a models server or provider can add
nothing else (no path, URL or token) to what the client sees, and a number that is not finite is dropped.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .modelhost.progress import PHASES  # the models server's phases: one vocabulary on both sides
from .textsafe import one_line

MAX_WAITING = 200  # characters of a `waiting` sentence

Listener = Callable[[dict[str, Any]], None]
_LISTENER: contextvars.ContextVar[Listener | None] = contextvars.ContextVar("task_progress", default=None)


def listener() -> Listener | None:
    """The task's listener, if anyone watches (a backend asks the models server for events only then)."""
    return _LISTENER.get()


def report(event: dict[str, Any]) -> None:
    """A backend's report of where its call is; nothing happens when nobody listens."""
    listen = _LISTENER.get()
    if listen is not None:
        listen(event)


def _listening(listen: Listener | None) -> Iterator[None]:
    token = _LISTENER.set(listen)
    try:
        yield
    finally:
        _LISTENER.reset(token)


listening = contextlib.contextmanager(_listening)  # wrapped, not decorated: mutmut skips decorated functions


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def clean(event: Any) -> dict[str, Any] | None:
    """The fields a client may see, typed; None for an event that is not a progress report."""
    if not isinstance(event, dict) or event.get("phase") not in PHASES:
        return None
    out: dict[str, Any] = {"phase": event["phase"]}
    for key in ("step", "steps", "bytes", "total_bytes"):
        if (n := _count(event.get(key))) is not None:
            out[key] = n
    fraction = _number(event.get("fraction"))
    if fraction is not None:
        out["fraction"] = round(min(fraction, 1.0), 4)
    eta = _number(event.get("eta"))
    if eta is not None:
        out["eta"] = round(eta, 2)
    waiting = event.get("waiting")
    if isinstance(waiting, str) and waiting:
        out["waiting"] = one_line(waiting)[:MAX_WAITING]  # shown on one line by every door
    return out


def describe(progress: dict[str, Any]) -> str:
    """A progress event in words, as the CLI and the Gradio app show it (the web page says the same in JavaScript):
    `step 10 of 25 · about 4 s left`, `downloading 12.0 of 40.0 MB`, `queued: another model is loading`."""
    phase = progress.get("phase")
    text = {"queued": "queued", "downloading": "downloading", "loading": "loading the model",
            "running": "running"}.get(phase, str(phase))
    if progress.get("waiting"):
        text += f": {progress['waiting']}"
    if progress.get("step") is not None and progress.get("steps"):
        text = f"step {progress['step']} of {progress['steps']}"
    if phase == "downloading" and progress.get("bytes") is not None:
        total = progress.get("total_bytes")
        text += f" {progress['bytes'] / 1e6:.1f}{f' of {total / 1e6:.1f}' if total else ''} MB"
    eta = progress.get("eta")
    if progress.get("step") is not None and progress.get("step") == progress.get("steps"):
        return text + " · finishing"  # the steps are done, the result is not: decoding and saving it come last
    if eta is not None and eta > 0:  # none: "about 0 s left" while work goes on reads as a hang
        text += f" · about {math.ceil(eta)} s left" if eta < 90 else f" · about {round(eta / 60)} min left"
    return text


class Relay:
    """One task's progress into `emit`: each change of phase and the last step at once; other reports at most
    once per `interval` seconds (the newest one wins: a step skipped is never sent late)."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], interval: float,
                 clock: Callable[[], float] = time.monotonic):
        self._emit = emit
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._phase: tuple[Any, Any] | None = None  # pragma: no mutate: any non-tuple start differs from every phase
        self._sent_at: float | None = None  # pragma: no mutate: read only after the first event (a new phase) set it

    def __call__(self, event: dict[str, Any]) -> None:
        cleaned = clean(event)
        if cleaned is None:
            return
        now = self._clock()
        with self._lock:
            phase = (cleaned["phase"], cleaned.get("waiting"))
            last_step = "step" in cleaned and cleaned["step"] == cleaned.get("steps")
            done_bytes = "bytes" in cleaned and cleaned["bytes"] == cleaned.get("total_bytes")
            changed = phase != self._phase
            if not (changed or last_step or done_bytes) and self._sent_at is not None \
                    and now - self._sent_at < self.interval:
                return
            self._phase, self._sent_at = phase, now
            self._emit(cleaned)
