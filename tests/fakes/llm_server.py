"""A scripted OpenAI-compatible LLM server on loopback, for driving the real `openai` client in tests.

Stages are recognised from the system prompt (#1 planning, #2 model choice, #4 response); anything
else is chit-chat or a text task. Replies come from rules the test sets; every request is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.serving import make_server

Reply = str | Callable[[dict[str, Any]], str]


def stage_of(messages: list[dict[str, str]]) -> str:
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    if system.startswith("#1"):
        return "parse_task"
    if system.startswith("#2"):
        return "choose_model"
    if system.startswith("#4"):
        return "response_results"
    if messages and "Act as a" in messages[-1]["content"] and "system with the arguments" in messages[-1]["content"]:
        return "text_task"
    return "chitchat"


def default_reply(stage: str, body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    last = messages[-1]["content"] if messages else body.get("prompt", "")
    if stage == "parse_task":
        return "[]"
    if stage == "choose_model":
        ids = re.findall(r'"id": "([^"]+)"', last)
        return json.dumps({"id": ids[0] if ids else "none", "reason": "first candidate (scripted)"})
    if stage == "response_results":
        log = next((m["content"] for m in messages if m["role"] == "assistant"), "")
        return "ANSWER based on: " + log
    if stage == "text_task":
        return "TEXT-TASK RESULT"
    return "CHITCHAT: " + last


@dataclass
class Rule:
    stage: str
    contains: str | None
    reply: Reply
    times: int | None = None  # None: forever
    delay: float = 0.0


@dataclass
class ScriptedLLM:
    rules: list[Rule] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)  # HTTP statuses to answer before succeeding
    failing_stages: dict[str, int] = field(default_factory=dict)  # stage -> HTTP status it always answers
    failure_body: str | None = None  # the body of those failures (default: a JSON error); "{key}": the caller's key
    raw_reply: str | None = None  # answer 200 with this text/html body instead of a completion
    stream_delay: float = 0.0  # seconds between streamed pieces (a slow LLM writing token by token)
    dribble: float = 0.0  # > 0: answer 200, then one SSE comment (or one space) every `dribble` s, never done
    rejects_schema: bool | set[str] = False  # answer 400 to response_format (True: any; a set: those types)
    # a stream written whole, with its length, when no pause is asked for: waitress closes every chunked
    # response's connection, where OpenAI, vLLM and llama.cpp keep it (benchmarks set this, tests need not)
    keep_streams_alive: bool = False
    # not None: a stream's second event is `{"error": stream_error}`, as vLLM and OpenAI end a stream that fails
    stream_error: Any = None
    stall: float = 0.0  # > 0: a stream pauses this long after its first piece (a backend that stops writing)
    lock: threading.Lock = field(default_factory=threading.Lock)
    base_url: str = ""

    def on(self, stage: str, reply: Reply, contains: str | None = None, times: int | None = None,
           delay: float = 0.0) -> None:
        with self.lock:
            self.rules.insert(0, Rule(stage, contains, reply, times, delay))

    def fail(self, *statuses: int) -> None:
        with self.lock:
            self.failures.extend(statuses)

    def stage_requests(self, stage: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["stage"] == stage]

    def reset(self) -> None:
        with self.lock:
            self.rules.clear()
            self.requests.clear()
            self.failures.clear()
            self.failing_stages.clear()
            self.failure_body = None
            self.raw_reply = None
            self.rejects_schema = False
            self.stream_delay = 0.0
            self.dribble = 0.0
            self.stream_error = None
            self.stall = 0.0

    def _answer(self, body: dict[str, Any], headers: dict[str, str] | None = None, path: str = "") -> tuple[str, float]:
        messages = body.get("messages")
        if messages is None:  # completion API: recover the stage from the rendered prompt
            prompt = body.get("prompt", "")
            messages = [{"role": m.group(1), "content": m.group(2)}
                        for m in re.finditer(r"<im_start>(\w+)\n(.*?)<im_end>", prompt, re.DOTALL)]
        stage = stage_of(messages)
        text = "\n".join(m["content"] for m in messages)
        with self.lock:
            self.requests.append({"stage": stage, "body": body, "time": time.perf_counter(),
                                  "headers": headers or {}, "path": path})
            for rule in self.rules:
                if rule.stage == stage and (rule.contains is None or rule.contains in text):
                    if rule.times is not None:
                        if rule.times <= 0:
                            continue
                        rule.times -= 1
                    reply = rule.reply(body) if callable(rule.reply) else rule.reply
                    return reply, rule.delay
        return default_reply(stage, {**body, "messages": messages}), 0.0

    def app(self) -> Flask:
        app = Flask("scripted-llm")

        def failure() -> Response | None:
            with self.lock:
                status = self.failures.pop(0) if self.failures else None
            if status is None:
                return None
            if self.failure_body is not None:  # "{key}" in it: the caller's key, as OpenAI's 401 quotes it
                auth = request.headers.get("Authorization", "").removeprefix("Bearer ")
                key = request.headers.get("api-key") or auth
                return Response(self.failure_body.replace("{key}", key), status=status, mimetype="text/plain")
            resp = jsonify({"error": {"message": f"scripted failure {status}", "type": "server_error"}})
            resp.status_code = status
            resp.headers["retry-after-ms"] = "10"
            return resp

        @app.post("/v1/chat/completions")
        @app.post("/openai/deployments/<deployment>/chat/completions")  # Azure's path
        def chat(deployment: str | None = None) -> Response:
            body = request.get_json(force=True)
            failed = failure()
            status = self.failing_stages.get(stage_of(body.get("messages") or []))
            if failed is None and status is not None:
                failed = jsonify({"error": {"message": f"scripted failure {status}", "type": "server_error"}})
                failed.status_code = status
            if failed is not None:
                self.requests.append({"stage": "failed", "body": body, "time": time.perf_counter(),
                                      "headers": dict(request.headers)})
                return failed
            kind = (body.get("response_format") or {}).get("type")
            if kind and (self.rejects_schema is True or (self.rejects_schema and kind in self.rejects_schema)):
                self.requests.append({"stage": "rejected", "body": body, "time": time.perf_counter(),
                                      "headers": dict(request.headers)})
                resp = jsonify({"error": {"message": "response_format is not supported", "type": "invalid_request"}})
                resp.status_code = 400
                return resp
            if self.dribble:
                self.requests.append({"stage": "dribbled", "body": body, "time": time.perf_counter(),
                                      "headers": dict(request.headers)})
                pause, streaming = self.dribble, bool(body.get("stream"))

                def drip():
                    ends = time.monotonic() + 30  # a test never waits this long; the thread ends anyway
                    while time.monotonic() < ends:
                        yield ": ping\n\n" if streaming else " "
                        time.sleep(pause)
                return Response(drip(), mimetype="text/event-stream" if streaming else "application/json")
            if self.raw_reply is not None:
                self.requests.append({"stage": "raw", "body": body, "time": time.perf_counter(),
                                      "headers": dict(request.headers)})
                return Response(self.raw_reply, mimetype="text/html")
            reply, delay = self._answer(body, dict(request.headers), request.full_path)
            if delay:
                time.sleep(delay)
            if self.stream_delay and not body.get("stream"):  # the same writing speed, just not shown
                time.sleep(self.stream_delay * len(re.findall(r"\S+\s*", reply)))
            if body.get("stream"):
                record = self.requests[-1]
                pause = self.stream_delay

                failing, stall = self.stream_error, self.stall

                def gen():
                    pieces = re.findall(r"\S+\s*", reply) or [""]
                    for n, p in enumerate(pieces):
                        if failing is not None and n == 1:
                            yield f"data: {json.dumps({'error': failing})}\n\n"
                            return
                        if stall and n == 1:
                            time.sleep(stall)
                        if pause:
                            time.sleep(pause)
                        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": p},
                                              "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    record["stream_end"] = time.perf_counter()
                    yield "data: [DONE]\n\n"
                if self.keep_streams_alive and not pause:
                    return Response("".join(gen()), mimetype="text/event-stream")
                return Response(gen(), mimetype="text/event-stream")
            return jsonify({
                "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

        @app.post("/v1/completions")
        def completions() -> Response:
            body = request.get_json(force=True)
            failed = failure()
            if failed is not None:
                return failed
            reply, delay = self._answer(body, dict(request.headers), request.full_path)
            if delay:
                time.sleep(delay)
            if body.get("stream"):  # the legacy completions API's stream: text pieces, then [DONE]
                def gen():
                    for piece in re.findall(r"\S+\s*", reply) or [""]:
                        chunk = {"id": "c2", "object": "text_completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "text": piece, "finish_reason": None, "logprobs": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                return Response(gen(), mimetype="text/event-stream")
            return jsonify({"id": "c2", "object": "text_completion", "created": 0, "model": body["model"],
                            "choices": [{"index": 0, "text": reply, "finish_reason": "stop", "logprobs": None}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})

        @app.get("/v1/models")
        def models() -> Response:
            return jsonify({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

        return app


class ThreadedServer:
    """A WSGI app served on a free loopback port from a background thread."""

    def __init__(self, app: Flask, port: int = 0, host: str = "127.0.0.1"):
        self.server = make_server(host, port, app, threaded=True)
        self.port = self.server.server_port
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ThreadedServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()


class KeepAliveServer:
    """A WSGI app on waitress: HTTP/1.1 keep-alive, as OpenAI, vLLM and our own models server speak it. Werkzeug's
    development server (ThreadedServer) closes every connection, so each call would pay a new TCP connection on
    both sides: benchmarks use this one, so that what they measure is the server under test, not reconnects."""

    def __init__(self, app: Flask, threads: int = 200):
        from waitress.server import create_server

        self.server = create_server(app, host="127.0.0.1", port=0, threads=threads, connection_limit=2000,
                                    asyncore_use_poll=True, channel_timeout=120, ident="fake")
        self.port = self.server.effective_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> KeepAliveServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.close()
        self.server.task_dispatcher.shutdown(timeout=1)
