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
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from flask import Response

from .progress import Watch, watching

log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
KEEP_ALIVE_SECONDS = 10.0  # a comment line while a step runs long, so proxies keep the stream open
CHECK_SECONDS = 0.5  # how often a silent stream asks whether its client is still there

# (HTTP status, JSON body, extra headers): one call's answer, sent whole or as a stream's last event
Answer = tuple[int, Any, dict[str, str]]


def failure(message: str, status: int, kind: str | None = None, headers: dict[str, str] | None = None) -> Answer:
    return status, {"error": {"message": message, **({"type": kind} if kind else {})}}, headers or {}


def wants_events(accept: str | None) -> bool:
    """Does the Accept header name the event stream (with a quality above 0)? `*/*` and JSON do not."""
    for part in (accept or "").split(","):
        media, _, params = part.partition(";")
        if media.strip().lower() != EVENT_STREAM:
            continue
        quality = 1.0
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


def stream_call(call: Callable[[], Answer], disconnected: Callable[[], bool] | None, *, name: str) -> Response:
    """Run `call` on a thread of its own under a `Watch`, and stream its progress, then its answer."""
    events: queue.Queue[tuple[str, Any] | None] = queue.Queue()
    watch = Watch(lambda event: events.put(("progress", event)))

    def work() -> None:
        try:
            with watching(watch):
                status, payload, _headers = call()
            if status == 200:
                events.put(("result", payload))
            else:
                events.put(("error", {**payload, "status": status}))
        except BaseException as exc:  # noqa: BLE001 - `call` answers its own errors; this is a last resort
            log.exception("a streamed call failed")
            events.put(("error", {"error": {"message": f"internal error ({exc.__class__.__name__})"}, "status": 500}))
        finally:
            events.put(None)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(work,), name=name, daemon=True)
    thread.start()

    def generate() -> Iterator[str]:
        silent = 0.0
        try:
            while True:
                try:
                    item = events.get(timeout=CHECK_SECONDS)
                except queue.Empty:
                    if disconnected is not None and disconnected():
                        watch.stop()
                        return
                    silent += CHECK_SECONDS
                    if silent >= KEEP_ALIVE_SECONDS:
                        silent = 0.0
                        yield ": keep-alive\n\n"
                    continue
                if item is None:
                    return
                silent = 0.0
                yield _event(*item)
        except BaseException:  # the client left (GeneratorExit at a yield), or the stream broke: stop the work
            watch.stop()
            raise

    return Response(generate(), mimetype=EVENT_STREAM, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
