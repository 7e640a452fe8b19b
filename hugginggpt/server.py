"""The orchestration server: Flask app factory, JSON errors, SSE streaming, static public/, CORS."""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flask import Flask, Response, jsonify, request, send_from_directory
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .chat import ChatRequest, HuggingGPT, RequestState
from .config import Config
from .errors import BadRequest, HuggingGPTError

log = logging.getLogger(__name__)

MODES = {"/hugginggpt": "answer", "/tasks": "tasks", "/results": "results"}
HEARTBEAT_SECONDS = 10.0
WEB_DIR = Path(__file__).resolve().parent / "web"


def error_response(message: str, status: int, kind: str) -> Response:
    resp = jsonify({"error": {"message": message, "type": kind}})
    resp.status_code = status
    return resp


def create_app(config: Config, engine: HuggingGPT | None = None) -> Flask:
    """One app per config; tests start several side by side."""
    engine = engine or HuggingGPT(config)
    public = config.public_dir.resolve()
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["hugginggpt"] = engine

    @app.after_request
    def cors(resp: Response) -> Response:
        resp.headers["Access-Control-Allow-Origin"] = "*"
        resp.headers["Access-Control-Allow-Headers"] = "Content-Type, Authorization"
        resp.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        return resp

    @app.errorhandler(HuggingGPTError)
    def known_error(exc: HuggingGPTError) -> Response:
        log.warning("request failed: %s", exc)
        return error_response(str(exc), exc.status, exc.kind)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge) -> Response:
        return error_response(f"request body is larger than {config.max_body_bytes} bytes", 413,
                              "invalid_request_error")

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return error_response(exc.description or exc.name, exc.code or 500, "invalid_request_error")

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        log.exception("unexpected error")
        return error_response(f"internal error ({exc.__class__.__name__}); see the server log", 500, "server_error")

    def read_body() -> dict[str, Any]:
        if request.content_length and request.content_length > config.max_body_bytes:
            raise RequestEntityTooLarge()
        body = request.get_json(silent=True, force=True)
        if body is None:
            raise BadRequest("the request body must be JSON, e.g. {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}")
        return body

    def handle(path: str) -> Response:
        body = read_body()
        chat_request = ChatRequest.from_body(body)
        mode = MODES[path]
        if path == "/hugginggpt" and body.get("return_decisions") is True:
            mode = "decisions"
        for flag in ("return_decisions", "stream"):
            if flag in body and not isinstance(body[flag], bool):
                raise BadRequest(f"`{flag}` must be true or false")
        if body.get("stream") is True:
            return stream(chat_request, mode)
        return jsonify(engine.run(chat_request, mode))

    def stream(chat_request: ChatRequest, mode: str) -> Response:
        engine.llm_for(chat_request)  # fail fast (400) on bad overrides before the stream starts
        events: queue.Queue = queue.Queue()
        holder: dict[str, RequestState] = {}
        disconnected = request.environ.get("waitress.client_disconnected")

        def work() -> None:
            try:
                result = engine.run(chat_request, mode, on_event=lambda name, e: events.put(e),
                                    state_ready=lambda s: holder.setdefault("state", s))
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

        threading.Thread(target=work, name=f"req-{chat_request.request_id}", daemon=True).start()

        def generate() -> Iterator[str]:
            completed = False
            try:
                yield f": request {chat_request.request_id}\n\n"
                while True:
                    try:
                        event = events.get(timeout=HEARTBEAT_SECONDS if disconnected is None else 0.5)
                    except queue.Empty:
                        if disconnected is not None and disconnected():
                            return
                        yield ": keep-alive\n\n"
                        continue
                    if event is None:
                        completed = True
                        yield "event: done\ndata: {}\n\n"
                        return
                    yield f"event: {event['event']}\ndata: {json.dumps(event, ensure_ascii=False, default=str)}\n\n"
            finally:
                if not completed and "state" in holder:
                    log.info("[%s] client went away; cancelling", chat_request.request_id)
                    holder["state"].cancel()

        return Response(generate(), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    for path in MODES:
        app.add_url_rule(path, path.strip("/"), lambda path=path: handle(path), methods=["POST"])

    @app.post("/upload")
    def upload() -> Response:
        """Store an image or audio file under public/uploads/ so requests can name it."""
        from .resources import UPLOAD_TYPES, save_bytes, sniff_mime

        file = request.files.get("file")
        if file is None:
            raise BadRequest("send the file as multipart form field `file`")
        data = file.read(config.max_body_bytes + 1)
        if not data:
            raise BadRequest("the uploaded file is empty")
        mime = sniff_mime(data, file.filename or "")
        if mime not in UPLOAD_TYPES:
            raise BadRequest(f"unsupported file type {mime}; upload an image (png, jpeg, gif, webp) "
                             "or audio (wav, flac, ogg, mp3)")
        path = save_bytes(public, "upload", data, UPLOAD_TYPES[mime])
        return jsonify({"path": path, "kind": mime.split("/")[0]})

    @app.get("/health")
    def health() -> Response:
        if "local" in engine.backends:
            models = "up" if engine.local.running() else "down"
        else:
            models = "unused"
        llm = config.llm.redacted()
        return jsonify({"status": "ok", "llm": llm, "inference_mode": config.inference_mode, "models_server": models,
                        "model_ranking": engine.ranking})

    @app.get("/")
    def index() -> Response:
        return send_from_directory(WEB_DIR, "index.html")

    @app.get("/<path:filename>")
    def public_files(filename: str) -> Response:
        if "/" + filename in MODES:
            return error_response(f"/{filename} takes POST with a JSON body", 405, "invalid_request_error")
        return send_from_directory(public, filename)

    return app


def serve(app: Flask, host: str, port: int, threads: int = 16) -> None:
    """Production WSGI server; each request runs on its own thread with its own state."""
    from waitress import serve as waitress_serve

    waitress_serve(app, host=host, port=port, threads=threads, channel_request_lookahead=1, ident="hugginggpt")
