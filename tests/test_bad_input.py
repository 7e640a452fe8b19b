"""Bad input gets a 4xx JSON error naming the problem; an LLM outage gets a 502; the server survives."""

from __future__ import annotations

import json

import pytest
import requests

from tests.conftest import start_server, stop_server, write_config


def error_of(resp: requests.Response) -> str:
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str)
    assert "Traceback" not in resp.text
    return body["error"]["message"]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ("not json at all", 400, "must be JSON"),
        ([1, 2], 400, "JSON object"),
        ({}, 400, "`messages` is required"),
        ({"messages": "hi"}, 400, "must be a list"),
        ({"messages": []}, 400, "is empty"),
        ({"messages": [{"role": "user"}]}, 400, "content must be a string"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
        ({"messages": ["hi"]}, 400, "must be an object"),
        ({"messages": [{"role": "user", "content": "   "}]}, 400, "last message is empty"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_type": "bogus"}, 400, "api_type must be one of"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_endpoint": "ftp://x"}, 400, "http(s) URL"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_key": 12}, 400, "`api_key` must be a string"),
        ({"messages": [{"role": "user", "content": "hi"}], "return_decisions": "yes"}, 400, "true or false"),
    ],
)
@pytest.mark.parametrize("route", ["/hugginggpt", "/tasks", "/results"])
def test_bad_bodies(server, llm, route, body, status, words):
    if isinstance(body, str):
        resp = requests.post(server.url + route, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    else:
        resp = server.post(route, body)
    assert resp.status_code == status
    assert words in error_of(resp)


def test_body_over_the_size_limit(server):
    big = {"messages": [{"role": "user", "content": "x" * 300_000}]}
    resp = server.post("/hugginggpt", big)
    assert resp.status_code == 413 and "larger than" in error_of(resp)


def test_wrong_method_and_unknown_route(server):
    assert requests.get(server.url + "/hugginggpt", timeout=5).status_code == 405
    assert requests.post(server.url + "/nope", json={}, timeout=5).status_code in (404, 405)


def test_path_escape_is_refused(server, llm, models):
    assert requests.get(server.url + "/../secret.txt", timeout=5).status_code == 404
    assert requests.get(server.url + "/%2e%2e/secret.txt", timeout=5).status_code == 404
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "../secret.txt"}}]))
    results = server.post("/results", {"messages": [{"role": "user", "content": "caption ../secret.txt"}]}).json()
    assert "outside public/" in results["0"]["inference result"]["error"]["message"]
    assert models.calls == []


def test_missing_input_file_is_a_task_error_not_a_crash(server, llm, models):
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/nope.png"}}]))
    resp = server.post("/hugginggpt", {"messages": [{"role": "user", "content": "caption /examples/nope.png"}]})
    assert resp.status_code == 200
    assert "file not found" in resp.json()["message"]  # the response stage saw the error in the log


def test_llm_outage_is_a_502_naming_the_backend(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, "http://127.0.0.1:9", models_url, public_dir)
    srv = start_server(config, tmp_path)
    try:
        resp = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 502
        message = error_of(resp)
        assert "local LLM backend" in message and "127.0.0.1:9" in message and "unreachable" in message
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200  # still serving
    finally:
        stop_server(srv)


def test_llm_http_error_is_a_502(server, llm):
    llm.fail(500, 500, 500, 500)
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 502 and "HTTP 500" in error_of(resp)


def test_llm_transient_errors_are_retried(server, llm):
    llm.fail(429, 503)
    llm.on("parse_task", '[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a"}}]')
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "draw a"}]})
    assert resp.status_code == 200 and resp.json()[0]["task"] == "text-to-image"
    assert len([r for r in llm.requests if r["stage"] == "failed"]) == 2


def test_keys_never_reach_the_log_or_the_answer(server, llm):
    secret = "sk-verysecretkey1234567890"
    llm.fail(401, 401, 401, 401)
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "hi"}], "api_key": secret})
    assert resp.status_code == 502
    assert secret not in resp.text and secret not in server.logs()
    assert llm.requests  # the key was used for the call...
