"""The pipeline of one request stopped when its client leaves: streamed (on a thread of its own) or not.

A stream's client may leave at any time. Its request is then cancelled (`RequestState.cancel`: the LLM and
models-server calls in flight are cut, see cancel.py), and the admission slot it holds is given back only when
that work has really ended, so `max_concurrent_requests` counts the work that runs, not the clients connected.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator

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
        self._thread: threading.Thread | None = None
        self._slot: ReleaseWhenAll | None = None

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

    def start(self, body: Callable[[], None], slot: ReleaseWhenAll | None, name: str) -> threading.Thread:
        """Run `body` on a new thread (in a copy of this context); `slot`, if any, is held until it returns."""
        if slot is not None:
            slot.add("work")

        def run() -> None:
            try:
                body()
            finally:
                if slot is not None:
                    slot.done("work")

        thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name=name, daemon=True)
        try:
            thread.start()
        except BaseException:  # no thread to give the slot back ("can't start new thread"): give it back here
            if slot is not None:
                slot.done("work")
            raise
        self._thread, self._slot = thread, slot
        return thread

    def ended(self) -> None:
        """Called by the stream once `body` has sent its last event: waits for its thread to end (a few lines
        after that event) and gives the response's share of the slot back before the stream's last bytes go
        out, so a client that reads the end of one stream and asks again at once is not refused with a 429
        for a slot that only a closing socket still held."""
        if self._thread is not None:
            self._thread.join()
        if self._slot is not None:
            self._slot.done("response")


class DisconnectWatch:
    """Requests answered in one piece have no stream to fail when their client leaves: one thread per app
    checks their connections (waitress's `client_disconnected`) a few times a second and cancels the work of
    those whose client went away."""

    def __init__(self, period: float = 0.5):
        self.period = period
        self._watched: dict[int, tuple[Callable[[], bool], StreamWork]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def _watching(self, disconnected: Callable[[], bool] | None, request_id: str) -> Iterator[StreamWork]:
        """A StreamWork (its `state_ready` for `HuggingGPT.run`) cancelled if `disconnected()` turns true while
        the block runs. Without `disconnected` (another WSGI server), nothing is watched."""
        work = StreamWork(request_id)
        if disconnected is None:
            yield work
            return
        key = id(work)
        with self._lock:
            self._watched[key] = (disconnected, work)
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="disconnect-watch", daemon=True)
                thread.start()  # may fail (no more threads): the next request tries again
                self._thread = thread
            self._wake.notify()
        try:
            yield work
        finally:
            with self._lock:
                self._watched.pop(key, None)

    watching = contextlib.contextmanager(_watching)  # wrapped, not decorated: mutmut skips decorated functions

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched:
                    self._wake.wait()
                watched = list(self._watched.values())
            for disconnected, work in watched:
                try:
                    gone = disconnected()
                except Exception:  # noqa: BLE001 - a closed channel may fail to say; then it is gone
                    gone = True
                if gone:
                    work.cancel()
            time.sleep(self.period)
