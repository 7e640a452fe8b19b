"""Cancelling a request stops its work, not just its bookkeeping.

A client that disconnects from a stream (or presses Stop) cancels its request. Setting a flag is not enough:
the LLM call or model call in flight would run on, holding a connection to the LLM and a thread, for as long
as the peer takes. Every request carries a `CancelToken` in the context of all its threads (`CURRENT`, copied
into the request's thread pools); outbound I/O made under a token (`urlpolicy.deadline_scope`) hooks its
sockets to it, and `cancel()` shuts them down, which wakes a blocked read at once. New I/O after a cancel
fails before it connects, and waits between retries end early.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import threading
from collections.abc import Callable, Iterator

from .errors import HuggingGPTError

log = logging.getLogger(__name__)


class Cancelled(HuggingGPTError):
    """The request was cancelled (its client left): nobody is waiting for an answer."""

    status = 499
    kind = "cancelled"


class CancelToken:
    """One request's cancellation: an event to check, and hooks run once when it is set."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: dict[int, Callable[[], None]] = {}
        self._keys = itertools.count()

    @property
    def cancelled(self) -> bool:
        return self.event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            hooks, self._hooks = list(self._hooks.values()), {}
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - one failed hook must not keep the others from stopping their work
                log.exception("a cancel hook failed")

    def _hooked(self, hook: Callable[[], None]) -> Iterator[None]:
        """`hook` runs if the token is cancelled while the block runs (at once if it is cancelled already)."""
        with self._lock:
            key = None if self.event.is_set() else next(self._keys)
            if key is not None:
                self._hooks[key] = hook
        if key is None:
            hook()
        try:
            yield
        finally:
            if key is not None:
                with self._lock:
                    self._hooks.pop(key, None)

    hooked = contextlib.contextmanager(_hooked)  # wrapped, not decorated: mutmut skips decorated functions

    def sleep(self, seconds: float) -> bool:
        """Wait `seconds` unless cancelled first; True when cancelled."""
        return self.event.wait(seconds)


CURRENT: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar("cancel_token", default=None)


def current() -> CancelToken | None:
    return CURRENT.get()


def cancelled() -> bool:
    token = CURRENT.get()
    return token is not None and token.event.is_set()


def check(what: str = "the request") -> None:
    """Raise Cancelled when this thread's request was cancelled."""
    if cancelled():
        raise Cancelled(f"{what} was cancelled (the client went away)")


def sleep(seconds: float) -> None:
    """time.sleep that ends early (raising Cancelled) when this thread's request is cancelled."""
    token = CURRENT.get()
    if token is None:
        import time

        time.sleep(seconds)
        return
    if token.sleep(seconds):
        check()
