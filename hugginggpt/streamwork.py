"""The pipeline of one streamed request, on a thread of its own, stopped when its client leaves.

A stream's client may leave at any time. Its request is then cancelled (`RequestState.cancel`: the LLM and
models-server calls in flight are cut, see cancel.py), and the admission slot it holds is given back only when
that work has really ended, so `max_concurrent_requests` counts the work that runs, not the clients connected.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable

from .admission import ReleaseWhenAll
from .request import RequestState

log = logging.getLogger(__name__)


class StreamWork:
    """`state_ready` goes to `HuggingGPT.run`; `cancel` may come before the state exists (it is then cancelled
    as soon as it does)."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.state: RequestState | None = None
        self._cancelled = False
        self._lock = threading.Lock()

    def state_ready(self, state: RequestState) -> None:
        with self._lock:
            self.state = state
            cancel = self._cancelled
        if cancel:
            state.cancel()

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            state = self.state
        log.info("[%s] client went away; cancelling", self.request_id)
        if state is not None:
            state.cancel()

    def start(self, body: Callable[[], None], slot: ReleaseWhenAll | None, name: str) -> None:
        """Run `body` on a new thread (in a copy of this context); `slot`, if any, is held until it returns."""
        if slot is not None:
            slot.add("work")

        def run() -> None:
            try:
                body()
            finally:
                if slot is not None:
                    slot.done("work")

        threading.Thread(target=contextvars.copy_context().run, args=(run,), name=name, daemon=True).start()
