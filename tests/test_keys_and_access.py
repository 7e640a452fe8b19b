"""Keys stay home, tokens guard the API, browsers from other origins are refused, deadlines hold."""

from __future__ import annotations

import json
import re
import time

import pytest
import requests
import yaml

from tests.conftest import ROOT, start_server, stop_server, write_config
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer

HOME_KEY = "sk-home-key-0123456789abcdef"


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def plan(*tasks) -> str:
    return json.dumps([{"task": t, "id": i, "dep": d, "args": a} for i, (t, d, a) in enumerate(tasks)])


@pytest.fixture
def other_llm():
    other = ScriptedLLM()
    srv = ThreadedServer(other.app()).start()
    other.base_url = srv.url
    yield other
    srv.stop()


def openai_config(tmp_path, llm, models_url, public_dir, **extra):
    """An `openai` backend whose base_url is the scripted LLM, with a real-looking key."""
    extra.setdefault("url_allowlist", ["127.0.0.1"])  # the other scripted LLM a request names is on loopback
    path = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False, **extra)
    data = yaml.safe_load(path.read_text())
    data.pop("local"), data.pop("dev")
    data["openai"] = {"api_key": HOME_KEY, "base_url": llm.base_url + "/v1"}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def home(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    srv = start_server(openai_config(tmp_path, llm, models_url, public_dir), tmp_path)
    yield srv
    stop_server(srv)


def auth_of(record: dict) -> str:
    return {k.lower(): v for k, v in record["headers"].items()}.get("authorization", "")


def test_health_names_no_key(home):
    health = requests.get(home.url + "/health", timeout=5)
    assert health.status_code == 200 and health.json()["llm"]["api_key"] == "set"
    assert HOME_KEY not in health.text and HOME_KEY[:12] not in health.text


def test_the_configured_key_goes_only_to_the_configured_endpoint(home, llm, other_llm):
    other_llm.on("parse_task", plan(("text-to-image", [-1], {"text": "elsewhere"})))
    tasks = home.post("/tasks", ask("draw", api_endpoint=other_llm.base_url + "/v1")).json()
    assert tasks[0]["args"]["text"] == "elsewhere"  # keyless: a client's own local LLM works
    assert HOME_KEY not in auth_of(other_llm.requests[-1])
    # with its own key, the request's key is what the other endpoint sees
    home.post("/tasks", ask("draw", api_endpoint=other_llm.base_url + "/v1", api_key="k-own-123"))
    assert auth_of(other_llm.requests[-1]) == "Bearer k-own-123"
    # naming the configured endpoint (in another spelling) keeps the configured key
    home.post("/tasks", ask("draw", api_endpoint=llm.base_url + "/v1/chat/completions"))
    assert auth_of(llm.requests[-1]) == f"Bearer {HOME_KEY}"
    assert all(HOME_KEY not in json.dumps(r["headers"]) for r in other_llm.requests)


def test_the_azure_key_stays_home_too(tmp_path, llm, other_llm, models_server, public_dir):
    _, models_url = models_server
    path = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                        url_allowlist=["127.0.0.1"])
    data = yaml.safe_load(path.read_text())
    data.pop("local"), data.pop("dev")
    data["azure"] = {"api_key": HOME_KEY, "base_url": llm.base_url, "deployment_name": "gpt", "api_version": "2024-06-01"}
    path.write_text(yaml.safe_dump(data))
    srv = start_server(path, tmp_path)
    try:
        srv.post("/tasks", ask("hi"))
        assert {k.lower(): v for k, v in llm.requests[-1]["headers"].items()}["api-key"] == HOME_KEY
        srv.post("/tasks", ask("hi", api_type="azure", api_endpoint=other_llm.base_url))
        assert other_llm.requests, "the request's own Azure endpoint was not used"
        assert HOME_KEY not in json.dumps(other_llm.requests[-1]["headers"])
    finally:
        stop_server(srv)


def test_request_endpoints_can_be_turned_off(tmp_path, llm, other_llm, models_server, public_dir):
    _, models_url = models_server
    srv = start_server(openai_config(tmp_path, llm, models_url, public_dir, allow_request_endpoints=False), tmp_path)
    try:
        resp = srv.post("/tasks", ask("hi", api_endpoint=other_llm.base_url + "/v1", api_key="k"))
        assert resp.status_code == 403 and "allow_request_endpoints" in resp.json()["error"]["message"]
        assert other_llm.requests == []
        assert srv.post("/tasks", ask("hi")).status_code == 200  # the configured endpoint still works
    finally:
        stop_server(srv)


def test_error_bodies_of_a_request_endpoint_are_not_echoed(home, llm, other_llm):
    other_llm.failure_body = "internal-admin-page: root password hunter2"
    other_llm.fail(404)
    resp = home.post("/tasks", ask("hi", api_endpoint=other_llm.base_url + "/v1"))
    assert resp.status_code == 502
    message = resp.json()["error"]["message"]
    assert "HTTP 404" in message and "hunter2" not in resp.text
    # the configured endpoint's errors stay informative
    llm.failure_body = "model gpt-x does not exist"
    llm.fail(404)
    assert "does not exist" in home.post("/tasks", ask("hi")).json()["error"]["message"]


def test_api_tokens_guard_every_api_route(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          api_tokens=["tok-alpha-1"])
    srv = start_server(config, tmp_path, env={"HUGGINGGPT_API_TOKENS": "tok-beta-2, tok-gamma-3"})
    try:
        for route in ("/hugginggpt", "/tasks", "/results"):
            missing = srv.post(route, ask("hi"))
            assert missing.status_code == 401 and "Bearer" in missing.json()["error"]["message"]
            wrong = srv.post(route, ask("hi"), headers={"Authorization": "Bearer tok-alpha-2"})
            assert wrong.status_code == 403 and "error" in wrong.json()
        upload = requests.post(srv.url + "/upload", files={"file": ("a.png", b"\x89PNG")}, timeout=5)
        assert upload.status_code == 401
        # routes without a body (answered by the app, not refused on the headers) too
        for route in ("/metrics", "/models/search?task=image-to-text", "/v1/models"):
            got = requests.get(srv.url + route, timeout=5)
            assert got.status_code == 401 and "Bearer" in got.json()["error"]["message"], route
        assert llm.requests == []  # nothing ran
        ok = srv.post("/tasks", ask("hi"), headers={"Authorization": "Bearer tok-alpha-1"})
        assert ok.status_code == 200
        health = requests.get(srv.url + "/health", timeout=5)
        assert health.status_code == 200 and health.json()["auth"] == "token"
        assert "tok-" not in health.text and "endpoint" not in health.json()["llm"]
    finally:
        stop_server(srv)
    # the environment variable alone also turns tokens on
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False),
                       tmp_path, env={"HUGGINGGPT_API_TOKENS": "tok-beta-2, tok-gamma-3"})
    try:
        assert srv.post("/tasks", ask("hi")).status_code == 401
        assert srv.post("/tasks", ask("hi"), headers={"Authorization": "Bearer tok-gamma-3"}).status_code == 200
    finally:
        stop_server(srv)


def test_each_of_several_api_tokens_works_and_nothing_near_them_does(tmp_path, llm, models, models_server, public_dir):
    """Every token in the list is accepted (not only the last), compared whole; the scheme is Bearer only."""
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          api_tokens=["tok-beta-2", "tok-gamma-3"])
    srv = start_server(config, tmp_path)
    try:
        for header in ("Bearer tok-beta-2", "Bearer tok-gamma-3", "bearer tok-beta-2", "Bearer  tok-gamma-3 "):
            assert srv.post("/tasks", ask("hi"), headers={"Authorization": header}).status_code == 200, header
        for near in ("tok-beta", "tok-beta-22", "tok-gamma-", "TOK-BETA-2", "tok-beta-2tok-gamma-3", "tok-beta-2,",
                     "tok-gamma-3 tok-beta-2"):
            resp = srv.post("/tasks", ask("hi"), headers={"Authorization": f"Bearer {near}"})
            assert resp.status_code == 403, near
        for header in ("Basic tok-beta-2", "tok-beta-2", "Bearer", "Bearer   "):
            assert srv.post("/tasks", ask("hi"), headers={"Authorization": header}).status_code == 401, header
        assert len(llm.stage_requests("parse_task")) == 4  # only the accepted requests reached the planner
    finally:
        stop_server(srv)


def test_a_foreign_web_page_cannot_drive_the_server(server, llm):
    """Simple (preflight-free) requests are refused, and a foreign Origin is refused before anything runs."""
    llm.on("parse_task", "[]")
    as_text = requests.post(server.url + "/tasks", data=json.dumps(ask("hi")),
                            headers={"Content-Type": "text/plain"}, timeout=5)
    assert as_text.status_code == 415 and "application/json" in as_text.json()["error"]["message"]
    form = requests.post(server.url + "/tasks", data={"messages": "hi"}, timeout=5)
    assert form.status_code == 415
    foreign = server.post("/tasks", ask("hi"), headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "cors_origins" in foreign.json()["error"]["message"]
    upload = requests.post(server.url + "/upload", files={"file": ("a.png", b"x")},
                           headers={"Origin": "https://evil.example"}, timeout=5)
    assert upload.status_code == 403
    assert llm.requests == []
    preflight = requests.options(server.url + "/tasks", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"}, timeout=5)
    assert "Access-Control-Allow-Origin" not in preflight.headers
    local = requests.options(server.url + "/tasks", headers={
        "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"}, timeout=5)
    assert local.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
    assert "authorization" in local.headers["Access-Control-Allow-Headers"].lower()
    # same origin (the web app itself) and a listed local origin run
    assert server.post("/tasks", ask("hi"), headers={"Origin": server.url}).status_code == 200
    assert server.post("/tasks", ask("hi"), headers={"Origin": "http://localhost:5173"}).status_code == 200


def test_cors_origins_in_the_config(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          cors_origins=["https://app.example.org"])
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", "[]")
        ok = srv.post("/tasks", ask("hi"), headers={"Origin": "https://app.example.org"})
        assert ok.status_code == 200 and ok.headers["Access-Control-Allow-Origin"] == "https://app.example.org"
        for near in ("https://app.example.org.evil.example", "http://localhost:5173"):
            assert srv.post("/tasks", ask("hi"), headers={"Origin": near}).status_code == 403
        assert srv.post("/tasks", ask("hi"), headers={"Origin": srv.url}).status_code == 200  # the web app itself
    finally:
        stop_server(srv)


def test_request_timeout_bounds_a_silent_llm(tmp_path, llm, models, models_server, public_dir):
    """llm_timeout 120 s with retries, request_timeout 3 s: the client gets a 504 JSON in about 3 s."""
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          request_timeout=3, llm_timeout=120, llm_max_retries=3)
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", "[]", delay=30)
        started = time.monotonic()
        resp = srv.post("/hugginggpt", ask("hi"), timeout=60)
        took = time.monotonic() - started
        assert resp.status_code == 504 and "deadline" in resp.json()["error"]["message"]
        assert took < 6, took
    finally:
        stop_server(srv)


def test_a_late_answer_still_reports_what_finished(tmp_path, llm, models, models_server, public_dir):
    """The tasks finished but the answer-writing LLM is too slow: the reply lists the results itself."""
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False, request_timeout=3)
    srv = start_server(config, tmp_path)
    try:
        models.broken.add("Salesforce/blip-image-captioning-large")
        models.broken.add("nlpconnect/vit-gpt2-image-captioning")
        llm.on("parse_task", plan(("token-classification", [-1], {"text": "Anna lives in Paris"}),
                                  ("text-to-image", [-1], {"text": "a fox"}),
                                  ("image-to-text", [-1], {"image": "/examples/red.png"})))
        llm.on("response_results", "too late", delay=30)
        started = time.monotonic()
        resp = srv.post("/hugginggpt", ask("tag it and draw a fox"), timeout=60)
        assert time.monotonic() - started < 6
        assert resp.status_code == 200
        message = resp.json()["message"]
        assert "deadline" in message and "token-classification" in message and "dslim/bert-base-NER" in message
        # the file a finished task made is named in the answer, so it is not lost
        made = re.search(r"generated image (/images/[\w.-]+\.png)", message)
        assert made and (public_dir / made.group(1).lstrip("/")).is_file(), message
        assert "- task 2 (image-to-text" in message and "failed: every candidate failed" in message  # failures too
    finally:
        stop_server(srv)


def test_an_llm_answering_html_is_a_502(server, llm):
    llm.raw_reply = "<html>welcome to the router admin page</html>"
    resp = server.post("/tasks", ask("hi"))
    assert resp.status_code == 502 and "not an OpenAI-style completion" in resp.json()["error"]["message"]
    llm.raw_reply = None


def test_the_models_server_needs_its_token(tmp_path):
    """models_server_token guards every route of the models server, its output files included."""
    import subprocess
    import sys

    from tests.conftest import free_port, make_public

    public = make_public(tmp_path / "public")
    (public / "images").mkdir()
    (public / "images" / "made.png").write_bytes((public / "examples" / "red.png").read_bytes())
    port = free_port()
    config = tmp_path / "models.yaml"
    config.write_text(f"root: {ROOT}\npublic_dir: {public}\nlocal_models_dir: {tmp_path / 'none'}\n"
                      f"local_deployment: minimal\nmodels_server_token: mst-secret-1\n"
                      f"local_inference_endpoint: {{host: 127.0.0.1, port: {port}}}\n")
    proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                requests.get(url + "/running", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        good = {"Authorization": "Bearer mst-secret-1"}
        for path in ("/running", "/status/canny-control", "/models", "/images/made.png"):
            assert requests.get(url + path, timeout=5).status_code == 401
            assert requests.get(url + path, headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
            assert requests.get(url + path, headers=good, timeout=5).status_code == 200
        assert requests.post(url + "/models/canny-control", json={"img_url": "/examples/red.png"},
                             timeout=30).status_code == 401
    finally:
        proc.terminate()
        proc.wait(10)


AZURE_KEY = "3f9a7c1e5b2d4a6f8e0c9b7a5d3e1f2a"  # an Azure key: 32 hex digits, nothing like sk-...


@pytest.mark.parametrize("backend", ["azure", "local"])
def test_an_llm_error_that_quotes_a_key_not_shaped_like_sk_never_reaches_the_client(
        backend, tmp_path, llm, models, models_server, public_dir):
    """OpenAI-style 401 bodies quote the key they were given. Azure's and local servers' keys look nothing
    like `sk-...`, so redacting by shape is not enough: the configured key itself is taken out."""
    _, models_url = models_server
    path = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False, llm_max_retries=0)
    data = yaml.safe_load(path.read_text())
    data.pop("local"), data.pop("dev")
    if backend == "azure":
        data["azure"] = {"api_key": AZURE_KEY, "base_url": llm.base_url, "deployment_name": "gpt-4o",
                         "api_version": "2024-06-01"}
    else:
        data["local"] = {"endpoint": llm.base_url + "/v1", "api_key": AZURE_KEY}
    path.write_text(yaml.safe_dump(data))
    srv = start_server(path, tmp_path)
    try:
        llm.failure_body = "Incorrect API key provided: {key}. Check the key of your resource."
        llm.fail(401)
        resp = srv.post("/tasks", ask("hi"))
        assert resp.status_code == 502
        message = resp.json()["error"]["message"]
        assert "Incorrect API key provided" in message  # the error stays informative
        assert AZURE_KEY not in resp.text and AZURE_KEY[:16] not in resp.text
        assert llm.failures == []  # the LLM was asked, and answered 401 quoting the key
        # a key the request brings for the configured endpoint is taken out the same way
        own = "user-own-key-5e1d0c9b8a7f6e5d"
        llm.fail(401)
        resp = srv.post("/tasks", ask("hi", api_key=own))
        assert resp.status_code == 502 and "Incorrect API key provided" in resp.json()["error"]["message"]
        assert own not in resp.text and llm.failures == []
        assert AZURE_KEY not in srv.logs() and own not in srv.logs()
        # a key of another shape that an error quotes (OpenAI's project and service-account keys: dashes and
        # underscores after sk-) is taken out whole
        llm.failure_body = "The key sk-svcacct-Ab_cD-ef1234567890 was revoked by your organization."
        llm.fail(401)
        resp = srv.post("/tasks", ask("hi"))
        assert resp.status_code == 502 and "The key sk-*** was revoked" in resp.json()["error"]["message"]
        assert "Ab_cD" not in resp.text and "Ab_cD" not in srv.logs()
    finally:
        stop_server(srv)
