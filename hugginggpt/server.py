"""The orchestration server: Flask app factory, JSON errors, SSE streaming, static public/, access control.

Clients are untrusted, a web page in the user's browser included: API routes take a bearer token when
`api_tokens` is set, JSON routes take only `application/json` (so a foreign page cannot send a "simple"
request that skips the CORS preflight), and a POST from a browser origin that is not allowed is refused
before it runs.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import queue
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from flask import Flask, Response, g, jsonify, request, send_from_directory
from flask_cors import CORS
from flask_cors.core import get_cors_options, get_cors_origins
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .access import allowed_host_names, bearer_ok, bearer_token, host_allowed, host_name, send_public_file
from .admission import Admission, ReleaseWhenAll, busy
from .chat import ChatRequest, HuggingGPT
from .config import Config, HttpLimits
from .errors import BadRequest, Forbidden, HuggingGPTError, Unauthorized, UnsupportedMediaType
from .mcp.mount import mount as mount_mcp
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .openai_api import ROUTES as OPENAI_ROUTES
from .openai_api import register as register_openai_routes
from .request import search_query
from .requestctx import HEADER as REQUEST_ID_HEADER
from .requestctx import request_id_from_header
from .streamwork import DisconnectWatch, StreamWork
from .uploads import UploadStore

log = logging.getLogger(__name__)

MODES = {"/hugginggpt": "answer", "/tasks": "tasks", "/results": "results"}
API_ROUTES = (*MODES, "/upload", "/models/search", "/mcp", "/metrics", *OPENAI_ROUTES)
LOCAL_ORIGINS = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
# header names, each written once (HTTP compares them without regard to case)
HOST, AUTHORIZATION, NOSNIFF = "Host", "Authorization", "X-Content-Type-Options"
RETRY_AFTER, CACHE_CONTROL, NO_BUFFERING = "Retry-After", "Cache-Control", "X-Accel-Buffering"
# what a page in a browser may send: a request id, and MCP (flask-cors compares both without regard to case)
CORS_METHODS = ("GET", "POST", "OPTIONS")
CORS_HEADERS = ("Content-Type", AUTHORIZATION, REQUEST_ID_HEADER, "Mcp-Protocol-Version", "Mcp-Session-Id")
POST_ONLY = ("POST",)  # the routes that take a body; every other route takes GET (Flask's default) and HEAD
EVENT_JSON = json.JSONEncoder(ensure_ascii=False, default=str)  # an SSE event: UTF-8 as it is, a Path as its text
HEARTBEAT_SECONDS = 10.0  # pragma: no mutate: a comment line every 10 s or 11 s; a test cannot wait for it
WEB_DIR = Path(__file__).resolve().parent / "web"


def error_response(message: str, status: int, kind: str) -> Response:
    error: dict[str, Any] = {"message": message, "type": kind}
    if request and request.path.startswith("/v1/"):  # OpenAI's shape, for its SDKs
        error.update(param=None, code="model_not_found" if status == 404 else None)
    resp = jsonify({"error": error})
    resp.status_code = status
    return resp


def create_app(config: Config, engine: HuggingGPT | None = None, admission: Admission | None = None) -> Flask:
    """One app per config; tests start several side by side. `admission`: the slots of max_concurrent_requests
    (shared by the workers of one server; this app's own when None)."""
    engine = engine or HuggingGPT(config)
    if admission is not None:
        engine.admission = admission  # every door of this app (routes, /v1, /mcp) draws from these slots
    public = config.public_dir.resolve()
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["hugginggpt"] = engine

    origins = list(config.cors_origins) or [LOCAL_ORIGINS]
    CORS(app, origins=origins, methods=CORS_METHODS, max_age=600, allow_headers=CORS_HEADERS,
         expose_headers=[REQUEST_ID_HEADER])  # a page may read the request id back
    uploads = UploadStore(public, config.upload_quota_bytes, config.max_image_pixels)

    cors_options = get_cors_options(app, {"origins": origins})

    def origin_allowed(origin: str) -> bool:
        """The same rule flask-cors applies to responses, applied to the request before it runs."""
        same = origin.rstrip("/") + "/" == request.host_url  # which ends in "/"
        return same or get_cors_origins(cors_options, origin) is not None

    metrics = engine.metrics

    host_names = allowed_host_names(config.http_host, config.allowed_hosts)

    # routes are registered by call, not by decorator: mutmut skips decorated functions (docs/TESTING.md)
    def guard() -> None:
        g.request_id = request_id_from_header(request.headers.get(REQUEST_ID_HEADER))
        if not config.api_tokens and not host_allowed(request.headers.get(HOST), host_names):
            # DNS rebinding: a web page whose name now resolves to this machine is same-origin with it in the
            # browser, so without a token only the names this server is known by are answered
            raise Forbidden(f"this server does not answer to the host name "
                            f"{host_name(request.headers.get(HOST))[:100]!r}; add it to allowed_hosts in its "
                            "config (or set api_tokens)")
        if request.method == "OPTIONS" or request.path not in API_ROUTES:
            return
        origin = request.origin
        if origin and not origin_allowed(origin):
            raise Forbidden(f"requests from the web origin {origin[:100]} are not allowed; add it to cors_origins")
        refused = token_problem(request.headers.get(AUTHORIZATION), config.api_tokens)
        if refused is not None:
            raise refused
    app.before_request(guard)

    def no_sniff(resp: Response) -> Response:
        resp.headers[NOSNIFF] = "nosniff"
        resp.headers[REQUEST_ID_HEADER] = g.get("request_id") or request_id_from_header(None)
        route = request.url_rule.rule if request.url_rule is not None else "other"
        metrics.http_requests.labels(route, str(resp.status_code)).inc()
        return resp
    app.after_request(no_sniff)

    def known_error(exc: HuggingGPTError) -> Response:
        log.warning("request failed: %s", exc)
        return error_response(str(exc), exc.status, exc.kind)
    app.register_error_handler(HuggingGPTError, known_error)

    def too_large(exc: RequestEntityTooLarge) -> Response:
        return error_response(f"request body is larger than {config.max_body_bytes} bytes", 413,
                              "invalid_request_error")
    app.register_error_handler(RequestEntityTooLarge, too_large)

    def http_error(exc: HTTPException) -> Response:
        # exc.code is set: Flask answers an HTTPException without one itself, before any handler
        resp = error_response(exc.description or exc.name, exc.code, "invalid_request_error")
        if getattr(exc, "valid_methods", None):  # a 405 names the methods the resource takes (HTTP requires it)
            resp.headers["Allow"] = ", ".join(exc.valid_methods)
        return resp
    app.register_error_handler(HTTPException, http_error)

    def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return error_response(f"internal error ({exc.__class__.__name__}); see the server log", 500, "server_error")
    app.register_error_handler(Exception, unexpected)

    def read_body() -> dict[str, Any]:
        if request.content_length and request.content_length > config.max_body_bytes:
            raise RequestEntityTooLarge()
        if not request.is_json:
            got = request.mimetype or "none"
            raise UnsupportedMediaType(f"send the body as JSON with `Content-Type: application/json` (got {got})")
        example = "e.g. {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}"
        try:
            data = request.get_data(cache=False)  # pragma: no mutate: caching the body costs only memory
            body = json.loads(data)
        except RecursionError:
            raise BadRequest("the JSON body is nested too deeply") from None
        except UnicodeDecodeError:
            raise BadRequest("the request body is not UTF-8 text") from None
        except ValueError:
            raise BadRequest(f"the request body must be JSON, {example}; this is not valid JSON") from None
        return body

    slots = engine.admission

    def admitted(run: Callable[[], Response]) -> Response:
        """Admission first: past max_concurrent_requests a client gets 429 at once instead of a silent queue.
        The slot is given back when the answer is ready and, for a stream, when its work has ended and the
        last event is about to go, or when the client left and the work ended (`g.slot`)."""
        if not slots.acquire(blocking=False):
            metrics.rejected.inc()
            refused = busy(config.max_concurrent_requests)  # the words every other door refuses with
            resp = error_response(str(refused), refused.status, refused.kind)
            resp.headers[RETRY_AFTER] = "1"
            return resp
        g.slot = slot = ReleaseWhenAll(slots, "response")
        try:
            resp = run()
        except BaseException:
            slot.done("response")
            raise
        if not resp.is_streamed:  # answered in one piece: the work has ended before a byte is sent, and a
            slot.done("response")  # client that reads this answer may ask again at once (never a 429 for it)
        else:  # a stream gives it back when its work has ended (StreamWork.ended), or here when the client leaves
            resp.call_on_close(lambda: slot.done("response"))
        return resp

    disconnects = DisconnectWatch()  # one thread for every door of this app (routes, /v1, /mcp)

    def handle(path: str) -> Response:
        return admitted(lambda: answer(path))

    def answer(path: str) -> Response:
        body = read_body()
        chat_request = ChatRequest.from_body(body)
        chat_request.request_id = g.request_id
        mode = MODES[path]
        if path == "/hugginggpt" and body.get("return_decisions") is True:
            mode = "decisions"
        for flag in ("return_decisions", "stream"):
            if flag in body and not isinstance(body[flag], bool):
                raise BadRequest(f"`{flag}` must be true or false")
        if body.get("stream") is True:
            return stream(chat_request, mode)
        with disconnects.watching(request.environ.get("waitress.client_disconnected"), chat_request.request_id) as work:
            return jsonify(engine.run(chat_request, mode, state_ready=work.state_ready))

    def stream(chat_request: ChatRequest, mode: str) -> Response:
        engine.llm_for(chat_request)  # fail fast (400) on bad overrides before the stream starts
        events: queue.Queue = queue.Queue()
        work = StreamWork(chat_request.request_id)
        disconnected = request.environ.get("waitress.client_disconnected")

        def run() -> None:
            try:
                result = engine.run(chat_request, mode, on_event=lambda name, e: events.put(e),
                                    state_ready=work.state_ready)
                if mode != "answer" or "message" not in (result if isinstance(result, dict) else {}):
                    events.put({"event": "result", "request_id": chat_request.request_id, "result": result})
            except HuggingGPTError as exc:
                events.put({"event": "error", "request_id": chat_request.request_id,
                            "error": {"message": str(exc), "type": exc.kind}})
            except Exception as exc:  # noqa: BLE001
                log.exception("[%s] stream failed", chat_request.request_id)
                events.put({"event": "error", "request_id": chat_request.request_id,
                            "error": {"message": f"internal error ({exc.__class__.__name__})", "type": "server_error"}})
            finally:
                events.put(None)

        work.start(run, g.get("slot"), f"req-{chat_request.request_id}")

        def generate() -> Iterator[str]:
            try:
                yield f": request {chat_request.request_id}\n\n"
                while True:
                    try:
                        event = events.get(timeout=HEARTBEAT_SECONDS if disconnected is None else 0.5)
                    except queue.Empty:
                        if disconnected is not None and disconnected():
                            work.cancel()
                            return
                        yield ": keep-alive\n\n"
                        continue
                    if event is None:
                        break
                    yield f"event: {event['event']}\ndata: {EVENT_JSON.encode(event)}\n\n"
            except BaseException:  # the client left (GeneratorExit at a yield), or the stream broke: stop the work
                work.cancel()
                raise
            # the work has ended: a client that leaves now cancels nothing
            work.ended()
            yield f"event: done\ndata: {json.dumps({'event': 'done', 'request_id': chat_request.request_id})}\n\n"

        return Response(generate(), mimetype="text/event-stream",
                        headers={CACHE_CONTROL: "no-cache", NO_BUFFERING: "no"})

    for path in MODES:
        app.add_url_rule(path, path, lambda path=path: handle(path), methods=POST_ONLY)

    def upload() -> Response:
        """Store an image or audio file under public/uploads/ so requests can name it."""
        file = request.files.get("file")
        if file is None:
            raise BadRequest("send the file as multipart form field `file`")
        data = file.read()  # at most max_body_bytes: MAX_CONTENT_LENGTH bounds the whole body
        path, kind = uploads.store(data, file.filename)  # a str: werkzeug files only the parts sent with one
        return jsonify({"path": path, "kind": kind})
    app.add_url_rule("/upload", view_func=upload, methods=POST_ONLY)

    def health() -> Response:
        """Open to everyone, so it names no endpoint, key or token."""
        checks = engine.checks()
        models = {None: "up", "unused": "unused"}.get(checks["models_server"], "down")
        llm = {k: v for k, v in config.llm.redacted().items() if k != "endpoint"}
        llm["reachable"] = checks["llm"] is None
        down = [name for name, problem in checks.items() if problem not in (None, "unused")]
        return jsonify({"status": "degraded" if down else "ok", "down": down, "llm": llm,
                        "inference_mode": config.inference_mode, "models_server": models,
                        "model_ranking": engine.ranking, "auth": "token" if config.api_tokens else "none"})
    app.add_url_rule("/health", view_func=health)

    def metrics_text() -> Response:
        """Prometheus text format; behind api_tokens like the API routes."""
        return Response(metrics.exposition(), content_type=METRICS_CONTENT_TYPE)  # with its format version
    app.add_url_rule("/metrics", view_func=metrics_text)

    register_openai_routes(app, engine, config, uploads, admitted, read_body, lambda: g.request_id, disconnects)

    def models_search() -> Response:
        """What the planner can choose from: `task`, `q` (the request's words), `limit`; best first."""
        task, q, limit = search_query(request.args.get("task"), request.args.get("q"), request.args.get("limit", "10"),
                                      engine.selector.tasks())
        return jsonify(engine.selector.search(task, q, limit))
    app.add_url_rule("/models/search", view_func=models_search)

    mount_mcp(app, engine, disconnects)  # MCP over streamable HTTP at /mcp, behind `guard` like the routes above

    def index() -> Response:
        return send_from_directory(WEB_DIR, "index.html")
    app.add_url_rule("/", view_func=index)

    def favicon() -> Response:
        return send_from_directory(WEB_DIR, "favicon.svg", mimetype="image/svg+xml", max_age=86400)
    app.add_url_rule("/favicon.ico", view_func=favicon)

    # a POST route's path asked with GET comes here (a GET route of its own would have matched): say what it takes
    takes = {rule.rule: "a file (multipart/form-data)" if rule.rule == "/upload" else "a JSON body"
             for rule in app.url_map.iter_rules()}

    def public_files(filename: str) -> Response:
        if "/" + filename in takes:
            resp = error_response(f"/{filename} takes POST with {takes['/' + filename]}", 405, "invalid_request_error")
            resp.headers["Allow"] = "POST"  # HTTP's 405 names the methods the resource takes
            return resp
        return send_public_file(public, filename)
    app.add_url_rule("/<path:filename>", view_func=public_files)

    from .httpbody import BODY_GATE
    app.extensions[BODY_GATE] = body_gate(config, metrics)  # `serve` refuses on the headers what guard would
    return app


def _timed_channel_class():
    """An HTTPChannel whose request parsers remember when their first byte came."""
    from waitress.channel import HTTPChannel
    from waitress.parser import HTTPRequestParser

    class TimedParser(HTTPRequestParser):
        def __init__(self, adj):
            super().__init__(adj)
            self.started = time.monotonic()

    class TimedChannel(HTTPChannel):
        parser_class = TimedParser

        def __init__(self, *args, **kwargs):
            self.accepted = time.monotonic()
            super().__init__(*args, **kwargs)

    return TimedChannel


def token_problem(header: str | None, tokens: tuple[str, ...]) -> HuggingGPTError | None:
    """Why a request to an API route is refused for its token (None: no tokens configured, or a right one);
    one rule for `guard` and for the body gate that answers before a body is read."""
    if not tokens:
        return None
    if bearer_token(header) is None:
        return Unauthorized("this server needs `Authorization: Bearer <token>` (one of its api_tokens)")
    if not bearer_ok(header, tokens):
        return Forbidden("the bearer token is not one of this server's api_tokens")
    return None


def body_gate(config: Config, metrics: Any = None) -> Any:
    """What `guard` and the body limit refuse on the headers alone, for `httpbody`: such a request is answered
    (the same status, message and JSON) before waitress reads its body; `guard` and `too_large` stay."""
    from .httpbody import BodyGate, Refusal
    from .mcp.mount import PATH as MCP_PATH
    from .mcp.mount import REFUSED as MCP_REFUSED

    tokens = config.api_tokens

    def check(method: str, path: str, headers: Any) -> Refusal | None:
        if not tokens or method == "OPTIONS" or path not in API_ROUTES:
            return None
        refused = token_problem(headers.get(AUTHORIZATION), tokens)
        return Refusal(refused.status, str(refused), refused.kind) if refused is not None else None

    def render(path: str, refusal: Refusal) -> dict[str, Any]:
        """The body error_response gives, or at /mcp the JSON-RPC error mount's refusal_as_json_rpc makes of it."""
        if path == MCP_PATH:
            return {"jsonrpc": "2.0", "id": None, "error": {"code": MCP_REFUSED, "message": refusal.message,
                                                            "data": {"type": refusal.kind, "status": refusal.status}}}
        error: dict[str, Any] = {"message": refusal.message, "type": refusal.kind}
        if path.startswith("/v1/"):  # OpenAI's shape, as error_response gives it
            error.update(param=None, code=None)
        return {"error": error}

    def observe(method: str, path: str, refusal: Refusal) -> None:
        if metrics is not None:
            metrics.http_requests.labels(path if path in API_ROUTES else "other", str(refusal.status)).inc()

    return BodyGate(config.max_body_bytes, check, render=render, observe=observe)


def overdue(channel: Any, now: float, limits: HttpLimits) -> str | None:
    """Why this channel has had its time (a request arriving too slowly), or None."""
    if channel.requests or channel.will_close:
        return None  # a request is being served (its own deadlines apply), or it is closing anyway
    req = channel.request
    if req is None:
        fresh = channel.last_activity == channel.creation_time  # not one byte read since the accept
        accepted = getattr(channel, "accepted", now)
        if fresh and now - accepted > limits.header_timeout:
            return f"sent nothing in {limits.header_timeout:g} s"
        return None
    started = getattr(req, "started", now)
    if req.completed:
        return None
    if not req.headers_finished and now - started > limits.header_timeout:
        return f"headers not complete in {limits.header_timeout:g} s (http_header_timeout)"
    if now - started > limits.read_timeout:
        return f"request not complete in {limits.read_timeout:g} s (http_read_timeout)"
    return None


def _listeners(server: Any) -> list[Any]:
    """The listening sockets of a waitress server (one, or several for several addresses)."""
    from waitress.server import BaseWSGIServer

    listeners = [s for s in getattr(server, "map", {}).values() if isinstance(s, BaseWSGIServer)]
    return listeners or [server]


def guard_slow_clients(server: Any, limits: HttpLimits) -> None:
    """Give every listening socket of a waitress server the timed channel and a sweep, once a second, that
    closes connections whose request has been arriving for longer than the limits allow."""
    channel_class = _timed_channel_class()
    for listener in _listeners(server):
        listener.channel_class = channel_class
        idle_sweep = listener.maintenance

        def maintenance(now: float, idle_sweep=idle_sweep, listener=listener) -> None:
            idle_sweep(now)
            mono = time.monotonic()
            closed = 0
            for channel in list(listener.active_channels.values()):
                why = overdue(channel, mono, limits)
                if why:
                    log.debug("closing the connection from %s: %s", channel.addr, why)
                    channel.will_close = True
                    closed += 1
            if closed:
                log.info("closed %d slow connection(s) (a request arriving for longer than http_header_timeout "
                         "or http_read_timeout)", closed)

        listener.maintenance = maintenance


_TURNED_AWAY_BODY = json.dumps({"error": {
    "message": "too many open connections from your address (http_connections_per_client); close some and retry",
    "type": "rate_limit_error"}}).encode()
TURNED_AWAY = (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 5\r\n"
               b"Connection: close\r\nContent-Length: " + str(len(_TURNED_AWAY_BODY)).encode() + b"\r\n\r\n"
               + _TURNED_AWAY_BODY)


def client_address(addr: Any) -> str | None:
    """The client's IP address of a connection (None for a Unix socket)."""
    if isinstance(addr, tuple) and addr and isinstance(addr[0], str) and addr[0]:
        return addr[0]
    return None


def open_from(listener: Any, address: str) -> int:
    """How many connections `address` holds on this listener (a scan of its channels: microseconds)."""
    return sum(1 for channel in list(listener.active_channels.values())
               if client_address(channel.addr) == address)  # every waitress channel has one (None: not known)


def _turn_away(conn: Any) -> None:
    """One short 429 (best effort: the socket's send buffer takes it at once) and the connection is closed."""
    try:
        conn.setblocking(False)
        conn.send(TURNED_AWAY)
    except OSError:
        pass
    finally:
        conn.close()


def limit_connections_per_client(server: Any, limits: HttpLimits) -> None:
    """No client address holds more than `limits.per_client` connections of a listener: past it, a new
    connection gets a 429 and is closed at once, before waitress makes it a channel. Without this, one client
    that opens `http_connection_limit` slow connections stops every other client from being served (waitress
    stops accepting at the limit). Refusals are logged once per sweep, not once per connection."""
    cap = limits.per_client
    for listener in _listeners(server):
        accept, sweep = listener.accept, listener.maintenance
        refused: dict[str, int] = {}

        def accept_within_cap(accept=accept, listener=listener, refused=refused):
            got = accept()
            if got is None:
                return None
            conn, addr = got
            address = client_address(addr)
            if address is not None and open_from(listener, address) >= cap:
                _turn_away(conn)
                refused[address] = refused.get(address, 0) + 1
                return None
            return got

        def maintenance(now: float, sweep=sweep, refused=refused) -> None:
            sweep(now)
            for address, count in list(refused.items()):
                log.warning("turned away %d connection(s) from %s: it already holds %d (http_connections_per_client)",
                            count, address, cap)
            refused.clear()

        listener.accept = accept_within_cap
        listener.maintenance = maintenance


def _raise_file_limit(wanted: int) -> int:
    """Room for `wanted` connections plus the process's own files; returns the connection limit that fits."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 256
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    return max(16, soft - 256)


def address_problem(host: str, port: int, exc: OSError, port_option: str = "http_listen.port") -> str:
    """The one line a user sees when the listening address cannot be taken."""
    why = {errno.EADDRINUSE: "is already in use", errno.EACCES: "needs more privileges",
           errno.EADDRNOTAVAIL: "is not an address of this machine"}.get(exc.errno, f"failed ({exc.strerror})")
    return f"error: {host}:{port} {why}; choose another with --port (or {port_option} in the config)"


def serve(app: Flask, host: str, port: int, threads: int = 16, ident: str = "hugginggpt",
          port_option: str = "http_listen.port", limits: HttpLimits | None = None,
          sockets: list[Any] | None = None) -> int:
    """Production WSGI server; each request runs on its own thread with its own state.

    limits: connection limits (in all, per client address) and read deadlines against slow clients
    (HttpLimits() when None).
    sockets: listening sockets bound already (a worker of `workers.Supervisor`); host and port then only name them.
    Returns an exit status: 2 with one line when the address cannot be taken (port in use, no permission).
    """
    from waitress import create_server

    from .httpbody import gate_of, guard_bodies

    limits = limits or HttpLimits()
    connection_limit = _raise_file_limit(limits.connection_limit)
    if connection_limit < limits.connection_limit:
        print(f"warning: http_connection_limit {limits.connection_limit} lowered to {connection_limit}: the "
              "process may not open more files (ulimit -n)", file=sys.stderr)
    where: dict[str, Any] = {"sockets": sockets} if sockets else {"host": host, "port": port}
    try:
        server = create_server(app, **where, threads=threads, ident=ident, connection_limit=connection_limit,
                               cleanup_interval=1, channel_timeout=max(1, math.ceil(limits.idle_timeout)),
                               # lookahead: waitress reads on while a request runs, so it sees the client leave
                               channel_request_lookahead=1,
                               asyncore_use_poll=True)  # poll(): select() fails once a socket's number passes 1023
    except OSError as exc:
        print(address_problem(host, port, exc, port_option), file=sys.stderr)
        return 2
    guard_slow_clients(server, limits)
    gate = gate_of(app)
    if gate is not None:  # refusals on the headers: a token missing, a body too large (before it is read)
        guard_bodies(_listeners(server), gate)
    limit_connections_per_client(server, replace(limits, connection_limit=connection_limit))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    return 0
