"""Total deadlines against peers that dribble, and no credential of a configured URL shown anywhere."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests
from flask import Flask, Response, jsonify

from tests.conftest import free_port, start_server, stop_server, wait_until, write_config
from tests.fakes.llm_server import ThreadedServer


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def plan(*tasks) -> str:
    return json.dumps([{"task": t, "id": i, "dep": d, "args": a} for i, (t, d, a) in enumerate(tasks)])


@pytest.fixture
def short_deadline(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False, request_timeout=3,
                          llm_timeout=10)
    srv = start_server(config, tmp_path)
    yield srv
    stop_server(srv)


@pytest.mark.parametrize("stream", [False, True])
def test_a_dribbling_llm_is_cut_at_the_request_deadline(short_deadline, llm, stream):
    llm.dribble = 0.5  # one SSE comment (streaming) or one space (plain JSON) every 0.5 s: no read ever times out
    started = time.monotonic()
    resp = short_deadline.post("/tasks", ask("draw a cat", stream=stream), timeout=20)
    took = time.monotonic() - started
    assert took < 4.5, f"the request outlived its 3 s deadline by {took - 3:.1f} s"
    text = resp.text
    if stream:
        assert "event: error" in text and ("deadline" in text or "504" in text), text[-500:]
    else:
        assert resp.status_code == 504, text
        assert "deadline" in resp.json()["error"]["message"]
    llm.dribble = 0.0
    # the server still answers others at once
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a cat"})))
    again = short_deadline.post("/tasks", ask("draw a cat"), timeout=10)
    assert again.status_code == 200 and again.json()[0]["task"] == "text-to-image"


def test_other_requests_are_served_while_one_llm_call_dribbles(short_deadline, llm):
    llm.on("parse_task", "[]")
    llm.dribble = 0.5
    slow = threading.Thread(target=lambda: short_deadline.post("/tasks", ask("slow"), timeout=20))
    slow.start()
    wait_until(lambda: llm.stage_requests("dribbled"), what="the slow request reaching the LLM")
    llm.dribble = 0.0
    started = time.monotonic()
    assert short_deadline.post("/tasks", ask("quick")).status_code == 200
    assert time.monotonic() - started < 2
    slow.join(10)
    assert not slow.is_alive()


class DribblingModels:
    """A models server whose /status answers at once and whose inference answer never finishes."""

    def __init__(self, pause: float):
        self.pause = pause
        self.calls = 0

    def app(self) -> Flask:
        app = Flask("dribbling-models")

        @app.get("/running")
        def running():
            return jsonify({"running": True})

        @app.get("/status/<path:model_id>")
        def status(model_id):
            return jsonify({"loaded": True})

        @app.post("/models/<path:model_id>")
        def infer(model_id):
            self.calls += 1

            def drip():
                ends = time.monotonic() + 30
                while time.monotonic() < ends:
                    yield " "  # JSON may start with any amount of whitespace
                    time.sleep(self.pause)
            return Response(drip(), mimetype="application/json")

        return app


def test_a_dribbling_models_server_is_cut_at_the_task_deadline(tmp_path, llm, public_dir):
    fake = DribblingModels(0.5)
    peer = ThreadedServer(fake.app()).start()
    try:
        config = write_config(tmp_path, llm.base_url, peer.url, public_dir, semantic_ranking=False,
                              request_timeout=20, task_timeout=2, num_candidate_models=1)
        srv = start_server(config, tmp_path)
        try:
            llm.on("parse_task", plan(("token-classification", [-1], {"text": "Ada lives in London"})))
            started = time.monotonic()
            resp = srv.post("/results", ask("find the names"), timeout=30)
            took = time.monotonic() - started
            assert fake.calls >= 1
            assert took < 5, f"a dribbling models server held the task {took:.1f} s (task_timeout 2)"
            assert resp.status_code == 200
            result = resp.json()["0"]["inference result"]
            assert "timed out" in json.dumps(result) or "deadline" in json.dumps(result), result
        finally:
            stop_server(srv)
    finally:
        peer.stop()


class DribblingHosted:
    """A hosted inference endpoint (JARVIS `/status/<id>`, hf-inference `POST /models/<id>`) whose status answers
    at once and whose inference answer is one space every `pause` seconds, never finished."""

    def __init__(self, pause: float):
        self.pause = pause
        self.calls = 0
        self.hung_up: list[float] = []  # when the client closed each inference connection (a write failed)

    def app(self) -> Flask:
        app = Flask("dribbling-hosted")

        @app.get("/status/<path:model_id>")
        def status(model_id):
            return jsonify({"loaded": True, "state": "Loaded"})

        @app.post("/models/<path:model_id>")
        def infer(model_id):
            self.calls += 1

            def drip():
                ends = time.monotonic() + 40
                try:
                    while time.monotonic() < ends:
                        yield " "
                        time.sleep(self.pause)
                except GeneratorExit:
                    self.hung_up.append(time.monotonic())
                    raise
            return Response(drip(), mimetype="application/json")

        return app


@pytest.mark.parametrize("request_timeout, task_timeout", [(4, 60), (30, 3)])
def test_a_dribbling_hosted_inference_endpoint_is_cut_at_the_deadline(tmp_path, llm, public_dir, request_timeout,
                                                                      task_timeout):
    """One byte every 2 s never trips InferenceClient's read timeout; the request's deadline (4 s) or the
    task's (task_timeout 3 s), whichever comes first, ends the call: the client is answered and the connection
    to the endpoint is closed (not left to dribble on in the background)."""
    fake = DribblingHosted(2.0)
    peer = ThreadedServer(fake.app()).start()
    try:
        config = write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, semantic_ranking=False,
                              inference_mode="huggingface", huggingface={"token": "hf_test", "base_url": peer.url},
                              request_timeout=request_timeout, task_timeout=task_timeout, num_candidate_models=1)
        srv = start_server(config, tmp_path)
        try:
            llm.on("parse_task", plan(("text-classification", [-1], {"text": "what a lovely day"})))
            started = time.monotonic()
            resp = srv.post("/results", ask("how does this sound?"), timeout=60)
            took = time.monotonic() - started
            bound = min(request_timeout, task_timeout)
            assert fake.calls >= 1
            assert took < bound + 2.5, f"a dribbling hosted endpoint held the request {took:.1f} s (bound {bound} s)"
            assert resp.status_code in (200, 504), resp.text
            if task_timeout < request_timeout:
                result = resp.json()["0"]["inference result"]
                assert "timed out" in json.dumps(result), result
            while not fake.hung_up and time.monotonic() < started + bound + 8:
                time.sleep(0.2)
            # the peer notices at its next byte (every 2 s) that the connection was closed
            assert fake.hung_up and fake.hung_up[0] - started < bound + 2.5 + fake.pause, \
                "the connection to the hosted endpoint outlived the deadline"
        finally:
            stop_server(srv)
        assert "hf_test" not in srv.logs()
    finally:
        peer.stop()


def test_credentials_in_the_configured_llm_url_are_never_shown(tmp_path, models_server, public_dir):
    _, models_url = models_server
    closed = free_port()
    config = write_config(tmp_path, f"http://user:S3CRET@127.0.0.1:{closed}", models_url, public_dir,
                          semantic_ranking=False, llm_max_retries=0,
                          huggingface={"token": None})
    srv = start_server(config, tmp_path)
    try:
        plain = srv.post("/tasks", ask("hi"))
        assert plain.status_code == 502
        assert "S3CRET" not in plain.text and "the configured LLM" in plain.json()["error"]["message"]
        assert str(closed) not in plain.text  # the client is not told the configured URL
        streamed = srv.post("/hugginggpt", ask("hi", stream=True))
        assert "event: error" in streamed.text and "S3CRET" not in streamed.text
        health = requests.get(srv.url + "/health", timeout=5)
        assert "S3CRET" not in health.text
    finally:
        stop_server(srv)
    assert "S3CRET" not in srv.logs(), srv.logs()[-2000:]
