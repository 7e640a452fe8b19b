"""The OpenAI chat-completions front door: `POST /v1/chat/completions` and `GET /v1/models`.

Chat front-ends and SDKs that speak the OpenAI API use HuggingGPT as a model: `hugginggpt` answers a request
(the whole pipeline), `hugginggpt-plan` returns the plan and the chosen models without running them. Image and
audio parts (`image_url` as a data URI or an http(s) URL under the URL policy, `input_audio` as base64) are
checked and stored like uploads, and named in the request text as a planner expects a file. Generated files
come back in the answer as Markdown images and links with absolute URLs. Errors use OpenAI's shape.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

from flask import Flask, Response, g, jsonify, request

from .chat import ChatRequest, HuggingGPT, RequestState
from .config import Config
from .errors import BadRequest, HuggingGPTError, NotFound
from .request import generated_files as files_of_results
from .resources import decode_data_uri, fetch_url
from .streamwork import DisconnectWatch, StreamWork
from .uploads import UploadStore

log = logging.getLogger(__name__)

MODELS = {"hugginggpt": "answer", "hugginggpt-plan": "decisions"}
ROUTES = ("/v1/chat/completions", "/v1/models")
HEARTBEAT_SECONDS = 10.0
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg")


def chat_request(body: Any, uploads: UploadStore, config: Config, request_id: str) -> tuple[ChatRequest, str, str]:
    """(the pipeline request, its mode, the model name) from an OpenAI chat-completions body."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with `model` and `messages`")
    model = body.get("model", "hugginggpt")
    if not isinstance(model, str) or model not in MODELS:
        raise NotFound(f"the model {str(model)[:80]!r} does not exist; use one of {', '.join(MODELS)} "
                       "(GET /v1/models)")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("`stream` must be true or false")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("`messages` must be a list of {\"role\", \"content\"} objects")
    flat = [{"role": m.get("role"), "content": _text_of(m.get("content"), i, uploads, config)}
            if isinstance(m, dict) else m for i, m in enumerate(messages)]
    req = ChatRequest.from_body({"messages": flat})  # the same checks as /hugginggpt
    req.request_id = request_id
    return req, MODELS[model], model


def _text_of(content: Any, index: int, uploads: UploadStore, config: Config) -> Any:
    """A message's content as the planner reads it: its text, then each attached file's public path."""
    if not isinstance(content, list):
        return content  # a string, or something from_body refuses with its own message
    texts: list[str] = []
    files: list[str] = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            files.append(_store_image(part.get("image_url"), where, uploads, config))
        elif kind == "input_audio":
            files.append(_store_audio(part.get("input_audio"), where, uploads))
        else:
            raise BadRequest(f"{where} must be a text, image_url or input_audio part")
    return " ".join([*texts, *(f"({path})" for path in files)]).strip()


def _store_image(spec: Any, where: str, uploads: UploadStore, config: Config) -> str:
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where}.image_url.url must be a data URI or an http(s) URL")
    if url.startswith("data:"):
        resource = decode_data_uri(url, config.max_body_bytes)
    elif url.lower().startswith(("http://", "https://")):
        resource = fetch_url(url, config.max_fetch_bytes, config.fetch_timeout, config.proxy, config.url_policy())
    else:
        raise BadRequest(f"{where}.image_url.url must be a data URI or an http(s) URL")
    path, kind = uploads.store(resource.data, "")  # pragma: no mutate: every image type is known by its bytes
    if kind != "image":
        raise BadRequest(f"{where}.image_url is not an image")
    return path


def _store_audio(spec: Any, where: str, uploads: UploadStore) -> str:
    data, fmt = (spec.get("data"), spec.get("format")) if isinstance(spec, dict) else (None, None)
    if not isinstance(data, str) or fmt not in AUDIO_FORMATS:
        raise BadRequest(f"{where}.input_audio needs base64 `data` and a `format` ({', '.join(AUDIO_FORMATS)})")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"{where}.input_audio.data is not base64") from None
    path, kind = uploads.store(raw, f"audio.{fmt}")
    if kind != "audio":
        raise BadRequest(f"{where}.input_audio is not audio")
    return path


def generated_files(state: RequestState | None) -> list[str]:
    """Public paths of the files this request's tasks made, in task order."""
    if state is None:
        return []
    with state.lock:
        results = dict(state.results)
    return files_of_results(results)


def files_markdown(paths: list[str], base_url: str) -> str:
    """The files as Markdown a chat client renders: images inline, audio and video as links."""
    lines = []
    for path in paths:
        url = base_url.removesuffix("/") + path
        folder = path.split("/")[1]
        if folder == "images":
            lines.append(f"![generated image]({url})")
        else:
            lines.append(f"[generated {folder[:-1]}]({url})")
    return ("\n\n" + "\n".join(lines)) if lines else ""


def _content(result: Any, mode: str) -> str:
    if mode == "decisions":
        return json.dumps(result, ensure_ascii=False, default=str)  # pragma: no mutate: None is False
    return str(result.get("message", "")) if isinstance(result, dict) else str(result)


def completion(request_id: str, model: str, content: str, usage: dict[str, int]) -> dict[str, Any]:
    return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": usage}


def chunk(request_id: str, model: str, delta: dict[str, Any], finish: str | None = None) -> str:
    return _data({"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": int(time.time()),
                  "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _data(body: Any) -> str:
    """One server-sent event of the stream: its JSON as UTF-8 text, the way OpenAI's SDKs read it."""
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"  # pragma: no mutate: None is False


def register(app: Flask, engine: HuggingGPT, config: Config, uploads: UploadStore,
             admitted: Callable[[Callable[[], Response]], Response], read_body: Callable[[], Any],
             request_id: Callable[[], str], disconnects: DisconnectWatch) -> None:
    """Mount the routes; `admitted` applies the server's admission limit, `read_body` its JSON checks,
    `disconnects` cancels a request answered in one piece whose client left."""

    # routes are registered by call, not by decorator: mutmut skips decorated functions (docs/TESTING.md)
    def models() -> Response:
        return jsonify({"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "hugginggpt"}
                                                   for m in MODELS]})
    app.add_url_rule("/v1/models", view_func=models)  # GET (and HEAD): Flask's default

    def chat_completions() -> Response:
        return admitted(lambda: _complete(read_body()))
    app.add_url_rule("/v1/chat/completions", view_func=chat_completions, methods=[
        "POST",  # pragma: no mutate: werkzeug upper-cases method names
    ])

    def _complete(body: Any) -> Response:
        req, mode, model = chat_request(body, uploads, config, request_id())
        if body.get("stream") is True:
            return _stream(req, mode, model)
        with disconnects.watching(request.environ.get("waitress.client_disconnected"), req.request_id) as work:
            result = engine.run(req, mode, state_ready=work.state_ready)
        content = _content(result, mode) + files_markdown(generated_files(work.state), request.host_url)
        return jsonify(completion(req.request_id, model, content, _usage(work.state)))

    def _stream(req: ChatRequest, mode: str, model: str) -> Response:
        engine.llm_for(req)  # fail fast (4xx) before the stream starts
        events: queue.Queue = queue.Queue()
        work = StreamWork(req.request_id)
        base_url = request.host_url
        disconnected = request.environ.get("waitress.client_disconnected")

        def listen(name: str, event: dict[str, Any]) -> None:
            if name == "answer_token":
                events.put(("token", event.get("text", "")))

        def run() -> None:
            try:
                result = engine.run(req, mode, on_event=listen, state_ready=work.state_ready)
                events.put((
                    "done",  # pragma: no mutate: the reader ends the stream on any kind but token and error
                    _content(result, mode)))
            except HuggingGPTError as exc:
                events.put(("error", {"message": str(exc), "type": exc.kind, "param": None, "code": None}))
            except Exception as exc:  # noqa: BLE001
                log.exception("stream failed")
                events.put(("error", {"message": f"internal error ({exc.__class__.__name__})", "type": "server_error",
                                      "param": None, "code": None}))

        work.start(run, g.get("slot"), f"v1-{req.request_id}")

        def generate() -> Iterator[str]:
            sent, completed = "", False
            try:
                yield chunk(req.request_id, model, {"role": "assistant", "content": ""})
                while True:
                    try:
                        kind, value = events.get(timeout=HEARTBEAT_SECONDS if disconnected is None else 0.5)
                    except queue.Empty:
                        if disconnected is not None and disconnected():
                            return
                        yield ": keep-alive\n\n"
                        continue
                    if kind == "token":
                        sent += value
                        yield chunk(req.request_id, model, {"content": value})
                    elif kind == "error":
                        completed = True
                        work.ended()
                        yield _data({"error": value})
                        yield "data: [DONE]\n\n"
                        return
                    else:
                        completed = True
                        rest = value[len(sent):] if value.startswith(sent) else "\n\n" + value  # a new answer: after it
                        rest += files_markdown(generated_files(work.state), base_url)
                        work.ended()
                        if rest:
                            yield chunk(req.request_id, model, {"content": rest})
                        yield chunk(req.request_id, model, {}, "stop")
                        yield "data: [DONE]\n\n"
                        return
            finally:
                if not completed:
                    work.cancel()

        return Response(generate(), mimetype="text/event-stream", headers={
            "Cache-Control": "no-cache",  # pragma: no mutate: header names ignore case
            "X-Accel-Buffering": "no",  # pragma: no mutate: header names ignore case
        })


def _usage(state: RequestState | None) -> dict[str, int]:
    """The tokens the request's LLM calls reported (zero where the backend reports none)."""
    totals = state.llm.usage if state is not None else {}
    prompt, completion_tokens = int(totals.get("prompt_tokens", 0)), int(totals.get("completion_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}
