"""The MCP server over streamable HTTP at `/mcp` on the orchestrator.

The SDK's ASGI app runs on an event loop of its own (one thread, started by the first `/mcp` request) and is
called from the WSGI server through a2wsgi. `/mcp` is a Flask route like the others, so the server's guard
checks its bearer token and browser Origin before the SDK sees a byte. The transport is stateless and answers
in JSON: every call is one HTTP exchange, with no session or open stream to hold a worker thread.
"""

from __future__ import annotations

import asyncio
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

    def wsgi(self) -> Any:
        with self._lock:
            if self._wsgi is None:
                self._wsgi = self._start()
            return self._wsgi

    def _start(self) -> Any:
        from a2wsgi import ASGIMiddleware
        from mcp.server.transport_security import TransportSecuritySettings

        from .tools import build_server

        server = build_server(self.engine, calls=self.call_of)
        logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)  # a line per call otherwise
        # Host and Origin are the orchestrator's business (its guard runs first), as for every other route.
        asgi = server.streamable_http_app(
            streamable_http_path=PATH, stateless_http=True, json_response=True,
            max_request_body_size=self.engine.config.max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="mcp-http", daemon=True).start()
        started = threading.Event()

        async def sessions() -> None:
            async with server.session_manager.run():  # what the ASGI lifespan would do; a2wsgi sends none
                started.set()
                await asyncio.Event().wait()

        running = asyncio.run_coroutine_threadsafe(sessions(), loop)
        if not started.wait(START_TIMEOUT):
            running.cancel()
            raise RuntimeError("the MCP session manager did not start")
        log.info("MCP over streamable HTTP at %s", PATH)
        return ASGIMiddleware(asgi, loop=loop)


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
        key = uuid.uuid4().hex
        environ[CALL_ENVIRON] = key
        disconnected = environ.get("waitress.client_disconnected")
        with disconnects.watching(disconnected, getattr(g, "request_id", key)) as work:
            endpoint.calls[key] = work
            try:
                return Response.from_app(endpoint.wsgi(), environ, buffered=True)
            finally:
                endpoint.calls.pop(key, None)

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
