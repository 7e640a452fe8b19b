"""The orchestration server (hugginggpt/server.py) in-process: the Flask app of `create_app` through Flask's test
client, with the pipeline scripted, and the waitress-level guards (slow clients, connections per client, the body
gate, the file limit, address problems) called directly or on a real waitress server on loopback.

The slow server-level tests (test_routes.py, test_hostile_*.py, test_slow_clients.py, ...) start awesome_chat.py;
these pin each answer, header, message and refusal of the server itself, fast enough for the mutation audit
(docs/TESTING.md)."""

from __future__ import annotations

import errno
import io
import json
import logging
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from hugginggpt import server as server_module
from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.config import HttpLimits, load_config
from hugginggpt.errors import Forbidden, LLMError, Unauthorized
from hugginggpt.httpbody import BODY_GATE, Refusal, gate_of
from hugginggpt.llm import LLMClient
from hugginggpt.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from hugginggpt.request import RequestState
from hugginggpt.server import (
    TURNED_AWAY,
    _raise_file_limit,
    address_problem,
    body_gate,
    client_address,
    create_app,
    guard_slow_clients,
    limit_connections_per_client,
    open_from,
    overdue,
    serve,
    token_problem,
)
from tests.conftest import make_public, wait_until, write_config

TOKEN = "tok-server-units"
ASK = {"messages": [{"role": "user", "content": "draw a fox"}]}
NEEDS_TOKEN = "this server needs `Authorization: Bearer <token>` (one of its api_tokens)"
WRONG_TOKEN = "the bearer token is not one of this server's api_tokens"


# -- the parts -------------------------------------------------------------------------------------------------


class Engine(HuggingGPT):
    """The real engine with its pipeline scripted: `script(state, mode)` answers (or raises) in place of the
    planner, the models and the response; `health` stands for what `checks` finds."""

    def __init__(self, config):
        super().__init__(config, ranker=KeywordRanker())
        self.calls: list[tuple[Any, str, str]] = []
        self.script = lambda state, mode: {"message": f"ran as {mode}"}
        self.health: dict[str, str | None] = {"llm": None, "models_server": None}

    def run(self, request, mode="answer", on_event=None, state_ready=None):
        self.calls.append((request, mode, threading.current_thread().name))
        state = RequestState(request, LLMClient(self.config.llm), on_event, 30.0)
        if state_ready:
            state_ready(state)
        return self.script(state, mode)

    def checks(self, fresh=False):
        return dict(self.health)


class Slots:
    """Admission slots that are all taken; a caller that would wait for one (a silent queue) is a failure."""

    def __init__(self):
        self.released = 0

    def acquire(self, blocking=True):
        if blocking is not False:  # None is no promise not to wait: an Admission may take it for its default
            raise AssertionError("the request would wait for a slot")
        return False

    def release(self):
        self.released += 1


def configured(tmp_path: Path, **extra):
    public = make_public(tmp_path / "public")
    return load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public,
                                    semantic_ranking=False, **extra))


def build(tmp_path: Path, admission=None, **extra):
    """(test client, engine, app) of a server whose pipeline is scripted."""
    config = configured(tmp_path, **extra)
    engine = Engine(config)
    app = create_app(config, engine, admission=admission)
    return app.test_client(), engine, app


@pytest.fixture
def site(tmp_path):
    return build(tmp_path)


@pytest.fixture
def locked(tmp_path):
    return build(tmp_path, api_tokens=[TOKEN, "tok-other"])


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error(resp) -> dict:
    return resp.get_json()["error"]


def metric_lines(client, headers=None) -> list[str]:
    resp = client.get("/metrics", headers=headers or {})
    assert resp.status_code == 200
    return [line for line in resp.get_data(as_text=True).splitlines() if not line.startswith("#")]


def events_of(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event in a streamed answer."""
    out = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        if lines[0].startswith("event: "):
            out.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return out


def png(size=(8, 8)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (0, 0, 255)).save(out, format="PNG")
    return out.getvalue()


# -- the answers of the three JARVIS routes ---------------------------------------------------------------------


@pytest.mark.parametrize("path, body, mode", [
    ("/hugginggpt", ASK, "answer"),
    ("/tasks", ASK, "tasks"),
    ("/results", ASK, "results"),
    ("/hugginggpt", {**ASK, "return_decisions": True}, "decisions"),
    ("/hugginggpt", {**ASK, "return_decisions": False}, "answer"),
    ("/tasks", {**ASK, "return_decisions": True}, "tasks"),
    ("/results", {**ASK, "return_decisions": True, "stream": False}, "results"),
])
def test_each_route_runs_its_mode_and_answers_what_the_pipeline_returned(site, path, body, mode):
    client, engine, _ = site
    engine.script = lambda state, mode: {"message": f"ran as {mode}", "request": state.request.user_input}
    resp = client.post(path, json=body, headers={"X-Request-ID": "rid-42"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json() == {"message": f"ran as {mode}", "request": "draw a fox"}
    assert [m for _, m, _ in engine.calls] == [mode]
    assert engine.calls[0][0].request_id == "rid-42"
    assert resp.headers["X-Request-ID"] == "rid-42"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.mimetype == "application/json"


@pytest.mark.parametrize("flag", ["return_decisions", "stream"])
@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_flag_that_is_not_true_or_false_is_refused_before_anything_runs(site, flag, value):
    client, engine, _ = site
    resp = client.post("/hugginggpt", json={**ASK, flag: value})
    assert resp.status_code == 400
    assert error(resp) == {"message": f"`{flag}` must be true or false", "type": "invalid_request_error"}
    assert engine.calls == []


@pytest.mark.parametrize("path", ["/hugginggpt", "/tasks", "/results"])
def test_a_get_of_a_route_says_it_takes_post(site, path):
    client, engine, _ = site
    resp = client.get(path)
    assert resp.status_code == 405
    assert error(resp) == {"message": f"{path} takes POST with a JSON body", "type": "invalid_request_error"}
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Allow"] == "POST"


def test_a_get_of_the_openai_door_says_it_takes_post_not_that_no_model_exists(site):
    client, _, _ = site
    resp = client.get("/v1/chat/completions")  # an SDK user's wrong method: not a missing file or model
    assert resp.status_code == 405
    assert resp.get_json()["error"] == {"message": "/v1/chat/completions takes POST with a JSON body",
                                        "type": "invalid_request_error", "param": None, "code": None}
    assert client.get("/v1/chat/completions/x").status_code == 404  # only a route's own path
    assert client.get("/v1/models").status_code == 200
    resp = client.get("/upload")
    assert resp.status_code == 405 and error(resp)["message"] == "/upload takes POST with a file (multipart/form-data)"
    assert resp.headers["Allow"] == "POST"


def test_errors_of_the_pipeline_are_json_with_their_status_and_type(site, caplog):
    client, engine, _ = site

    def fails(state, mode):
        raise LLMError("the LLM said no")

    engine.script = fails
    with caplog.at_level(logging.WARNING, logger="hugginggpt.server"):
        resp = client.post("/tasks", json=ASK)
    assert resp.status_code == 502
    assert resp.get_json() == {"error": {"message": "the LLM said no", "type": "llm_backend_error"}}
    assert "request failed: the LLM said no" in caplog.messages


def test_an_unexpected_crash_is_a_json_500_that_names_only_its_kind(site, caplog):
    client, engine, _ = site

    def crashes(state, mode):
        raise KeyError("internal detail 42")

    engine.script = crashes
    with caplog.at_level(logging.ERROR, logger="hugginggpt.server"):
        resp = client.post("/hugginggpt", json=ASK)
    assert resp.status_code == 500
    assert resp.get_json() == {"error": {"message": "internal error (KeyError); see the server log",
                                         "type": "server_error"}}
    assert "internal detail 42" not in resp.get_data(as_text=True)
    crash = [r for r in caplog.records if r.getMessage() == "unexpected error"]
    assert crash and crash[0].exc_info is not None  # the traceback is in the log, not in the answer


def test_werkzeug_errors_keep_their_status_and_words(site):
    client, _, _ = site
    resp = client.post("/health")
    assert resp.status_code == 405
    assert error(resp) == {"message": "The method is not allowed for the requested URL.",
                           "type": "invalid_request_error"}
    assert sorted(resp.headers["Allow"].split(", ")) == ["GET", "HEAD", "OPTIONS"]  # HTTP's 405 names them
    resp = client.get("/no/such/thing.png")
    assert resp.status_code == 404
    assert error(resp) == {"message": "no such file", "type": "invalid_request_error"}


def test_a_client_that_leaves_stops_the_work_of_its_request(site, caplog):
    """A request answered in one piece: waitress's `client_disconnected` is watched and the work cancelled."""
    client, engine, _ = site
    engine.script = lambda state, mode: {"cancelled": state.cancelled.wait(5)}
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        resp = client.post("/tasks", json=ASK, headers={"X-Request-ID": "rid-gone"},
                           environ_base={"waitress.client_disconnected": lambda: True})
    assert resp.get_json() == {"cancelled": True}
    assert time.monotonic() - started < 3
    assert "[rid-gone] client went away; cancelling" in caplog.messages


# -- the body of a request ---------------------------------------------------------------------------------------


def test_a_body_that_is_not_json_is_refused_with_what_was_sent(site):
    client, engine, _ = site
    resp = client.post("/tasks", data="draw a fox", content_type="text/plain")
    assert resp.status_code == 415
    assert error(resp) == {"message": "send the body as JSON with `Content-Type: application/json` (got text/plain)",
                           "type": "invalid_request_error"}
    resp = client.post("/tasks", data="draw a fox")
    assert resp.status_code == 415
    assert error(resp)["message"].endswith("(got none)")
    assert engine.calls == []


@pytest.mark.parametrize("data, message", [
    (b"{not json", "the request body must be JSON, e.g. {\"messages\": [{\"role\": \"user\", \"content\": "
                   "\"...\"}]}; this is not valid JSON"),
    (b'{"a": "\xff"}', "the request body is not UTF-8 text"),
    (b"[" * 100_000, "the JSON body is nested too deeply"),
])
def test_a_body_that_cannot_be_read_is_a_400_that_says_why(site, data, message):
    client, engine, _ = site
    resp = client.post("/hugginggpt", data=data, content_type="application/json")
    assert resp.status_code == 400
    assert error(resp) == {"message": message, "type": "invalid_request_error"}
    assert engine.calls == []


def test_a_body_sent_in_chunks_with_no_length_is_read(site):
    """Transfer-Encoding: chunked (waitress gives the app the whole body, and no Content-Length)."""
    client, engine, _ = site
    resp = client.post("/tasks", input_stream=io.BytesIO(json.dumps(ASK).encode()), content_type="application/json",
                       headers={"Transfer-Encoding": "chunked"}, environ_base={"wsgi.input_terminated": True})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json() == {"message": "ran as tasks"}
    assert engine.calls[0][0].user_input == "draw a fox"


def test_the_body_limit_takes_a_body_of_exactly_max_body_bytes(tmp_path):
    client, engine, _ = build(tmp_path, max_body_bytes=1000)
    body = json.dumps({**ASK, "pad": ""})
    exact = json.dumps({**ASK, "pad": "x" * (1000 - len(body))}).encode()
    assert len(exact) == 1000
    resp = client.post("/tasks", data=exact, content_type="application/json")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    over = json.dumps({**ASK, "pad": "x" * (1001 - len(body))}).encode()
    for path in ("/tasks", "/v1/chat/completions"):
        resp = client.post(path, data=over, content_type="application/json")
        assert resp.status_code == 413
        assert error(resp)["message"] == "request body is larger than 1000 bytes"
        assert error(resp)["type"] == "invalid_request_error"
    assert len(engine.calls) == 1


# -- admission ---------------------------------------------------------------------------------------------------


def test_past_max_concurrent_requests_a_client_gets_429_at_once(tmp_path):
    slots = Slots()
    client, engine, _ = build(tmp_path, admission=slots, max_concurrent_requests=3)
    for path, body in (("/tasks", ASK), ("/v1/chat/completions", {"model": "hugginggpt", **ASK})):
        resp = client.post(path, json=body)
        assert resp.status_code == 429
        assert error(resp)["message"] == ("the server is running 3 requests (max_concurrent_requests); "
                                          "retry shortly")
        assert error(resp)["type"] == "rate_limit_error"
        assert resp.headers["Retry-After"] == "1"
    assert engine.calls == [] and slots.released == 0
    assert "hugginggpt_admission_rejections_total 2.0" in metric_lines(client)
    assert engine.admission is slots  # every door of the app draws from the slots it was given


def test_the_slot_is_given_back_after_an_answer_an_error_and_a_stream(tmp_path):
    slots = threading.BoundedSemaphore(1)
    client, engine, _ = build(tmp_path, admission=slots)

    def status(body: dict) -> int:
        with client.post("/tasks", json=body) as resp:  # the slot is given back when the response is closed
            return resp.status_code

    assert status(ASK) == 200
    assert status({**ASK, "stream": "yes"}) == 400  # refused inside the slot
    engine.script = lambda state, mode: 1 / 0
    assert status(ASK) == 500
    engine.script = lambda state, mode: {"message": "ok"}
    with client.post("/hugginggpt", json={**ASK, "stream": True}) as resp:
        assert "event: done" in resp.get_data(as_text=True)
        assert status(ASK) == 200  # read to its end, not yet closed: the slot is free already
    for stream_body, path in (({**ASK, "stream": True}, "/hugginggpt"),
                              ({"model": "hugginggpt", **ASK, "stream": True}, "/v1/chat/completions")):
        for script in (lambda state, mode: {"message": "ok"}, lambda state, mode: 1 / 0):
            engine.script = script
            with client.post(path, json=stream_body, buffered=False) as resp:
                for chunk in resp.response:  # as a client reads it: the last event in hand, nothing more asked
                    if b"event: done" in chunk or b"[DONE]" in chunk:
                        break
                else:
                    raise AssertionError(f"{path}: the stream has no last event")
                assert slots.acquire(blocking=False), f"{path}: a stream's last event came before its slot"
                slots.release()
    engine.script = lambda state, mode: {"message": "ok"}
    with client.post("/tasks", json=ASK) as resp:
        assert resp.status_code == 200
        with client.post("/tasks", json=ASK) as second:  # the first is answered: a client may ask again at once
            assert second.status_code == 200
    release = threading.Event()
    engine.script = lambda state, mode: release.wait(10) and {"message": "ok"}
    with client.post("/hugginggpt", json={**ASK, "stream": True}) as resp:
        assert status(ASK) == 429  # one slot, held while the stream's work runs
        release.set()
        resp.get_data()


def test_a_stream_holds_its_slot_until_its_work_has_ended_even_when_the_client_left(tmp_path):
    slots = threading.BoundedSemaphore(1)
    client, engine, _ = build(tmp_path, admission=slots)
    release = threading.Event()
    seen: list[RequestState] = []

    def slow(state, mode):
        seen.append(state)
        release.wait(10)  # the pipeline does not notice the cancel at once
        return {"message": "late"}

    engine.script = slow
    resp = client.post("/hugginggpt", json={**ASK, "stream": True}, buffered=False)
    assert next(iter(resp.response)).startswith(b": request ")
    resp.close()  # the client leaves
    wait_until(lambda: seen and seen[0].cancelled.is_set(), 5, "the work cancelled")
    with client.post("/tasks", json=ASK) as busy:
        assert busy.status_code == 429  # the work still runs
    release.set()
    engine.script = lambda state, mode: {"message": "ok"}

    def admitted() -> bool:
        with client.post("/tasks", json=ASK) as resp:
            return resp.status_code == 200

    wait_until(admitted, 5, "the slot given back")


# -- streams -----------------------------------------------------------------------------------------------------


def test_a_stream_of_tasks_sends_its_result_then_done(site):
    client, engine, _ = site
    engine.script = lambda state, mode: [{"task": "text-to-image", "id": 0}]
    resp = client.post("/tasks", json={**ASK, "stream": True}, headers={"X-Request-ID": "rid-7"})
    assert resp.status_code == 200
    assert resp.mimetype == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache"
    assert resp.headers["X-Accel-Buffering"] == "no"
    text = resp.get_data(as_text=True)
    assert text == (": request rid-7\n\n"
                    'event: result\ndata: {"event": "result", "request_id": "rid-7", "result": '
                    '[{"task": "text-to-image", "id": 0}]}\n\n'
                    'event: done\ndata: {"event": "done", "request_id": "rid-7"}\n\n')
    assert engine.calls[0][1:] == ("tasks", "req-rid-7")  # the work runs on a thread named for its request
    assert engine.calls[0][0].request_id == "rid-7"  # and is the client's request


def test_a_streamed_answer_passes_the_pipeline_events_on_as_they_are(site):
    client, engine, _ = site

    def answers(state, mode):
        state.on_event("answer_token", {"event": "answer_token", "text": "Zoë"})
        state.on_event("task_result", {"event": "task_result", "file": Path("/images/a.png")})
        return {"message": "Zoë drew a fox"}

    engine.script = answers
    resp = client.post("/hugginggpt", json={**ASK, "stream": True}, headers={"X-Request-ID": "rid-8"})
    text = resp.get_data(as_text=True)
    assert "Zoë" in text and "\\u00eb" not in text  # written as UTF-8, not escaped
    assert events_of(text) == [("answer_token", {"event": "answer_token", "text": "Zoë"}),
                               ("task_result", {"event": "task_result", "file": "/images/a.png"}),
                               ("done", {"event": "done", "request_id": "rid-8"})]  # the answer came as tokens


@pytest.mark.parametrize("path, result", [
    ("/hugginggpt", {"text": "no message"}),
    ("/hugginggpt", ["a list"]),
    ("/hugginggpt", "a message in a string"),
    ("/results", {"message": "a result named message"}),
])
def test_a_stream_ends_with_the_result_when_it_is_not_an_answer_message(site, path, result):
    client, engine, _ = site
    engine.script = lambda state, mode: result
    resp = client.post(path, json={**ASK, "stream": True}, headers={"X-Request-ID": "rid-9"})
    assert [e for e in events_of(resp.get_data(as_text=True)) if e[0] != "done"] == [
        ("result", {"event": "result", "request_id": "rid-9", "result": result})]


def test_a_stream_that_fails_ends_with_an_error_event_then_done(site, caplog):
    client, engine, _ = site

    def llm_fails(state, mode):
        raise LLMError("the LLM said no")

    def crashes(state, mode):
        raise KeyError("internal detail 42")

    engine.script = llm_fails
    text = client.post("/hugginggpt", json={**ASK, "stream": True}, headers={"X-Request-ID": "r1"}).get_data(
        as_text=True)
    assert events_of(text) == [("error", {"event": "error", "request_id": "r1",
                                          "error": {"message": "the LLM said no", "type": "llm_backend_error"}}),
                               ("done", {"event": "done", "request_id": "r1"})]
    engine.script = crashes
    with caplog.at_level(logging.ERROR, logger="hugginggpt.server"):
        text = client.post("/hugginggpt", json={**ASK, "stream": True}, headers={"X-Request-ID": "r2"}).get_data(
            as_text=True)
    assert events_of(text)[0] == ("error", {"event": "error", "request_id": "r2",
                                            "error": {"message": "internal error (KeyError)",
                                                      "type": "server_error"}})
    assert "internal detail 42" not in text
    assert "[r2] stream failed" in caplog.messages


def test_a_stream_with_a_bad_override_is_refused_before_it_starts(site):
    client, engine, _ = site
    resp = client.post("/hugginggpt", json={**ASK, "stream": True, "api_type": "bogus"})
    assert resp.status_code == 400
    assert resp.mimetype == "application/json"
    assert error(resp)["message"].startswith("api_type must be one of ")
    assert engine.calls == []


def test_a_stream_sends_keep_alives_while_its_client_is_there_and_stops_when_it_leaves(site, caplog):
    client, engine, _ = site

    def slow(state, mode):
        state.cancelled.wait(0.8)
        return {"message": "done", "cancelled": state.cancelled.is_set()}

    engine.script = slow
    text = client.post("/hugginggpt", json={**ASK, "stream": True},
                       environ_base={"waitress.client_disconnected": lambda: False}).get_data(as_text=True)
    # polled every 0.5 s on waitress: whole SSE comments between the events
    assert ": keep-alive" in text.split("\n\n") and "event: done" in text

    text = client.post("/hugginggpt", json={**ASK, "stream": True}).get_data(as_text=True)
    assert "keep-alive" not in text  # elsewhere: a comment every 10 s

    engine.script = lambda state, mode: {"message": "", "cancelled": state.cancelled.wait(5)}
    gone: list[bool] = []
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        text = client.post("/hugginggpt", json={**ASK, "stream": True}, headers={"X-Request-ID": "rid-left"},
                           environ_base={"waitress.client_disconnected": lambda: bool(gone) or gone.append(1)}
                           ).get_data(as_text=True)
    assert "event: done" not in text  # the client left: no more events
    assert time.monotonic() - started < 2.5
    wait_until(lambda: "[rid-left] client went away; cancelling" in caplog.messages, 5, "the work cancelled")


def test_a_stream_read_to_its_end_is_not_cancelled(site, caplog):
    client, engine, _ = site
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        resp = client.post("/tasks", json={**ASK, "stream": True})
        assert "event: done" in resp.get_data(as_text=True)
        resp.close()
    assert not any("client went away" in m for m in caplog.messages)


# -- who may call -------------------------------------------------------------------------------------------------


API_CALLS = [
    ("POST", "/hugginggpt"), ("POST", "/tasks"), ("POST", "/results"), ("POST", "/upload"), ("POST", "/mcp"),
    ("GET", "/models/search"), ("GET", "/metrics"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
]


@pytest.mark.parametrize("method, path", API_CALLS)
def test_every_api_route_takes_only_a_configured_bearer_token(locked, method, path):
    client, engine, _ = locked
    for headers, status, message, kind in (
        ({}, 401, NEEDS_TOKEN, "authentication_error"),
        ({"Authorization": f"Basic {TOKEN}"}, 401, NEEDS_TOKEN, "authentication_error"),
        (bearer("tok-wrong"), 403, WRONG_TOKEN, "permission_error"),
    ):
        resp = client.open(path, method=method, json=ASK, headers=headers)
        assert resp.status_code == status, (headers, resp.get_data(as_text=True))
        if path == "/mcp":  # JSON-RPC's error shape
            assert resp.get_json()["error"]["message"] == message
        else:
            assert error(resp)["message"] == message and error(resp)["type"] == kind
    assert engine.calls == []
    for token in (TOKEN, "tok-other"):
        resp = client.open(path, method=method, json=ASK, headers=bearer(token))
        assert resp.status_code not in (401, 403), resp.get_data(as_text=True)


def test_open_routes_and_preflights_need_no_token(locked):
    client, _, _ = locked
    assert client.get("/health").status_code == 200
    assert client.get("/").status_code == 200
    assert client.get("/examples/red.png").status_code == 200
    resp = client.options("/tasks", headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"})
    assert resp.status_code == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_errors_of_the_openai_routes_have_openai_s_shape(locked):
    client, _, _ = locked
    resp = client.post("/v1/chat/completions", json=ASK)
    assert resp.get_json() == {"error": {"message": NEEDS_TOKEN, "type": "authentication_error", "param": None,
                                         "code": None}}
    resp = client.post("/v1/chat/completions", json={"model": "nope", **ASK}, headers=bearer())
    assert resp.status_code == 404
    assert error(resp)["code"] == "model_not_found" and error(resp)["param"] is None
    assert "the model 'nope' does not exist" in error(resp)["message"]


def test_an_openai_completion_carries_the_request_id(site):
    client, engine, _ = site
    engine.script = lambda state, mode: {"message": "a fox"}
    resp = client.post("/v1/chat/completions", json={"model": "hugginggpt", **ASK}, headers={"X-Request-ID": "rid-v1"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.get_json()["id"] == "chatcmpl-rid-v1"
    assert resp.get_json()["choices"][0]["message"]["content"] == "a fox"
    image = "data:image/png;base64," + __import__("base64").b64encode(png()).decode()
    engine.script = lambda state, mode: {"message": state.request.user_input}
    resp = client.post("/v1/chat/completions", json={"model": "hugginggpt", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": image}}]}]})
    said = resp.get_json()["choices"][0]["message"]["content"]
    assert said.startswith("what is this (/uploads/") and said.endswith(".png)")  # kept in the app's uploads
    models = client.get("/v1/models").get_json()
    assert [m["id"] for m in models["data"]] == ["hugginggpt", "hugginggpt-plan"]


def test_without_tokens_only_known_host_names_are_answered(tmp_path):
    client, engine, _ = build(tmp_path, allowed_hosts=["chat.example"], http_listen={"host": "box.lan", "port": 8004})
    for host in ("localhost", "127.0.0.1:8004", "chat.example", "box.lan:8004", "10.1.2.3"):
        assert client.get("/health", headers={"Host": host}).status_code == 200, host
    resp = client.post("/tasks", json=ASK, headers={"Host": "evil.example:8004", "X-Request-ID": "rid-h"})
    assert resp.status_code == 403
    assert error(resp) == {"message": "this server does not answer to the host name 'evil.example'; add it to "
                                      "allowed_hosts in its config (or set api_tokens)", "type": "permission_error"}
    assert resp.headers["X-Request-ID"] == "rid-h"
    assert client.get("/health", headers={"Host": "evil.example"}).status_code == 403
    long = "a" * 150 + ".example"
    resp = client.get("/health", headers={"Host": long})
    assert error(resp)["message"].startswith(f"this server does not answer to the host name {'a' * 100!r};")
    assert engine.calls == []


def test_with_tokens_any_host_name_is_answered(locked):
    client, _, _ = locked
    assert client.get("/health", headers={"Host": "evil.example"}).status_code == 200
    resp = client.post("/tasks", json=ASK, headers={"Host": "evil.example", **bearer()})
    assert resp.status_code == 200


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1", "https://localhost",
                                    "http://[::1]:8080"])
def test_a_page_on_this_machine_may_post(site, origin):
    client, engine, _ = site
    resp = client.post("/tasks", json=ASK, headers={"Origin": origin})
    assert resp.status_code == 200
    assert resp.headers["Access-Control-Allow-Origin"] == origin
    assert resp.headers["Access-Control-Expose-Headers"] == "X-Request-ID"


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null",
                                    "http://localhost:80x"])
def test_a_page_of_another_origin_may_not_post(site, origin):
    client, engine, _ = site
    resp = client.post("/tasks", json=ASK, headers={"Origin": origin})
    assert resp.status_code == 403
    assert error(resp) == {"message": f"requests from the web origin {origin} are not allowed; add it to "
                                      "cors_origins", "type": "permission_error"}
    assert "Access-Control-Allow-Origin" not in resp.headers
    assert engine.calls == []


def test_a_foreign_page_may_still_read_what_is_open_and_ask_for_a_preflight(site):
    client, engine, _ = site
    evil = {"Origin": "https://evil.example"}
    assert client.get("/health", headers=evil).status_code == 200
    assert client.get("/examples/red.png", headers=evil).status_code == 200
    resp = client.options("/tasks", headers={**evil, "Access-Control-Request-Method": "POST"})
    assert resp.status_code == 200 and "Access-Control-Allow-Origin" not in resp.headers
    long = "https://" + "e" * 200 + ".example"
    resp = client.post("/tasks", json=ASK, headers={"Origin": long})
    assert error(resp)["message"] == f"requests from the web origin {long[:100]} are not allowed; add it to cors_origins"


def test_the_server_s_own_origin_may_post(tmp_path):
    client, engine, _ = build(tmp_path, allowed_hosts=["chat.example"], cors_origins=["https://app.example"])
    for origin in ("http://chat.example", "http://chat.example/"):
        resp = client.post("/tasks", json=ASK, headers={"Host": "chat.example", "Origin": origin})
        assert resp.status_code == 200, origin
    for origin in ("http://chat.example:81", "http://chat.exampleX", "https://chat.example"):
        resp = client.post("/tasks", json=ASK, headers={"Host": "chat.example", "Origin": origin})
        assert resp.status_code == 403, origin


def test_configured_cors_origins_replace_the_local_ones(tmp_path):
    client, engine, _ = build(tmp_path, cors_origins=["https://app.example"])
    resp = client.post("/tasks", json=ASK, headers={"Origin": "https://app.example"})
    assert resp.status_code == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert client.post("/tasks", json=ASK, headers={"Origin": "http://localhost:3000"}).status_code == 403


def test_a_preflight_allows_the_methods_and_headers_a_page_needs(site):
    client, _, _ = site
    resp = client.options("/mcp", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization, x-request-id, mcp-protocol-version, "
                                          "mcp-session-id, x-other"})
    assert resp.status_code == 200
    assert resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
    assert resp.headers["Access-Control-Allow-Methods"] == "GET, OPTIONS, POST"
    assert resp.headers["Access-Control-Max-Age"] == "600"
    assert set(resp.headers["Access-Control-Allow-Headers"].split(", ")) == {
        "content-type", "authorization", "x-request-id", "mcp-protocol-version", "mcp-session-id"}  # not x-other


@pytest.mark.parametrize("sent, echoed", [("client-id.1", True), ("bad id!", False), (None, False)])
def test_every_answer_carries_a_request_id_and_nosniff(site, sent, echoed):
    client, _, _ = site
    headers = {"X-Request-ID": sent} if sent else {}
    for resp in (client.get("/health", headers=headers), client.get("/nope", headers=headers),
                 client.post("/tasks", json=ASK, headers=headers)):
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        rid = resp.headers["X-Request-ID"]
        assert rid == sent if echoed else (len(rid) == 12 and rid != sent)


# -- the other routes ----------------------------------------------------------------------------------------------


def test_health_reports_each_dependency_without_naming_endpoints(tmp_path):
    client, engine, _ = build(tmp_path)
    assert client.get("/health").get_json() == {
        "status": "ok", "down": [], "inference_mode": "local", "models_server": "up", "model_ranking": "keyword",
        "auth": "none", "llm": {"api_type": "local", "model": "scripted", "api_key": "unset", "reachable": True}}
    engine.health = {"llm": "the LLM at ... refused the connection", "models_server": "unused"}
    got = client.get("/health").get_json()
    assert (got["status"], got["down"], got["models_server"], got["llm"]["reachable"]) == (
        "degraded", ["llm"], "unused", False)
    assert "127.0.0.1:9" not in json.dumps(got)
    engine.health = {"llm": None, "models_server": "connection refused"}
    got = client.get("/health").get_json()
    assert (got["status"], got["down"], got["models_server"], got["llm"]["reachable"]) == (
        "degraded", ["models_server"], "down", True)


def test_health_says_when_tokens_are_needed(locked):
    client, _, _ = locked
    assert client.get("/health").get_json()["auth"] == "token"


def test_metrics_are_prometheus_text_with_each_route_and_status(site):
    client, engine, _ = site
    client.post("/tasks", json=ASK)
    client.post("/tasks", data="x", content_type="text/plain")
    client.post("/health")  # 405: no route matched
    client.get("/examples/red.png")
    resp = client.get("/metrics")
    assert resp.headers["Content-Type"] == METRICS_CONTENT_TYPE  # the format version a scraper reads
    lines = metric_lines(client)
    assert 'hugginggpt_http_requests_total{route="/tasks",status="200"} 1.0' in lines
    assert 'hugginggpt_http_requests_total{route="/tasks",status="415"} 1.0' in lines
    assert 'hugginggpt_http_requests_total{route="other",status="405"} 1.0' in lines
    assert 'hugginggpt_http_requests_total{route="/<path:filename>",status="200"} 1.0' in lines
    assert 'hugginggpt_http_requests_total{route="/metrics",status="200"} 1.0' in lines


def test_models_search_ranks_the_catalog_for_a_task(site):
    client, _, _ = site
    found = client.get("/models/search?task=image-classification").get_json()
    assert len(found) == 10 and {m["task"] for m in found} == {"image-classification"}
    assert len(client.get("/models/search?task=image-classification&limit=3").get_json()) == 3
    resnet = client.get("/models/search?task=image-classification&q=resnet&limit=1").get_json()
    assert [m["id"] for m in resnet] == ["microsoft/resnet-50"] != [found[0]["id"]]  # the words of `q` rank
    resp = client.get("/models/search?task=no-such-task")
    assert resp.status_code == 400 and "unknown task 'no-such-task'" in error(resp)["message"]


def test_upload_keeps_an_image_or_audio_under_public(tmp_path):
    client, _, app = build(tmp_path)
    resp = client.post("/upload", data={"file": (io.BytesIO(png()), "fox.png")})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    got = resp.get_json()
    assert got["kind"] == "image" and got["path"].startswith("/uploads/") and got["path"].endswith(".png")
    assert (tmp_path / "public" / got["path"].lstrip("/")).read_bytes() == png()
    mp3 = io.BytesIO()
    sf.write(mp3, np.zeros(8000, dtype="float32"), 16000, format="MP3")
    resp = client.post("/upload", data={"file": (io.BytesIO(mp3.getvalue()), "hello.mp3")})
    assert resp.get_json()["kind"] == "audio"  # known only by its name: an MP3 has no magic bytes
    resp = client.post("/upload", data={"other": (io.BytesIO(png()), "fox.png")})
    assert resp.status_code == 400
    assert error(resp)["message"] == "send the file as multipart form field `file`"


def test_upload_limits_come_from_the_config(tmp_path):
    client, _, _ = build(tmp_path / "a", max_image_pixels=100)
    resp = client.post("/upload", data={"file": (io.BytesIO(png((20, 20))), "big.png")})
    assert resp.status_code == 400 and "pixels" in error(resp)["message"]
    client, _, _ = build(tmp_path / "b", upload_quota_mb=0.0001)
    assert client.post("/upload", data={"file": (io.BytesIO(png()), "a.png")}).status_code == 200
    resp = client.post("/upload", data={"file": (io.BytesIO(png((30, 30))), "b.png")})
    assert resp.status_code == 507 and error(resp)["type"] == "storage_error"
    client, _, _ = build(tmp_path / "c", max_body_bytes=2000)
    resp = client.post("/upload", data={"file": (io.BytesIO(b"x" * 1990), "a.png")})  # the form is over 2000
    assert resp.status_code == 413
    assert error(resp)["message"] == "request body is larger than 2000 bytes"


def test_the_page_its_icon_and_public_files_are_served_and_nothing_outside(site, tmp_path):
    client, _, _ = site
    (tmp_path / "public" / "static").mkdir()
    (tmp_path / "public" / "static" / "note.txt").write_bytes(b"a note")
    page = client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html" and b"<title>HuggingGPT</title>" in page.data
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.mimetype == "image/svg+xml"
    assert icon.headers["Cache-Control"] == "public, max-age=86400"
    assert client.get("/static/note.txt").data == b"a note"  # public/static/ is public/'s too
    image = client.get("/examples/red.png")
    assert image.status_code == 200 and image.mimetype == "image/png"
    assert Image.open(io.BytesIO(image.data)).size == (80, 60)
    for path in ("/..%2Fsecret.txt", "/examples/..%2F..%2Fsecret.txt", "/%2E%2E/secret.txt"):
        resp = client.get(path)
        assert resp.status_code == 404, path
        assert b"do not serve me" not in resp.data
        assert error(resp)["message"] == "no such file"


def test_the_icon_is_svg_whatever_the_system_s_table_of_types_says(site, monkeypatch):
    """Some systems map .svg to another type (a Windows registry, an old /etc/mime.types): a browser would
    not draw the icon."""
    import mimetypes

    guess = mimetypes.guess_type
    monkeypatch.setattr(mimetypes, "guess_type", lambda name, strict=True: (
        ("text/plain", None) if str(name).endswith(".svg") else guess(name, strict)))
    client, _, _ = site
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.mimetype == "image/svg+xml"


def test_mcp_is_served_in_the_app(site):
    client, engine, _ = site
    resp = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                       headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
    assert resp.status_code == 200
    assert {t["name"] for t in resp.get_json()["result"]["tools"]} >= {"hugginggpt", "plan"}
    engine.script = lambda state, mode: {"tasks": [{"task": "text-to-image", "mode": mode}]}
    resp = client.post("/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                     "params": {"name": "plan", "arguments": {"text": "draw a fox"}}},
                       headers={"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
    assert resp.status_code == 200
    assert [m for _, m, _ in engine.calls] == ["decisions"]  # the app's engine runs the tool
    assert "text-to-image" in json.dumps(resp.get_json()["result"])


def test_an_mcp_call_with_a_progress_token_is_answered_as_a_stream_and_every_other_in_json(site):
    client, engine, _ = site
    engine.script = lambda state, mode: {"tasks": [{"task": "text-to-image", "mode": mode}]}
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "plan", "arguments": {"text": "a fox"}}}
    plain = client.post("/mcp", json=call, headers=headers)
    assert plain.status_code == 200 and plain.mimetype == "application/json"
    assert "text-to-image" in json.dumps(plain.get_json()["result"])
    for token in ("tok-1", 7):
        streamed = client.post("/mcp", json={**call, "params": {**call["params"], "_meta": {"progressToken": token}}},
                               headers=headers)
        assert streamed.status_code == 200 and streamed.mimetype == "text/event-stream"
        assert "Connection" not in streamed.headers  # hop-by-hop: the server's to say (PEP 3333)
        data = [json.loads(line[len("data: "):]) for line in streamed.get_data(as_text=True).splitlines()
                if line.startswith("data: ")]
        assert data[-1]["id"] == 3 and "text-to-image" in json.dumps(data[-1]["result"])
    for meta in ({"progressToken": True}, {"progressToken": None}, {"progressToken": [1]}, "x"):
        other = client.post("/mcp", json={**call, "params": {**call["params"], "_meta": meta}}, headers=headers)
        assert other.mimetype == "application/json"  # no usable token: as before
    listed = client.post("/mcp", json={"jsonrpc": "2.0", "id": 4, "method": "tools/list",
                                       "params": {"_meta": {"progressToken": "t"}}}, headers=headers)
    assert listed.mimetype == "application/json"  # only a tool call has progress to report
    bad = client.post("/mcp", data="[" * 5000, headers={**headers, "Content-Type": "application/json"})
    assert bad.status_code < 500


def test_the_app_names_its_engine_and_its_body_gate(tmp_path):
    config = configured(tmp_path, max_body_bytes=1234)
    engine = Engine(config)
    app = create_app(config, engine)
    assert app.extensions["hugginggpt"] is engine  # for an application that embeds the server
    gate = gate_of(app)
    assert gate is app.extensions[BODY_GATE] and gate.max_body_bytes == 1234


def test_an_app_given_only_its_config_makes_its_own_engine_of_it(tmp_path):
    config = configured(tmp_path)
    app = create_app(config)
    engine = app.extensions["hugginggpt"]
    assert isinstance(engine, HuggingGPT) and engine.config is config
    found = app.test_client().get("/models/search?task=image-classification&q=resnet&limit=1")
    assert [m["id"] for m in found.get_json()] == ["microsoft/resnet-50"]  # its catalog, from the config


# -- token_problem and the body gate (what waitress refuses before it reads a body) ------------------------------


def test_token_problem_says_why_a_token_is_refused():
    tokens = ("tok-a", "tok-b")
    assert token_problem(None, ()) is None
    assert token_problem("Bearer anything", ()) is None
    assert token_problem("Bearer tok-b", tokens) is None
    for header in (None, "", "Basic tok-a", "Bearer "):
        refused = token_problem(header, tokens)
        assert isinstance(refused, Unauthorized) and str(refused) == NEEDS_TOKEN
    refused = token_problem("Bearer tok-c", tokens)
    assert isinstance(refused, Forbidden) and str(refused) == WRONG_TOKEN


def test_the_body_gate_refuses_on_the_headers_what_the_app_would(tmp_path):
    config = configured(tmp_path, api_tokens=[TOKEN], max_body_bytes=500)
    gate = body_gate(config)
    assert gate.max_body_bytes == 500
    assert gate.judge("POST", "/tasks", {}, 10) == Refusal(401, NEEDS_TOKEN, "authentication_error")
    assert gate.judge("POST", "/tasks", {"Authorization": "Bearer nope"}, 10) == Refusal(
        403, WRONG_TOKEN, "permission_error")
    assert gate.judge("POST", "/tasks", bearer(), 500) is None
    assert gate.judge("POST", "/tasks", bearer(), 501) == Refusal(413, "request body is larger than 500 bytes",
                                                                  "invalid_request_error")
    assert gate.judge("OPTIONS", "/tasks", {}, 10) is None
    assert gate.judge("POST", "/health", {}, 10) is None  # not an API route: the app answers it
    assert gate.judge("POST", "/upload", {}, 10).status == 401
    assert gate.judge("POST", "/upload", {}, 10).status == 401
    gate = body_gate(configured(tmp_path / "open", max_body_bytes=500))
    assert gate.judge("POST", "/tasks", {}, 10) is None
    assert gate.judge("POST", "/tasks", {}, 501).status == 413


def test_the_body_gate_answers_in_each_route_s_error_shape_and_counts_it(tmp_path):
    client, engine, app = build(tmp_path, api_tokens=[TOKEN])
    gate = gate_of(app)
    refusal = Refusal(401, NEEDS_TOKEN, "authentication_error")
    assert gate.render("/tasks", refusal) == {"error": {"message": NEEDS_TOKEN, "type": "authentication_error"}}
    assert gate.render("/v1/chat/completions", refusal) == {
        "error": {"message": NEEDS_TOKEN, "type": "authentication_error", "param": None, "code": None}}
    assert gate.render("/mcp", refusal) == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32001, "message": NEEDS_TOKEN, "data": {"type": "authentication_error", "status": 401}}}
    gate.observe("POST", "/tasks", refusal)
    gate.observe("POST", "/elsewhere", Refusal(413, "too large"))
    lines = metric_lines(client, bearer())
    assert 'hugginggpt_http_requests_total{route="/tasks",status="401"} 1.0' in lines
    assert 'hugginggpt_http_requests_total{route="other",status="413"} 1.0' in lines
    body_gate(configured(tmp_path / "alone")).observe("POST", "/tasks", refusal)  # no metrics: nothing to count


# -- slow clients, connections per client, the file limit, the address --------------------------------------------


class Channel:
    def __init__(self, request=None, accepted: float = 0.0, read: bool = True, addr=("10.0.0.1", 5000)):
        self.requests, self.will_close, self.request, self.accepted = [], False, request, accepted
        self.creation_time, self.last_activity = 1.0, 2.0 if read else 1.0
        self.addr = addr


def parsing(started: float = 0.0, headers_finished: bool = False, completed: bool = False):
    return SimpleNamespace(started=started, headers_finished=headers_finished, completed=completed)


LIMITS = HttpLimits(header_timeout=10, read_timeout=60)


def test_overdue_a_connection_that_sends_nothing():
    assert overdue(Channel(None, accepted=0, read=False), 10, LIMITS) is None
    assert overdue(Channel(None, accepted=0, read=False), 10.5, LIMITS) == "sent nothing in 10 s"
    assert overdue(Channel(None, accepted=0, read=True), 100, LIMITS) is None  # idle keep-alive: idle_timeout
    nameless = Channel(None, read=False)
    del nameless.accepted  # a channel waitress made before the guard: counted from now
    assert overdue(nameless, 100, LIMITS) is None
    assert overdue(Channel(None, accepted=0, read=False), 2.6,
                   HttpLimits(header_timeout=2.5)) == "sent nothing in 2.5 s"


def test_overdue_a_request_arriving_too_slowly():
    assert overdue(Channel(parsing(0)), 10, LIMITS) is None
    assert overdue(Channel(parsing(0)), 10.5, LIMITS) == "headers not complete in 10 s (http_header_timeout)"
    body = Channel(parsing(0, headers_finished=True))
    assert overdue(body, 30, LIMITS) is None  # past the header deadline, the headers are in
    assert overdue(body, 60, LIMITS) is None
    assert overdue(body, 60.5, LIMITS) == "request not complete in 60 s (http_read_timeout)"
    assert overdue(Channel(parsing(0)), 61, HttpLimits(header_timeout=100, read_timeout=60)) == (
        "request not complete in 60 s (http_read_timeout)")
    assert overdue(Channel(parsing(0, headers_finished=True, completed=True)), 1000, LIMITS) is None
    unstamped = Channel(SimpleNamespace(headers_finished=False, completed=False))
    assert overdue(unstamped, 1000, LIMITS) is None


def test_overdue_leaves_a_request_being_served_or_a_closing_connection():
    served = Channel(parsing(0))
    served.requests = ["being served"]
    assert overdue(served, 1000, LIMITS) is None
    closing = Channel(None, accepted=0, read=False)
    closing.will_close = True
    assert overdue(closing, 1000, LIMITS) is None


def fake_listener(channels: dict) -> SimpleNamespace:
    swept: list[float] = []
    return SimpleNamespace(active_channels=channels, maintenance=swept.append, swept=swept,
                           channel_class=None, accept=None)


def test_the_slow_client_sweep_closes_only_overdue_connections(caplog, monkeypatch):
    monkeypatch.setattr(server_module.time, "monotonic", lambda: 100.0)
    slow, idle, fresh = Channel(parsing(0)), Channel(parsing(95)), Channel(None, accepted=0, read=False)
    listener = fake_listener({1: slow, 2: idle, 3: fresh})
    guard_slow_clients(listener, LIMITS)
    assert listener.channel_class.parser_class.__name__ == "TimedParser"
    with caplog.at_level(logging.DEBUG, logger="hugginggpt.server"):
        listener.maintenance(5.0)
    assert listener.swept == [5.0]  # waitress's own idle sweep still runs
    assert (slow.will_close, idle.will_close, fresh.will_close) == (True, False, True)
    assert ("closed 2 slow connection(s) (a request arriving for longer than http_header_timeout or "
            "http_read_timeout)") in caplog.messages
    assert ("closing the connection from ('10.0.0.1', 5000): headers not complete in 10 s "
            "(http_header_timeout)") in caplog.messages
    caplog.clear()
    calm = fake_listener({1: Channel(parsing(99))})
    guard_slow_clients(calm, LIMITS)
    with caplog.at_level(logging.DEBUG, logger="hugginggpt.server"):
        calm.maintenance(6.0)
    assert caplog.messages == [] and calm.swept == [6.0]


def test_the_timed_parser_remembers_its_first_byte():
    from waitress.adjustments import Adjustments

    listener = fake_listener({})
    guard_slow_clients(listener, LIMITS)
    before = time.monotonic()
    parser = listener.channel_class.parser_class(Adjustments())
    assert before <= parser.started <= time.monotonic()


def test_every_listening_socket_of_a_server_is_guarded(tmp_path):
    from waitress import create_server
    from waitress.server import BaseWSGIServer

    _, _, app = build(tmp_path)
    server = create_server(app, listen="127.0.0.1:0 127.0.0.1:0")
    try:
        listeners = [s for s in server.map.values() if isinstance(s, BaseWSGIServer)]
        assert len(listeners) == 2
        guard_slow_clients(server, LIMITS)
        limit_connections_per_client(server, LIMITS)
        for listener in listeners:
            assert listener.channel_class.parser_class.__name__ == "TimedParser"
            assert listener.accept.__name__ == "accept_within_cap"
    finally:
        server.close()
        server.task_dispatcher.shutdown(timeout=1)


def test_client_address_and_the_connections_it_holds():
    assert client_address(("10.0.0.1", 80)) == "10.0.0.1"
    assert client_address(("::1", 80, 0, 0)) == "::1"
    for addr in ("", None, (), ("",), (None, 1), "/tmp/sock"):
        assert client_address(addr) is None
    listener = fake_listener({1: Channel(), 2: Channel(), 3: Channel(addr=("10.0.0.2", 1)), 4: Channel(addr="")})
    assert open_from(listener, "10.0.0.1") == 2
    assert open_from(listener, "10.0.0.2") == 1
    assert open_from(listener, "10.0.0.3") == 0


class Conn:
    def __init__(self, fails: bool = False):
        self.sent, self.closed, self.blocking, self.fails = b"", False, None, fails

    def setblocking(self, flag):
        self.blocking = flag

    def send(self, data):
        if self.fails:
            raise ConnectionResetError
        self.sent += data
        return len(data)

    def close(self):
        self.closed = True


def test_past_its_share_of_connections_a_client_gets_a_429_and_a_closed_socket(caplog):
    listener = fake_listener({1: Channel(), 2: Channel()})
    arriving: list = []
    listener.accept = lambda: arriving.pop(0) if arriving else None
    limit_connections_per_client(listener, HttpLimits(connections_per_client=2))
    assert listener.accept() is None  # nothing waiting
    third, other, unix, reset = Conn(), Conn(), Conn(), Conn(fails=True)
    arriving[:] = [(third, ("10.0.0.1", 7)), (other, ("10.0.0.2", 7)), (unix, ""), (reset, ("10.0.0.1", 8))]
    assert listener.accept() is None
    assert third.sent == TURNED_AWAY and third.closed and third.blocking is False
    assert listener.accept() == (other, ("10.0.0.2", 7)) and not other.closed
    assert listener.accept() == (unix, "")  # a Unix socket has no address to count
    assert listener.accept() is None and reset.closed  # a reset while refusing still closes
    with caplog.at_level(logging.WARNING, logger="hugginggpt.server"):
        listener.maintenance(1.0)
        listener.maintenance(2.0)
    assert listener.swept == [1.0, 2.0]
    assert caplog.messages == ["turned away 2 connection(s) from 10.0.0.1: it already holds 2 "
                               "(http_connections_per_client)"]  # once per sweep, then forgotten
    listener.active_channels = {1: Channel()}
    arriving[:] = [(Conn(), ("10.0.0.1", 9))]
    assert listener.accept() is not None  # under the cap again


def test_the_default_share_is_a_quarter_of_the_connection_limit():
    listener = fake_listener({i: Channel() for i in range(3)})
    arriving = [(Conn(), ("10.0.0.1", 1))]
    listener.accept = lambda: arriving.pop(0)
    limit_connections_per_client(listener, HttpLimits(connection_limit=16))
    assert listener.accept() is not None  # 3 of 4
    listener.active_channels[3] = Channel()
    arriving.append((Conn(), ("10.0.0.1", 2)))
    assert listener.accept() is None


def test_the_turned_away_answer_is_a_complete_http_429():
    head, _, body = TURNED_AWAY.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 429 Too Many Requests"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers == {"Content-Type": "application/json", "Retry-After": "5", "Connection": "close",
                       "Content-Length": str(len(body))}
    assert json.loads(body) == {"error": {
        "message": "too many open connections from your address (http_connections_per_client); close some and retry",
        "type": "rate_limit_error"}}


class Limits:
    """resource.getrlimit / setrlimit as a process with these limits sees them."""

    def __init__(self, monkeypatch, soft, hard, fails=None):
        import resource

        self.soft, self.hard, self.fails, self.set = soft, hard, fails, []
        monkeypatch.setattr(resource, "getrlimit", self.getrlimit)
        monkeypatch.setattr(resource, "setrlimit", self.setrlimit)

    def getrlimit(self, which):
        import resource

        assert which == resource.RLIMIT_NOFILE  # the limit of open files, not another one
        return self.soft, self.hard

    def setrlimit(self, which, limits):
        import resource

        assert which == resource.RLIMIT_NOFILE
        if self.fails:
            raise self.fails
        self.set.append(limits)
        self.soft = limits[0]


def test_the_file_limit_is_raised_for_the_connections_wanted(monkeypatch):
    import resource

    inf = resource.RLIM_INFINITY
    for soft, hard, wanted, fits, raised in [
        (1024, 4096, 100, 100, []),  # room already
        (356, 4096, 100, 100, []),  # exactly room: left alone
        (1024, 4096, 2000, 2000, [(2256, 4096)]),
        (1024, inf, 2000, 2000, [(2256, inf)]),
        (1024, 1500, 2000, 1244, [(1500, 1500)]),  # as far as the hard limit goes
        (100, 100, 2000, 16, [(100, 100)]),
        (inf, inf, 5000, 5000, []),
        (266, 266, 10, 10, []),
    ]:
        limits = Limits(monkeypatch, soft, hard)
        assert _raise_file_limit(wanted) == fits, (soft, hard, wanted)
        assert limits.set == raised, (soft, hard, wanted)


def test_the_file_limit_of_this_process_leaves_a_few_connections_alone():
    assert _raise_file_limit(16) == 16  # the real limits: every system allows 272 open files


@pytest.mark.parametrize("fails", [ValueError("not allowed"), OSError(errno.EPERM, "not permitted")])
def test_a_file_limit_that_cannot_be_raised_lowers_the_connections(monkeypatch, fails):
    Limits(monkeypatch, 1024, 4096, fails=fails)
    assert _raise_file_limit(2000) == 768


@pytest.mark.parametrize("code, why", [
    (errno.EADDRINUSE, "is already in use"),
    (errno.EACCES, "needs more privileges"),
    (errno.EADDRNOTAVAIL, "is not an address of this machine"),
    (errno.ENETUNREACH, f"failed ({__import__('os').strerror(errno.ENETUNREACH)})"),
])
def test_an_address_that_cannot_be_taken_is_one_line(code, why):
    exc = OSError(code, __import__("os").strerror(code))
    assert address_problem("0.0.0.0", 80, exc) == (
        f"error: 0.0.0.0:80 {why}; choose another with --port (or http_listen.port in the config)")
    assert address_problem("::1", 8005, exc, "models_server.port").endswith("(or models_server.port in the config)")


# -- serve: a real waitress server on loopback ----------------------------------------------------------------------


def test_serve_says_so_when_the_port_is_taken_and_when_files_run_short(tmp_path, monkeypatch, capsys):
    client, _, app = build(tmp_path)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    Limits(monkeypatch, 300, 300)
    try:
        assert serve(app, "127.0.0.1", port, port_option="x.port") == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "warning: http_connection_limit 1000 lowered to 44: the process may not open more files (ulimit -n)",
            f"error: 127.0.0.1:{port} is already in use; choose another with --port (or x.port in the config)"]
        Limits(monkeypatch, 1256, 1256)  # room for 1000 connections, just
        assert serve(app, "127.0.0.1", port, limits=HttpLimits(connection_limit=1000)) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: 127.0.0.1:{port} is already in use; choose another with --port (or http_listen.port in the "
            "config)"]
    finally:
        taken.close()


def test_serve_runs_waitress_with_the_settings_it_was_given(tmp_path, monkeypatch):
    """16 request threads and `Server: hugginggpt` unless told otherwise; the connection limit that fits the
    file limit; poll(), not select() (which fails once a socket's number passes 1023, and 1000 connections pass
    it); the slow-client sweep once a second; an idle connection closed after idle_timeout in whole seconds (at
    least 1); and waitress reading on while a request runs, so that it sees a client leave."""
    import waitress

    _, _, app = build(tmp_path)
    made: list = []
    create = waitress.create_server

    def creating(*args, **kwargs):
        server = create(*args, **kwargs)
        made.append(server)
        server.run = lambda: (_ for _ in ()).throw(KeyboardInterrupt)  # Ctrl-C at once: serve returns 0
        return server

    monkeypatch.setattr(waitress, "create_server", creating)
    Limits(monkeypatch, 4096, 4096)
    try:
        assert serve(app, "127.0.0.1", 0) == 0
        assert serve(app, "127.0.0.1", 0, threads=3, ident="hg-x",
                     limits=HttpLimits(connection_limit=50, idle_timeout=0.2)) == 0
        assert serve(app, "127.0.0.1", 0, limits=HttpLimits(idle_timeout=2.5)) == 0
    finally:
        for server in made:
            server.close()
            server.task_dispatcher.shutdown(timeout=1)
    settings = [(s.adj.threads, s.adj.ident, s.adj.connection_limit, s.adj.channel_timeout, s.adj.cleanup_interval,
                 s.adj.channel_request_lookahead, s.adj.asyncore_use_poll, s.effective_host) for s in made]
    assert settings == [(16, "hugginggpt", 1000, 60, 1, 1, True, "127.0.0.1"),
                        (3, "hg-x", 50, 1, 1, 1, True, "127.0.0.1"),
                        (16, "hugginggpt", 1000, 3, 1, 1, True, "127.0.0.1")]


def raw(port: int, data: bytes = b"", source: str = "127.0.0.1") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    if data:
        conn.sendall(data)
    return conn


def answer_of(conn: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            piece = conn.recv(65536)
        except ConnectionResetError:  # closed by the server; a timeout fails the test
            break
        if not piece:
            break
        got += piece
    return got


def test_serve_guards_a_real_waitress_server(tmp_path, monkeypatch, capsys, caplog):
    """Tokens and body limits refused on the headers, a client's share of connections, slow clients cut,
    the work of a client that left cancelled; the file limit (here 300 files) lowers the connection limit
    to 44, a quarter of it (11) per client."""
    import waitress

    client, engine, app = build(tmp_path, api_tokens=[TOKEN], max_body_bytes=1000)
    made: list = []
    create = waitress.create_server
    monkeypatch.setattr(waitress, "create_server", lambda *a, **kw: made.append(create(*a, **kw)) or made[-1])
    Limits(monkeypatch, 300, 300)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    limits = HttpLimits(header_timeout=1.0, read_timeout=30, idle_timeout=30)
    done: list[int] = []
    thread = threading.Thread(target=lambda: done.append(serve(app, "ignored", 1, threads=1, ident="hg-test",
                                                               limits=limits, sockets=[listening])), daemon=True)
    thread.start()
    try:
        wait_until(lambda: made, 5, "the server made")
        health = raw(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        answer = answer_of(health)
        assert answer.startswith(b"HTTP/1.1 200 ") and b"\r\nServer: hg-test\r\n" in answer

        # refused on the headers, before a byte of the body
        for headers, status in ((b"", b"401"), (b"Authorization: Bearer " + TOKEN.encode() + b"\r\n", b"413")):
            conn = raw(port, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000000000\r\n" + headers + b"\r\n")
            conn.settimeout(3)
            answer = conn.recv(65536)
            conn.close()
            assert answer.startswith(b"HTTP/1.1 " + status), answer

        # the work of a client that left is cancelled (waitress reads on while the request runs)
        cancelled = threading.Event()
        engine.script = lambda state, mode: {"cancelled": cancelled.set() or True} if state.cancelled.wait(5) else {}
        body = json.dumps(ASK).encode()
        conn = raw(port, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_until(lambda: engine.calls, 5, "the request running")
        waiting = raw(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        waiting.settimeout(0.3)
        with pytest.raises(TimeoutError):
            waiting.recv(100)  # one thread (threads=1), and it is busy
        conn.close()
        assert cancelled.wait(4), "the work of a client that left ran on"
        waiting.settimeout(4)
        assert answer_of(waiting).startswith(b"HTTP/1.1 200 ")

        # 11 connections per client; the 12th is turned away at once
        partial = raw(port, b"GET /health HTTP/1.1\r\nHost: local")
        held = [raw(port) for _ in range(10)]
        opened = time.monotonic()
        wait_until(lambda: len(made[0].active_channels) >= 11, 5, "the connections accepted")
        turned = raw(port)
        turned.settimeout(3)
        assert answer_of(turned) == TURNED_AWAY

        # 44 sockets in all (waitress counts its listener and its trigger too): then it accepts no more
        held += [raw(port, source=f"127.0.0.{n}") for n in (2, 3, 4) for _ in range(11 if n < 4 else 9)]
        wait_until(lambda: len(made[0].active_channels) >= 42, 5, "the connections accepted")
        late = raw(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", "127.0.0.5")
        late.settimeout(0.2)
        with pytest.raises(TimeoutError):
            late.recv(100)

        # a client that sends nothing, or headers too slowly, is cut at http_header_timeout
        for conn in [*held, partial]:
            conn.settimeout(max(0.1, opened + 5 - time.monotonic()))
            assert answer_of(conn) == b""
        late.settimeout(4)
        assert answer_of(late).startswith(b"HTTP/1.1 200 ")  # served once the slow ones were cut
    finally:
        for server in made:
            server.close()
            server.task_dispatcher.shutdown(timeout=1)
        thread.join(5)
    assert done == [0]
    assert capsys.readouterr().err.startswith("warning: http_connection_limit 1000 lowered to 44")
