"""Admission: `max_concurrent_requests` slots, drawn from by every door of one server.

The HTTP routes, `/v1`, `/mcp`, the MCP stdio server and the Gradio app all take a slot from the engine's one
`Admission` (`HuggingGPT.admission`), so no door runs requests past the limit while another refuses them.
In one process the slots are a `threading.BoundedSemaphore`; the worker processes of one server share theirs
(`workers.SharedSlots`). Never a queue: past the limit a caller is refused at once (429).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

from .errors import HuggingGPTError


class Admission(Protocol):
    def acquire(self, blocking: bool = ...) -> bool: ...

    def release(self) -> None: ...


class Busy(HuggingGPTError):
    """Every slot is taken (HTTP 429): the caller may retry shortly."""

    status = 429
    kind = "rate_limit_error"


def local_slots(limit: int) -> Admission:
    return threading.BoundedSemaphore(limit)


def busy(limit: int) -> Busy:
    return Busy(f"the server is running {limit} requests (max_concurrent_requests); retry shortly")


def take(slots: Admission, limit: int) -> None:
    """Take one slot or raise Busy at once."""
    if not slots.acquire(blocking=False):
        raise busy(limit)


def _admitted(slots: Admission, limit: int) -> Iterator[None]:
    """One slot for the block; Busy at once when none is free."""
    take(slots, limit)
    try:
        yield
    finally:
        slots.release()


admitted = contextlib.contextmanager(_admitted)  # wrapped, not decorated: mutmut skips decorated functions


class ReleaseWhenAll:
    """Gives a slot back once every named party is done (e.g. "work" and "response" of a stream: the slot
    is held until the pipeline has really stopped and the client has what it was sent or has left)."""

    def __init__(self, slots: Admission, *parties: str):
        self._slots = slots
        self._waiting = set(parties)
        self._lock = threading.Lock()

    def add(self, party: str) -> None:
        """One more party to wait for (before the slot was given back)."""
        with self._lock:
            if not self._waiting:
                raise RuntimeError("the slot was given back already")
            self._waiting.add(party)

    def done(self, party: str) -> None:
        with self._lock:
            if party not in self._waiting:
                return
            self._waiting.discard(party)
            last = not self._waiting
        if last:
            self._slots.release()
