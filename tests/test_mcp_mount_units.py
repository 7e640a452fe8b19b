"""The MCP door of the orchestrator (hugginggpt/mcp/mount.py) in-process: the app of `create_app` through Flask's
test client, with the real engine on the scripted LLM and the fake models server on loopback. tests/test_mcp.py
drives the same door with the SDK's client on a real server; these pin each answer, header, refusal, limit and
the bookkeeping of a call in flight (its key, its StreamWork, its watched connection), fast enough for the
mutation audit (docs/TESTING.md)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.config import load_config
from hugginggpt.mcp import mount as mount_module
from hugginggpt.mcp.mount import CALL_HEADER, McpEndpoint, wants_progress
from hugginggpt.server import create_app
from hugginggpt.streamwork import StreamWork
from tests.conftest import wait_until, write_config

TOKEN = "tok-mcp-mount"
VIT = "google/vit-base-patch16-224"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
CLASSIFY = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "run_model", "arguments": {
    "task": "image-classification", "model": VIT, "image": "/examples/red.png"}}}
TOOLS = {"hugginggpt", "plan", "run_model", "search_models"}
TAKES_POST = "/mcp takes POST (stateless streamable HTTP: no GET stream, no session to delete)"
NEEDS_TOKEN = "this server needs `Authorization: Bearer <token>` (one of its api_tokens)"
WRONG_TOKEN = "the bearer token is not one of this server's api_tokens"


# -- the parts -------------------------------------------------------------------------------------------------


@pytest.fixture
def make(tmp_path, llm, models, models_server, public_dir):
    """build(**config) -> (test client, engine, app): a fresh app (so a fresh MCP endpoint, started on its first
    POST) over the fake models server's public/ (its /examples/red.png) and the scripted LLM."""
    count = iter(range(100))

    def build(admission=None, **extra):
        folder = tmp_path / f"app{next(count)}"
        folder.mkdir()
        config = load_config(write_config(folder, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                                          **extra))
        engine = HuggingGPT(config, ranker=KeywordRanker())
        app = create_app(config, engine, admission=admission)
        return app.test_client(), engine, app

    return build


def inside(app) -> tuple[McpEndpoint, Any]:
    """The endpoint `mount` made and the DisconnectWatch it was given (what the /mcp view holds)."""
    held = inspect.getclosurevars(app.view_functions["mcp"]).nonlocals
    return held["endpoint"], held["disconnects"]


def mcp_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "mcp-http"]


def refusal(message: str, kind: str, status: int) -> dict:
    """The server's own refusal at /mcp, as the JSON-RPC error MCP clients show."""
    return {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message,
                                                    "data": {"type": kind, "status": status}}}


def events(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def with_token(call: dict, token: Any) -> dict:
    return {**call, "params": {**call["params"], "_meta": {"progressToken": token}}}


class Slots:
    """Admission slots that are all taken (a caller that would wait for one is a failure)."""

    def __init__(self):
        self.released = 0

    def acquire(self, blocking=True):
        if blocking is not False:
            raise AssertionError("the call would wait for a slot")
        return False

    def release(self):
        self.released += 1


# -- wants_progress: which answers are a stream ----------------------------------------------------------------


@pytest.mark.parametrize("body, streamed", [
    (json.dumps(with_token(CLASSIFY, "tok-1")), True),
    (json.dumps(with_token(CLASSIFY, 7)), True),
    (json.dumps(with_token(CLASSIFY, 0)), True),
    (json.dumps(with_token(CLASSIFY, "")), True),
    (json.dumps(with_token(CLASSIFY, True)), False),  # a bool is an int to Python, not a token to MCP
    (json.dumps(with_token(CLASSIFY, False)), False),
    (json.dumps(with_token(CLASSIFY, None)), False),
    (json.dumps(with_token(CLASSIFY, 1.5)), False),
    (json.dumps(with_token(CLASSIFY, [1])), False),
    (json.dumps(with_token(CLASSIFY, {"t": 1})), False),
    (json.dumps(CLASSIFY), False),
    (json.dumps({**CLASSIFY, "params": {**CLASSIFY["params"], "_meta": {}}}), False),
    (json.dumps({**CLASSIFY, "params": {**CLASSIFY["params"], "_meta": {"progresstoken": "t"}}}), False),
    (json.dumps({**CLASSIFY, "params": {**CLASSIFY["params"], "_meta": "progressToken"}}), False),
    (json.dumps({**CLASSIFY, "params": {**CLASSIFY["params"], "_meta": ["progressToken"]}}), False),
    (json.dumps({**CLASSIFY, "params": ["_meta"]}), False),
    (json.dumps({**CLASSIFY, "params": "_meta"}), False),
    (json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "_meta": {"progressToken": "t"}}), False),
    (json.dumps(with_token({**LIST, "params": {}}, "t")), False),  # only a tool call has progress to report
    (json.dumps(with_token({**CLASSIFY, "method": "Tools/Call"}, "t")), False),
    (json.dumps({**with_token(CLASSIFY, "t"), "method": None}), False),
    (json.dumps([with_token(CLASSIFY, "t")]), False),  # a batch: not one tool call
    ("[1, 2]", False),
    ('"tools/call"', False),
    ("null", False),
    ("{not json", False),  # the SDK answers it with its own error
    ("", False),
    ("[" * 100_000, False),  # RecursionError in the parser
    (b"\xff\xfe", False),
])
def test_only_a_tool_call_with_a_string_or_integer_progress_token_is_answered_as_a_stream(body, streamed):
    assert wants_progress(body if isinstance(body, bytes) else body.encode()) is streamed


# -- McpEndpoint.call_of: a tool call's work, found by the header mount puts in its request ---------------------


def context(headers: Any = None, request: Any = "default", fails: type[Exception] | None = None) -> Any:
    if fails is not None:
        class Broken:
            @property
            def request_context(self):
                raise fails("no request here")
        return Broken()
    if request == "default":
        request = SimpleNamespace(headers=headers if headers is not None else {})
    return SimpleNamespace(request_context=SimpleNamespace(request=request))


def test_call_of_finds_the_work_named_by_the_call_header_and_nothing_else():
    endpoint = McpEndpoint(engine=None)  # nothing started: only the registry is used
    work, blank = StreamWork("rid-a"), StreamWork("rid-blank")
    endpoint.calls.update({"k1": work, "": blank})
    assert endpoint.call_of(context({CALL_HEADER: "k1"})) is work
    assert endpoint.call_of(context({CALL_HEADER: "k2"})) is None  # a call that ended (or never was)
    assert endpoint.call_of(context({"X-Other": "k1"})) is None
    assert endpoint.call_of(context({CALL_HEADER: ""})) is None  # an empty header names no call
    assert endpoint.call_of(context({})) is None
    assert endpoint.call_of(context(request=None)) is None  # stdio-like: a context with no HTTP request
    assert endpoint.call_of(SimpleNamespace()) is None  # no request_context at all
    assert endpoint.call_of(context(fails=ValueError)) is None  # the SDK's "outside of a request"
    assert endpoint.call_of(context(fails=AttributeError)) is None
    with pytest.raises(KeyError):  # any other failure is not swallowed
        endpoint.call_of(context(fails=KeyError))


def test_a_new_endpoint_holds_its_engine_and_starts_nothing():
    engine = object()
    endpoint = McpEndpoint(engine)
    assert endpoint.engine is engine and endpoint.calls == {} and endpoint._wsgi is None


# -- methods -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_get_or_a_delete_is_a_405_that_says_mcp_takes_post_and_starts_nothing(make, method):
    client, _, app = make()
    before = len(mcp_threads())
    resp = client.open("/mcp", method=method, headers={**MCP_HEADERS, "X-Request-ID": "rid-405"})
    assert resp.status_code == 405
    assert resp.mimetype == "application/json"
    assert resp.get_json() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": TAKES_POST}}
    assert ("Allow", "POST") in resp.headers.to_wsgi_list()  # exactly this, as sent
    assert resp.headers["X-Request-ID"] == "rid-405"
    assert len(mcp_threads()) == before  # no event loop, no SSE stream held open for nothing
    endpoint, _ = inside(app)
    assert endpoint._wsgi is None and endpoint.calls == {}


def test_another_method_is_flask_s_405_as_a_json_rpc_error(make):
    client, _, app = make()
    resp = client.put("/mcp", json=LIST, headers=MCP_HEADERS)
    assert resp.status_code == 405
    assert resp.get_json() == refusal("The method is not allowed for the requested URL.", "invalid_request_error",
                                      405)
    [rule] = [r for r in app.url_map.iter_rules() if r.rule == "/mcp"]
    assert rule.endpoint == "mcp" and rule.methods == {"GET", "HEAD", "OPTIONS", "POST", "DELETE"}


# -- the SDK's app, started on first use --------------------------------------------------------------------------


def test_the_first_post_starts_one_event_loop_thread_and_the_next_reuse_it(make, caplog):
    client, _, app = make()
    sdk_log = logging.getLogger("mcp.server.streamable_http")
    kept = sdk_log.level
    sdk_log.setLevel(logging.NOTSET)
    before = set(mcp_threads())
    try:
        with caplog.at_level(logging.INFO, logger="hugginggpt.mcp.mount"):
            first = client.post("/mcp", json=LIST, headers={**MCP_HEADERS, "X-Request-ID": "rid-list"})
            started = [t for t in mcp_threads() if t not in before]
            second = client.post("/mcp", json={**LIST, "id": 2}, headers=MCP_HEADERS)
        assert sdk_log.level == logging.WARNING  # not a line per call
    finally:
        sdk_log.setLevel(kept)
    assert len(started) == 1 and started[0].daemon and started[0].is_alive()
    assert [t for t in mcp_threads() if t not in before] == started
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.mcp.mount"] == [
        "MCP over streamable HTTP at /mcp"]
    for resp, rid in ((first, 1), (second, 2)):
        assert resp.status_code == 200, resp.get_data(as_text=True)
        assert resp.mimetype == "application/json"
        body = resp.get_json()
        assert body["id"] == rid and body["jsonrpc"] == "2.0"
        assert {t["name"] for t in body["result"]["tools"]} == TOOLS
        resp.close()
    assert first.headers["X-Request-ID"] == "rid-list"
    assert first.headers["X-Content-Type-Options"] == "nosniff"
    endpoint, _ = inside(app)
    assert set(endpoint._wsgi) == {False, True} and endpoint.calls == {}


def test_a_tool_call_without_a_progress_token_is_json_and_with_one_a_stream(make, models):
    client, _, app = make()
    with client.post("/mcp", json=CLASSIFY, headers=MCP_HEADERS) as plain:
        assert plain.status_code == 200 and plain.mimetype == "application/json"
        assert "Content-Length" in plain.headers  # answered in one piece
        result = plain.get_json()["result"]
    assert plain.get_json()["id"] == 7
    assert not result["isError"], result
    assert result["structuredContent"]["inference result"]["predicted"][0]["label"] == "tabby cat"
    assert result["structuredContent"]["choose model result"]["id"] == VIT
    for token in ("p-1", 3):
        with client.post("/mcp", json=with_token({**CLASSIFY, "id": 8}, token), headers=MCP_HEADERS) as streamed:
            assert streamed.status_code == 200 and streamed.mimetype == "text/event-stream"
            sent = {name.lower() for name, _ in streamed.headers.to_wsgi_list()}
            # hop-by-hop headers are the server's to say (PEP 3333); a stream has no length
            assert not sent & {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                               "proxy-authenticate", "proxy-authorization", "content-length"}
            *notes, last = events(streamed.get_data(as_text=True))
        # a classifier has no steps: its start and its end are the notes, rising to 1.0 before the result
        assert [n["method"] for n in notes] == ["notifications/progress"] * len(notes) and notes
        assert notes[-1]["params"]["progress"] == 1.0 and notes[-1]["params"]["progressToken"] == token
        assert last["id"] == 8 and not last["result"]["isError"]
        assert last["result"]["structuredContent"]["inference result"] == result["structuredContent"][
            "inference result"]
    assert [c["model"] for c in models.calls] == [VIT, VIT, VIT]
    assert inside(app)[0].calls == {}


def test_the_body_reaches_the_sdk_whole_and_unchanged(make, models):
    """mount reads the body for its own look (wants_progress) and hands the same bytes on."""
    client, _, _ = make()
    raw = json.dumps(CLASSIFY, indent=2).encode() + b"\n"
    with client.post("/mcp", data=raw, content_type="application/json", headers=MCP_HEADERS) as resp:
        assert resp.status_code == 200 and resp.get_json()["id"] == 7
        assert not resp.get_json()["result"]["isError"]
    with client.post("/mcp", data=b"{not json", content_type="application/json", headers=MCP_HEADERS) as bad:
        assert bad.status_code == 400 and bad.mimetype == "application/json"  # the SDK's own parse error
        assert bad.get_json()["error"]["code"] == -32700


# -- a call in flight ----------------------------------------------------------------------------------------------


def test_a_call_in_flight_is_registered_under_a_key_only_the_server_sets_and_let_go_when_answered(make, models):
    client, _, app = make()
    endpoint, disconnects = inside(app)
    models.gates[VIT] = gate = threading.Event()
    opener = threading.Timer(8, gate.set)  # never a hang, whatever happens
    opener.start()
    got: list[Any] = []
    headers = {**MCP_HEADERS, "X-Request-ID": "rid-flight", CALL_HEADER: "forged-by-client"}
    caller = threading.Thread(target=lambda: got.append(client.post(
        "/mcp", json=CLASSIFY, headers=headers, environ_base={"waitress.client_disconnected": lambda: False})),
        daemon=True)
    try:
        caller.start()
        wait_until(lambda: VIT in models.arrivals, 10, "the model call")
        [(key, work)] = endpoint.calls.items()
        assert key != "forged-by-client" and len(key) == 32 and int(key, 16) >= 0  # the server's own uuid4 hex
        assert isinstance(work, StreamWork) and work.request_id == "rid-flight"
        assert work.state is not None and not work.state.cancelled.is_set()  # the tool found it (call_of)
        assert [w for _, w in disconnects._watched.values()] == [work]
    finally:
        gate.set()
        opener.cancel()
        caller.join(10)
    [resp] = got
    assert resp.status_code == 200 and not resp.get_json()["result"]["isError"]
    # the call is named and its connection watched until its answer has been sent (the response closed)
    assert endpoint.calls == {key: work}
    assert [w for _, w in disconnects._watched.values()] == [work]
    resp.close()
    assert endpoint.calls == {} and disconnects._watched == {}


def test_a_stream_keeps_its_call_registered_until_it_is_closed(make, models):
    client, _, app = make()
    endpoint, _ = inside(app)
    with client.post("/mcp", json=with_token(CLASSIFY, "p"), headers={**MCP_HEADERS, "X-Request-ID": "rid-sse"},
                     buffered=False) as resp:
        assert resp.mimetype == "text/event-stream"
        assert [w.request_id for w in endpoint.calls.values()] == ["rid-sse"]
        assert events(resp.get_data(as_text=True))[-1]["id"] == 7
    assert endpoint.calls == {}


def test_a_client_that_leaves_stops_its_tool_call(make, models, caplog):
    client, _, app = make()
    endpoint, disconnects = inside(app)
    models.gates[VIT] = gate = threading.Event()
    opener = threading.Timer(8, gate.set)  # the call would otherwise end only here, long after the client left
    opener.start()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
            resp = client.post("/mcp", json=CLASSIFY, headers={**MCP_HEADERS, "X-Request-ID": "rid-gone"},
                               environ_base={"waitress.client_disconnected": lambda: VIT in models.arrivals})
    finally:
        gate.set()
        opener.cancel()
    assert time.monotonic() - started < 5
    assert "[rid-gone] client went away; cancelling" in caplog.messages
    result = resp.get_json()["result"]
    assert result["isError"]
    assert result["content"][0]["text"].startswith(f"Error executing tool run_model: {VIT} (local) failed: ")
    assert models.calls == []  # the fake never got to answer
    resp.close()
    assert endpoint.calls == {} and disconnects._watched == {}


# -- the guards of the other routes hold at /mcp --------------------------------------------------------------------


def test_the_body_limit_takes_exactly_max_body_bytes_even_past_the_sdk_s_own_default(make):
    limit = 5 * 1024 * 1024  # past the SDK's 4 MiB: the server's limit is the one that holds
    client, _, app = make(max_body_bytes=limit)
    head = json.dumps({**LIST, "params": {"_meta": {"pad": ""}}})
    exact = json.dumps({**LIST, "params": {"_meta": {"pad": "x" * (limit - len(head))}}}).encode()
    assert len(exact) == limit
    with client.post("/mcp", data=exact, content_type="application/json", headers=MCP_HEADERS) as resp:
        assert resp.status_code == 200, resp.get_data(as_text=True)[:300]
        assert {t["name"] for t in resp.get_json()["result"]["tools"]} == TOOLS
    with client.post("/mcp", data=exact + b" ", content_type="application/json", headers=MCP_HEADERS) as resp:
        assert resp.status_code == 413
        assert resp.get_json() == refusal(f"request body is larger than {limit} bytes", "invalid_request_error", 413)
    assert inside(app)[0].calls == {}


def test_a_small_body_limit_holds_at_its_edge(make):
    client, _, _ = make(max_body_bytes=600)
    head = json.dumps({**LIST, "params": {"_meta": {"pad": ""}}})
    exact = json.dumps({**LIST, "params": {"_meta": {"pad": "x" * (600 - len(head))}}}).encode()
    with client.post("/mcp", data=exact, content_type="application/json", headers=MCP_HEADERS) as resp:
        assert resp.status_code == 200 and resp.get_json()["id"] == 1
    with client.post("/mcp", data=exact + b"\n", content_type="application/json", headers=MCP_HEADERS) as resp:
        assert resp.status_code == 413
        assert resp.get_json() == refusal("request body is larger than 600 bytes", "invalid_request_error", 413)


def test_without_tokens_host_and_origin_are_checked_by_the_server_and_not_again_by_the_sdk(make):
    client, _, app = make(allowed_hosts=["box.lan"])
    for host, origin in (("box.lan", None), ("box.lan:8004", "http://localhost:5173"), ("localhost", None),
                         ("127.0.0.1:8004", "http://127.0.0.1:8004")):
        headers = {**MCP_HEADERS, "Host": host, **({"Origin": origin} if origin else {})}
        with client.post("/mcp", json=LIST, headers=headers) as resp:
            assert resp.status_code == 200, (host, resp.get_data(as_text=True))
            assert {t["name"] for t in resp.get_json()["result"]["tools"]} == TOOLS
    resp = client.post("/mcp", json=LIST, headers={**MCP_HEADERS, "Host": "evil.example:8004"})
    assert resp.status_code == 403
    assert resp.get_json() == refusal("this server does not answer to the host name 'evil.example'; add it to "
                                      "allowed_hosts in its config (or set api_tokens)", "permission_error", 403)
    resp = client.post("/mcp", json=LIST, headers={**MCP_HEADERS, "Origin": "https://evil.example"})
    assert resp.status_code == 403
    assert resp.get_json() == refusal("requests from the web origin https://evil.example are not allowed; add it "
                                      "to cors_origins", "permission_error", 403)
    assert inside(app)[0].calls == {}


def test_with_tokens_only_a_right_bearer_token_is_let_through_from_any_host(make, models):
    client, _, app = make(api_tokens=[TOKEN])
    for headers, status, message, kind in (({}, 401, NEEDS_TOKEN, "authentication_error"),
                                           ({"Authorization": "Bearer nope"}, 403, WRONG_TOKEN, "permission_error")):
        resp = client.post("/mcp", json=CLASSIFY, headers={**MCP_HEADERS, **headers})
        assert resp.status_code == status
        assert resp.get_json() == refusal(message, kind, status)
        resp = client.get("/mcp", headers={**MCP_HEADERS, **headers})  # the guard comes before the method
        assert resp.status_code == status
    assert models.arrivals == []
    authorized = {**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"}
    for host in ("evil.example", "box.lan:9000"):  # with tokens any host name is answered (no DNS rebinding)
        with client.post("/mcp", json=CLASSIFY, headers={**authorized, "Host": host}) as resp:
            assert resp.status_code == 200, resp.get_data(as_text=True)
            assert not resp.get_json()["result"]["isError"]
    resp = client.get("/mcp", headers=authorized)
    assert resp.status_code == 405 and resp.get_json()["error"]["message"] == TAKES_POST


def test_admission_refuses_a_tool_call_past_max_concurrent_requests_and_lists_tools_anyway(make, models):
    slots = Slots()
    client, _, app = make(admission=slots, max_concurrent_requests=2)
    with client.post("/mcp", json=CLASSIFY, headers=MCP_HEADERS) as resp:
        assert resp.status_code == 200
        result = resp.get_json()["result"]
    assert result["isError"]
    assert result["content"][0]["text"] == ("Error executing tool run_model: the server is running 2 requests "
                                            "(max_concurrent_requests); retry shortly")
    with client.post("/mcp", json=LIST, headers=MCP_HEADERS) as resp:
        assert {t["name"] for t in resp.get_json()["result"]["tools"]} == TOOLS
    assert slots.released == 0 and models.arrivals == []
    assert inside(app)[0].calls == {}


def test_a_tool_call_gives_its_slot_back_when_it_ends_even_when_it_fails(make, models):
    slots = threading.BoundedSemaphore(1)
    client, _, _ = make(admission=slots)
    models.broken.add(VIT)
    with client.post("/mcp", json=CLASSIFY, headers=MCP_HEADERS) as resp:
        assert resp.get_json()["result"]["isError"]
    assert slots.acquire(blocking=False)  # free again
    slots.release()
    models.broken.clear()
    with client.post("/mcp", json=with_token(CLASSIFY, "p"), headers=MCP_HEADERS) as resp:
        assert not events(resp.get_data(as_text=True))[-1]["result"]["isError"]
    assert slots.acquire(blocking=False)
    slots.release()


# -- when the SDK's app cannot start ------------------------------------------------------------------------------


def test_an_app_that_fails_to_start_is_a_500_that_leaves_nothing_behind_and_is_tried_again(make, caplog):
    """The SDK refuses to build its app (here on a body limit of 0, which the config itself now refuses, so the
    engine's config is changed after the app was made): an empty POST is a 500 in JSON-RPC's shape, the call's
    registrations are given back, and the next request tries the start again."""
    client, engine, app = make()
    endpoint, disconnects = inside(app)
    good = engine.config
    engine.config = good.with_overrides(max_body_bytes=0)
    for _ in range(2):  # nothing half-started is kept: the next request tries again, and fails the same way
        with caplog.at_level(logging.ERROR):
            caplog.clear()
            resp = client.post("/mcp", data=b"", content_type="application/json", headers=MCP_HEADERS,
                               environ_base={"waitress.client_disconnected": lambda: False})
        assert resp.status_code == 500
        assert resp.get_json() == refusal("internal error (ValueError); see the server log", "server_error", 500)
        assert endpoint.calls == {} and disconnects._watched == {}  # given back on the error path too
        assert endpoint._wsgi is None
        [record] = [r for r in caplog.records if r.exc_info]
        assert "max_request_body_size must be a positive number of bytes" in str(record.exc_info[1])
    engine.config = good
    resp = client.post("/mcp", json=LIST, headers=MCP_HEADERS)
    assert resp.status_code == 200 and endpoint._wsgi is not None  # started on the next request


def test_a_failed_start_leaves_no_event_loop_thread_running(make):
    client, engine, _ = make()
    engine.config = engine.config.with_overrides(max_body_bytes=0)  # the SDK refuses it (the config does too)
    before = set(mcp_threads())
    for _ in range(3):
        resp = client.post("/mcp", data=b"", content_type="application/json", headers=MCP_HEADERS)
        assert resp.status_code == 500
    deadline = time.monotonic() + 1
    while [t for t in mcp_threads() if t not in before] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [t for t in mcp_threads() if t not in before] == []


def test_a_session_manager_that_does_not_start_in_time_is_given_up(make, monkeypatch, caplog):
    """The SDK's session manager never comes up (stands in for a stuck event loop): after START_TIMEOUT the
    request is a 500, the pending start is cancelled and nothing of the call is kept."""
    entered, cancelled = threading.Event(), threading.Event()

    @contextlib.asynccontextmanager
    async def never(self):
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        yield  # pragma: no cover - never reached

    monkeypatch.setattr(StreamableHTTPSessionManager, "run", never)
    monkeypatch.setattr(mount_module, "START_TIMEOUT", 0.3)  # a constant, not the code under test
    client, _, app = make()
    endpoint, disconnects = inside(app)
    got: list[Any] = []
    before = set(mcp_threads())
    started = time.monotonic()

    def ask() -> None:
        with caplog.at_level(logging.ERROR):
            got.append(client.post("/mcp", json=LIST, headers=MCP_HEADERS,
                                   environ_base={"waitress.client_disconnected": lambda: False}))

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(5)
    assert not asker.is_alive(), "the start was waited for past START_TIMEOUT"
    assert 0.25 < time.monotonic() - started < 3
    [resp] = got
    assert resp.status_code == 500
    assert resp.get_json() == refusal("internal error (RuntimeError); see the server log", "server_error", 500)
    [record] = [r for r in caplog.records if r.exc_info]
    assert isinstance(record.exc_info[1], RuntimeError)
    assert str(record.exc_info[1]) == "the MCP session manager did not start"
    assert entered.is_set()
    wait_until(cancelled.is_set, 3, "the start's cancellation")
    assert endpoint.calls == {} and disconnects._watched == {} and endpoint._wsgi is None
    wait_until(lambda: not [t for t in mcp_threads() if t not in before], 3, "the event loop's thread to end")

