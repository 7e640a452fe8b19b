"""`POST /models/<id>` as a stream of progress events, for a client that asks with `Accept: text/event-stream`.

JARVIS's one-shot JSON answer stays for every other client. A watching client gets, as server-sent events:

    event: progress   data: {"phase": "loading"}                         (queued / downloading / loading / running)
    event: progress   data: {"phase": "running", "step": 3, "steps": 25, "fraction": 0.12, "eta": 4.1}
    event: result     data: <the JSON the one-shot answer carries>
 or event: error      data: {"error": {"message": ..., "type": ...}, "status": 503}

A request the server refuses before any work (an unknown model, a bad body, a missing token) is answered as
before, with its status and JSON error. A client that leaves while the call runs stops it at its next step.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flask import Response

from .progress import Watch, watching

log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
KEEP_ALIVE_SECONDS = 10.0  # a comment line while a step runs long, so proxies keep the stream open
CHECK_SECONDS = 0.5  # how often a silent stream asks whether its client is still there
LEAVE_CHECK_SECONDS = 0.1  # how often a one-shot call asks: the cost is one flag read, the gain a step sooner
# steps made within this of the last write of steps leave together in the next one (the orchestrator relays
# them at most every progress_interval_ms, 250 by default)
WRITE_GAP_SECONDS = 0.25

# (HTTP status, JSON body, extra headers): one call's answer, sent whole or as a stream's last event
Answer = tuple[int, Any, dict[str, str]]


def failure(message: str, status: int, kind: str | None = None, headers: dict[str, str] | None = None) -> Answer:
    return status, {"error": {"message": message, **({"type": kind} if kind else {})}}, headers or {}


def wants_events(accept: str | None) -> bool:
    """Does the Accept header name the event stream (with a quality above 0)? `*/*` and JSON do not."""
    for part in (accept or "").split(","):  # pragma: no mutate: no Accept names nothing, whatever stands in
        media, _, params = part.partition(";")
        if media.strip().lower() != EVENT_STREAM:
            continue
        quality = 1.0  # pragma: no mutate: any default above 0 accepts
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        return quality > 0
    return False


def _event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Outbox:
    """The events of one call, between the thread that makes them and the stream that sends them.

    Each write wakes the sending thread and the server's I/O loop; on a pipeline whose steps take a few
    milliseconds that costs more than the step. So events made within `gap` of the last write of steps (or
    download readings) wait for the next one and leave together, in order: every step still arrives, at most
    `gap` late. A change of phase (a handful a call) starts no gap, so the first step leaves as soon as it is
    made; the last event (`close`) leaves at once.
    """

    def __init__(self, gap: float = WRITE_GAP_SECONDS):
        self.gap = gap
        self._ready = threading.Condition()
        self._items: list[tuple[str, Any]] = []
        self._closed = False
        self._due = 0.0  # pragma: no mutate: when the next write may leave (any time before the clock's now)

    def put(self, name: str, data: Any) -> None:
        with self._ready:
            self._items.append((name, data))
            if len(self._items) == 1 or time.monotonic() >= self._due:  # pragma: no mutate: > on a float clock
                self._ready.notify()

    def close(self, name: str, data: Any) -> None:
        """The call's answer: sent with whatever waits, at once, and nothing after it."""
        with self._ready:
            self._items.append((name, data))
            self._closed = True
            self._ready.notify()

    def take(self, timeout: float) -> tuple[list[tuple[str, Any]], bool]:
        """Wait up to `timeout` for events due to leave: (the events, whether the call has answered)."""
        with self._ready:
            deadline = time.monotonic() + timeout
            while True:
                now = time.monotonic()
                if self._closed or (self._items and now >= self._due):
                    items, self._items = self._items, []
                    if any(name == "progress" and ("step" in data or "bytes" in data) for name, data in items):
                        self._due = now + self.gap
                    return items, self._closed
                if now >= deadline:  # pragma: no mutate: > on a float clock
                    return [], False
                self._ready.wait(min(deadline, self._due) - now if self._items else deadline - now)


def call_while_connected(call: Callable[[], Answer], disconnected: Callable[[], bool] | None,
                         check: float = LEAVE_CHECK_SECONDS) -> Answer:
    """A one-shot call that stops, as a streamed one does, once its client has left: it runs here under a `Watch`
    that reports to nobody, while a watcher asks every `check` seconds whether the client is still connected
    (waitress reads ahead on the connection, so it sees a close while the app runs). The work then ends at its next
    step or token, and its slot, memory and thread go back to the callers still waiting."""
    if disconnected is None:  # another WSGI server: the call runs to its end, as before
        return call()
    watch = Watch(lambda event: None)
    done = threading.Event()

    def watcher() -> None:
        while not done.wait(check):
            if disconnected():
                watch.stop()
                return

    threading.Thread(target=watcher, name="client-watch", daemon=True).start()  # pragma: no mutate: unseen
    try:
        with watching(watch):
            return call()
    finally:
        done.set()


def stream_call(call: Callable[[], Answer], disconnected: Callable[[], bool] | None, *, name: str,
                keep_alive: float = KEEP_ALIVE_SECONDS) -> Response:
    """Run `call` on a thread of its own under a `Watch`, and stream its progress, then its answer."""
    outbox = Outbox()
    watch = Watch(lambda event: outbox.put("progress", event))

    def work() -> None:
        try:
            with watching(watch):
                status, payload, _headers = call()
            answer = ("result", payload) if status == 200 else ("error", {**payload, "status": status})
        except BaseException as exc:  # noqa: BLE001 - `call` answers its own errors; this is a last resort
            log.exception("a streamed call failed")
            answer = ("error", {"error": {"message": f"internal error ({exc.__class__.__name__})"}, "status": 500})
        outbox.close(*answer)

    # the thread's name is for debuggers; a daemon, so that a stuck model never holds up the server's exit
    in_context = contextvars.copy_context().run
    thread = threading.Thread(target=in_context, args=(work,), name=name, daemon=True)  # pragma: no mutate: unseen
    thread.start()

    def generate() -> Iterator[str]:
        silent = 0.0
        try:
            while True:
                items, answered = outbox.take(CHECK_SECONDS)
                if items:
                    silent = 0.0
                    yield "".join(_event(*item) for item in items)
                    if answered:
                        return
                    continue
                if disconnected is not None and disconnected():
                    watch.stop()
                    return
                silent += CHECK_SECONDS
                if silent >= keep_alive:
                    silent = 0.0
                    yield ": keep-alive\n\n"
        except BaseException:  # the client left (GeneratorExit at a yield), or the stream broke: stop the work
            watch.stop()
            raise

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # pragma: no mutate: names in any case
    return Response(generate(), mimetype=EVENT_STREAM, headers=headers)
