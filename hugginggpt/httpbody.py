"""Refuse a request before its body is read: the token and the body limit judged on the headers (issue 29).

waitress reads a whole request body, spooling a large one to a temporary file, before it calls the app; so an
app's own checks (`MAX_CONTENT_LENGTH`, a bearer token) come only after a client has sent, say, 300 MB.
An app tells its server what it would refuse with a `BodyGate` in `app.extensions[BODY_GATE]`; the channel
class made here asks the gate as soon as a request's headers are complete, answers a refusal with the app's
JSON error shape, reads nothing more of that connection but a bounded drain, and closes it. A chunked body
is refused as soon as what has come passes the limit. The app keeps its own checks: this is an early copy.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from waitress.utilities import Error, RequestEntityTooLarge
from werkzeug.datastructures import EnvironHeaders

log = logging.getLogger(__name__)

BODY_GATE = "hugginggpt.body_gate"  # the app.extensions key `serve` looks for
LINGER_SECONDS = 2.0  # after a refusal: how long the rest of the request may still be read and dropped
LINGER_BYTES = 1024 * 1024  # ... and how much of it; then the connection is closed whatever the client does


@dataclass(frozen=True)
class Refusal:
    """An answer given in place of the app's: its status, the error message and its `type` (None: no type)."""

    status: int
    message: str
    kind: str | None = "invalid_request_error"


Check = Callable[[str, str, Mapping[str, str]], Refusal | None]
Render = Callable[[str, Refusal], dict[str, Any]]
Observe = Callable[[str, str, Refusal], None]


def plain_error(path: str, refusal: Refusal) -> dict[str, Any]:
    """`{"error": {"message", "type"}}`, the shape of both servers' errors (no `type` when kind is None)."""
    return {"error": {"message": refusal.message, **({"type": refusal.kind} if refusal.kind else {})}}


@dataclass(frozen=True)
class BodyGate:
    """What an app refuses knowing only a request's headers: bodies over `max_body_bytes`, and whatever `check`
    says (method, path, headers -> a Refusal or None; a missing or wrong token). `render` makes the JSON body of
    a refusal as the app would; `observe` is told of each refusal (the app's metrics)."""

    max_body_bytes: int
    check: Check | None = None
    too_large_kind: str | None = "invalid_request_error"
    render: Render = plain_error
    observe: Observe | None = None

    def too_large(self) -> Refusal:
        return Refusal(413, f"request body is larger than {self.max_body_bytes} bytes", self.too_large_kind)

    def judge(self, method: str, path: str, headers: Mapping[str, str], content_length: int | None) -> Refusal | None:
        """Token first (a client without one learns nothing about the limit), then the declared length."""
        refusal = self.check(method, path, headers) if self.check is not None else None
        if refusal is None and content_length is not None and content_length > self.max_body_bytes:
            refusal = self.too_large()
        return refusal


class JsonError(Error):
    """waitress's error response (its ErrorTask sends it and closes the connection), in the app's JSON."""

    def __init__(self, refusal: Refusal, body: dict[str, Any]):
        super().__init__(refusal.message)
        self.code = refusal.status
        self.reason = HTTPStatus(refusal.status).phrase
        self.json = json.dumps(body).encode()

    def to_response(self, ident: str | None = None) -> tuple[str, list[tuple[str, str]], bytes]:
        headers = [("Content-Type", "application/json"), ("X-Content-Type-Options", "nosniff")]
        return f"{self.code} {self.reason}", headers, self.json


def headers_of(raw: Mapping[str, str]) -> EnvironHeaders:
    """waitress's parsed headers (`AUTHORIZATION`, `CONTENT_LENGTH`) seen as the app sees them (`Authorization`)."""
    environ = {(k if k in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + k): v for k, v in raw.items()}
    return EnvironHeaders(environ)


def guarded_channel_class(base: type, gate: BodyGate) -> type:
    """A subclass of waitress's HTTPChannel `base` (and of its parser class) that asks `gate` about every
    request with a body once its headers are complete, and refuses chunked bodies past the limit."""

    class GuardedParser(base.parser_class):  # type: ignore[name-defined, misc]
        def __init__(self, adj: Any, channel: Any = None):
            super().__init__(adj)
            self.channel = channel

        def received(self, data: bytes) -> int:
            if self.completed:
                return 0
            in_headers = not self.headers_finished
            consumed = super().received(data)
            refusal = None
            judged = self.error is None or self.over_waitress_limit()
            if in_headers and self.headers_finished and self.has_body() and judged:
                # waitress counts a chunked body's content_length 0, which judges as None does
                length = None if self.chunked else self.content_length  # pragma: no mutate: see above
                refusal = gate.judge(self.command, self.path, headers_of(self.headers), length)
            # a body of a declared length was judged whole above; past the headers, a parser without a body is
            # completed already (received returns at once): only the chunked test can change what a client sees
            elif not in_headers and self.chunked and self.body_rcv is not None and self.error is None:  # pragma: no mutate
                if self.body_rcv.__len__() > gate.max_body_bytes:
                    refusal = gate.too_large()
            if refusal is None and self.over_waitress_limit():  # waitress's own max_request_body_size
                refusal = Refusal(413, f"request body is larger than {self.adj.max_request_body_size} bytes",
                                  gate.too_large_kind)
            return consumed if refusal is None else self.refuse(refusal, len(data))

        def over_waitress_limit(self) -> bool:
            return isinstance(self.error, RequestEntityTooLarge)

        def has_body(self) -> bool:
            return self.chunked or self.content_length > 0

        def refuse(self, refusal: Refusal, datalen: int) -> int:
            """Answer `refusal`, and take all of `data` so the channel parses none of the body as a request."""
            self.error = JsonError(refusal, gate.render(self.path, refusal))
            self.completed = True
            self.expect_continue = False  # no "100 Continue" for a body that will not be read
            if self.body_rcv is not None:
                self.body_rcv.getbuf().close()
                self.body_rcv = None
            if self.channel is not None:
                self.channel.refused = True
            log.info("refused %s %s before reading its body: %d %s", self.command, self.path[:100],
                     refusal.status, refusal.message)
            if gate.observe is not None:
                gate.observe(self.command, self.path, refusal)
            return datalen

    class GuardedChannel(base):  # type: ignore[misc, valid-type]
        # refused: a request of this connection was refused: read nothing more but the linger's drain;
        # linger_until: monotonic deadline once the refusal is sent and the write side shut; 0 before.
        # (None reads as False and 0.0, and a byte more or less of the drain is no difference a client sees.)
        refused = False  # pragma: no mutate: see above
        linger_until = 0.0  # pragma: no mutate: see above
        drained = 0  # pragma: no mutate: see above

        def parser_class(self, adj: Any) -> GuardedParser:  # waitress calls self.parser_class(adj)
            return GuardedParser(adj, self)

        def readable(self) -> bool:
            if self.linger_until:
                return True
            return not self.refused and super().readable()

        def handle_read(self) -> None:
            if not self.linger_until:
                return super().handle_read()
            try:
                data = self.recv(self.adj.recv_bytes)  # b"" (and closed) once the client closes
            except OSError:
                return super().handle_close()
            self.drained += len(data)
            # > or >= on a byte count of a 1 MiB drain and on a float clock: no client can tell
            if data and (self.drained > LINGER_BYTES or time.monotonic() > self.linger_until):  # pragma: no mutate
                super().handle_close()

        def handle_close(self) -> None:
            """After a refusal, close gently: shut the write side (the client reads the answer and an end) and
            drop what still comes for a moment. Closing at once with unread data would send a reset, which can
            cost a client still sending its body the answer."""
            if self.refused and not self.linger_until and self.connected and not self.total_outbufs_len:
                try:
                    self.socket.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                else:
                    self.linger_until = time.monotonic() + LINGER_SECONDS
                    self.will_close = False  # pragma: no mutate: None reads as False
                    return
            super().handle_close()

    GuardedChannel.__name__ = f"Guarded{base.__name__}"
    return GuardedChannel


def gate_of(app: Any) -> BodyGate | None:
    """The gate an app registered, if any (`serve` also runs apps without one)."""
    gate = getattr(app, "extensions", {}).get(BODY_GATE)
    return gate if isinstance(gate, BodyGate) else None


def guard_bodies(listeners: list[Any], gate: BodyGate) -> None:
    """Give every listening socket of a waitress server the guarded channel (over the one it has), and a
    sweep in its maintenance (once a cleanup_interval) that closes refused connections whose client has
    neither closed nor gone quiet by the end of the linger."""
    made: dict[type, type] = {}
    for listener in listeners:
        base = listener.channel_class
        if base not in made:
            made[base] = guarded_channel_class(base, gate)
        listener.channel_class = made[base]
        sweep = listener.maintenance

        def maintenance(now: float, sweep: Callable[[float], None] = sweep, listener: Any = listener) -> None:
            sweep(now)
            mono = time.monotonic()
            for channel in list(listener.active_channels.values()):
                # None reads as 0.0; > or >= on a float clock: no client can tell
                if getattr(channel, "linger_until", 0.0) and mono > channel.linger_until:  # pragma: no mutate
                    channel.will_close = True  # writable now: handle_write closes it

        listener.maintenance = maintenance
