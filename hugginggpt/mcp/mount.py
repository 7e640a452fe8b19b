"""The MCP server over streamable HTTP at `/mcp` on the orchestrator.

The SDK's ASGI app runs on an event loop of its own (one thread, started by the first `/mcp` request) and is
called from the WSGI server through a2wsgi. `/mcp` is a Flask route like the others, so the server's guard
checks its bearer token and browser Origin before the SDK sees a byte. The transport is stateless and answers
in JSON: every call is one HTTP exchange, with no session or standing stream to hold a worker thread. A tool call
whose client gave a progress token is answered as server-sent events instead (MCP's streamable HTTP lets a server
answer a POST either way; clients take both), so its progress notifications arrive while the tool runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import threading
import uuid
from typing import Any

from flask import Flask, Response, g, request

from ..chat import HuggingGPT
from ..streamwork import DisconnectWatch, StreamWork

log = logging.getLogger(__name__)

PATH = "/mcp"
START_TIMEOUT = 30.0
CALL_HEADER = "X-HuggingGPT-MCP-Call"
CALL_ENVIRON = "HTTP_" + CALL_HEADER.upper().replace("-", "_")  # set by the server: a client's own is replaced
HOP_BY_HOP = ("Connection", "Keep-Alive", "Transfer-Encoding", "TE", "Trailer", "Upgrade", "Proxy-Authenticate",
              "Proxy-Authorization")
REFUSED = -32001  # JSON-RPC "server error" range: refused before the MCP server saw the request


class McpEndpoint:
    """The SDK's streamable-HTTP app as a WSGI app, started on first use."""

    def __init__(self, engine: HuggingGPT):
        self.engine = engine
        self._lock = threading.Lock()
        self._wsgi: Any = None
        self.calls: dict[str, StreamWork] = {}  # CALL_HEADER -> the call's work, while its HTTP request runs

    def call_of(self, ctx: Any) -> StreamWork | None:
        """The work of the tool call `ctx` is for (found by the header `mount` put in its request)."""
        try:
            request = ctx.request_context.request
        except (AttributeError, ValueError):
            return None
        key = request.headers.get(CALL_HEADER) if request is not None else None
        return self.calls.get(key) if key else None

    def wsgi(self, streamed: bool) -> Any:
        """The app that answers in JSON, or the one that answers as a stream (`streamed`)."""
        with self._lock:
            if self._wsgi is None:
                self._wsgi = self._start()
            return self._wsgi[streamed]

    def _start(self) -> dict[bool, Any]:
        from a2wsgi import ASGIMiddleware
        from mcp.server.transport_security import TransportSecuritySettings

        from .tools import build_server

        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)  # a line per call otherwise
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="mcp-http", daemon=True).start()
        apps: dict[bool, Any] = {}
        try:
            for streamed in (False, True):  # the SDK answers all calls of a server one way: a server for each
                server = build_server(self.engine, calls=self.call_of)
                # Host and Origin are the orchestrator's business (its guard runs first), as for every other route.
                asgi = server.streamable_http_app(
                    streamable_http_path=PATH, stateless_http=True, json_response=not streamed,
                    max_request_body_size=self.engine.config.max_body_bytes,
                    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
                started = threading.Event()

                async def sessions(server: Any = server, started: threading.Event = started) -> None:
                    async with server.session_manager.run():  # what the ASGI lifespan would do; a2wsgi sends none
                        started.set()
                        await asyncio.Event().wait()

                running = asyncio.run_coroutine_threadsafe(sessions(), loop)
                if not started.wait(START_TIMEOUT):
                    running.cancel()
                    raise RuntimeError("the MCP session manager did not start")
                apps[streamed] = ASGIMiddleware(asgi, loop=loop)
        except BaseException:  # no app to serve: the loop's thread ends too (each later try starts its own)
            asyncio.run_coroutine_threadsafe(wind_down(), loop)
            raise
        log.info("MCP over streamable HTTP at %s", PATH)
        return apps


async def wind_down() -> None:
    """Every other task of the running loop cancelled and let end (a session manager leaves its context), then
    the loop stopped, so that its thread ends."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    asyncio.get_running_loop().stop()


def wants_progress(body: bytes) -> bool:
    """Is this a tool call whose client gave a progress token (`params._meta.progressToken`)? Its answer is then a
    stream (the notifications, then the result); every other message is answered in JSON, as before."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return False  # the SDK answers it with its own error
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return isinstance(token, (str, int)) and not isinstance(token, bool)


def mount(app: Flask, engine: HuggingGPT, disconnects: DisconnectWatch) -> None:
    """Serve MCP at `/mcp` (the caller puts the path under its token and Origin guard)."""
    endpoint = McpEndpoint(engine)

    def mcp() -> Response:
        if request.method != "POST":
            # Stateless: no stream for the server to push on (GET) and no session to end (DELETE). The spec's
            # answer is 405; an SSE stream with nothing to say would only hold a server thread open.
            resp = Response(json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                "code": REFUSED, "message": f"{PATH} takes POST (stateless streamable HTTP: no GET stream, "
                                           "no session to delete)"}}), 405, mimetype="application/json")
            resp.headers["Allow"] = "POST"
            return resp
        # the call's client leaving cancels its work, as for the other routes: a key only this server sets
        # links the tool call, on the MCP event loop's threads, to this request's connection
        environ = request.environ
        body = request.get_data()  # at most max_body_bytes (the server's body gate); handed on to the SDK below
        environ["wsgi.input"] = io.BytesIO(body)
        streamed = wants_progress(body)
        key = uuid.uuid4().hex
        environ[CALL_ENVIRON] = key
        disconnected = environ.get("waitress.client_disconnected")
        # held until the answer has been sent (a tool call's answer is a stream: its progress notifications,
        # then its result), not until the view returns
        held = contextlib.ExitStack()
        work = held.enter_context(disconnects.watching(disconnected, getattr(g, "request_id", key)))
        endpoint.calls[key] = work
        held.callback(endpoint.calls.pop, key, None)
        try:
            resp = Response.from_app(endpoint.wsgi(streamed), environ, buffered=not streamed)
        except BaseException:
            held.close()
            raise
        resp.call_on_close(held.close)
        for name in HOP_BY_HOP:  # the SDK's event stream says `Connection: keep-alive`: the server's to say (PEP 3333)
            resp.headers.pop(name, None)
        return resp

    app.add_url_rule(PATH, "mcp", mcp, methods=["GET", "POST", "DELETE"])

    @app.after_request
    def refusal_as_json_rpc(resp: Response) -> Response:
        """The server's own refusals at /mcp (token, Origin) as JSON-RPC errors, which MCP clients show as they
        are ("the bearer token is not one of this server's api_tokens") instead of a bare HTTP status."""
        if request.path != PATH or resp.status_code < 400 or not resp.is_json:
            return resp
        body = resp.get_json(silent=True)
        error = body.get("error") if isinstance(body, dict) and "jsonrpc" not in body else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            resp.set_data(json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                "code": REFUSED, "message": error["message"], "data": {"type": error.get("type"),
                                                                      "status": resp.status_code}}}))
        return resp
