"""Reading the models server's event stream of one call (`Accept: text/event-stream`, modelhost/progress_stream.py).

`progress` events go to the task's listener as they arrive; the stream's `result` or `error` event is the call's
answer, returned as the one-shot protocol would have answered it (status, JSON bytes). A models server that does
not stream (an older one, or a refusal before any work) answers JSON, which is returned as it came.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import BackendError

log = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
WATCH = {"Accept": EVENT_STREAM}  # pragma: no mutate: header names are case-insensitive
MAX_EVENT_BYTES = 256 * 1024 * 1024  # an answer's event: the JSON of one result (files travel by path)


def _events(lines: Iterator[bytes]) -> Iterator[tuple[str, str]]:
    """(event name, data) of each event, by the SSE rules this server's streams use: `event:` and `data:` lines
    up to a blank line; comment lines (`: keep-alive`) skipped."""
    name, data, size = "message", [], 0
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data, size = "message", [], 0
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            name = value
        elif field == "data":
            size += len(value)
            if size > MAX_EVENT_BYTES:
                raise BackendError("the local models server sent an event larger than "
                                   f"{MAX_EVENT_BYTES // 2**20} MB")
            data.append(value)
    if data:
        yield name, "\n".join(data)


def read_events(resp: Any, listen: Callable[[dict[str, Any]], None]) -> tuple[int, bytes]:
    """The call's (status, JSON bytes), its progress events handed to `listen` on the way."""
    if (resp.headers.get("Content-Type") or "").split(";")[0].strip().lower() != EVENT_STREAM:
        return resp.status, resp.read()
    for name, data in _events(iter(resp)):
        if name == "progress":
            try:
                listen(json.loads(data))
            except Exception:  # noqa: BLE001 - a report that cannot be read or relayed is not the call's failure
                log.debug("progress event dropped", exc_info=True)
            continue
        if name in ("result", "error"):
            if name == "result":
                return 200, data.encode()
            try:
                answer = json.loads(data)
                status = answer.pop("status", 500) if isinstance(answer, dict) else 500
            except ValueError:
                return 500, data.encode()
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                status = 500
            return status, json.dumps(answer).encode()
    raise BackendError("the local models server ended its event stream without an answer")
