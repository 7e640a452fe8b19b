"""A request's own api_endpoint passes the URL policy; malformed endpoints and keys get a 400 with a reason."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.config import load_config
from hugginggpt.server import create_app
from hugginggpt.urlpolicy import UrlPolicy
from tests.conftest import free_port, start_server, stop_server, write_config
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


@pytest.fixture(scope="module")
def strict(tmp_path_factory, llm_server, models_server, public_dir):
    """No url_allowlist: loopback endpoints named by a request are refused."""
    folder = tmp_path_factory.mktemp("strict")
    _, models_url = models_server
    srv = start_server(write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                                    llm_max_retries=0), folder)
    yield srv
    stop_server(srv)


def test_a_loopback_endpoint_is_refused_and_open_ports_look_like_closed_ones(strict, llm):
    with socket.socket() as listener:  # an open port that is not an LLM
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        answers = {}
        for name, url in {"llm": llm.base_url.replace("127.0.0.1", "localhost") + "/v1", "open": f"http://127.0.0.1:{open_port}/v1",
                          "closed": f"http://127.0.0.1:{free_port()}/v1", "private": "http://10.1.2.3:8080/v1",
                          "metadata": "http://169.254.169.254/v1", "mapped": "http://[::ffff:127.0.0.1]:1/v1"}.items():
            resp = strict.post("/tasks", ask("hi", api_endpoint=url, api_key="k-own"))
            answers[name] = (resp.status_code, resp.json()["error"]["message"])
    assert llm.requests == [], "a refused endpoint was called"
    assert len(set(answers.values())) == 1, answers
    status, message = answers["llm"]
    assert status == 502 and "url_allowlist" in message
    assert strict.post("/tasks", ask("hi")).status_code == 200  # the configured endpoint stays trusted


def test_an_allowlisted_endpoint_is_used(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                    url_allowlist=["localhost"]), tmp_path)
    try:
        other = llm.base_url.replace("127.0.0.1", "localhost") + "/v1/chat/completions"
        resp = srv.post("/tasks", ask("hi", api_endpoint=other, api_key="k-own"))
        assert resp.status_code == 200, resp.text
        assert {k.lower(): v for k, v in llm.requests[-1]["headers"].items()}["authorization"] == "Bearer k-own"
    finally:
        stop_server(srv)


@pytest.mark.parametrize("endpoint", ["http://[::1/v1", "http://" + "a" * 1_000_000 + ".example/v1", "http://",
                                      "http://example.com:99999/v1", "http://a b/v1", "http://exa\u00e9mple.com/v1",
                                      "http://u:p@example.com/v1", 42, "ftp://example.com/v1"])
def test_malformed_endpoints_get_a_400_with_a_reason(strict, llm, endpoint):
    resp = strict.post("/tasks", ask("hi", api_endpoint=endpoint, api_key="k-own"))
    assert resp.status_code == 400, resp.text[:300]
    message = resp.json()["error"]["message"]
    assert "api_endpoint" in message and "\n" not in message and len(message) < 300
    assert llm.requests == []


@pytest.mark.parametrize("key", ["\u201csk-abc123\u201d", "sk-abc\u00e9123", "sk-abc 123", "sk-abc\n123"])
def test_a_key_a_header_cannot_carry_gets_a_400(strict, llm, key):
    resp = strict.post("/tasks", ask("hi", api_key=key))
    assert resp.status_code == 400, resp.text[:300]
    assert "HTTP header" in resp.json()["error"]["message"]
    assert llm.requests == []


def test_the_request_endpoint_is_connected_at_the_address_that_was_checked(tmp_path, llm, models_server, public_dir):
    """DNS rebinding: `localhost` first resolves to 127.0.0.2 (allowlisted), afterwards to 127.0.0.1 (an internal
    service on the same port, not allowlisted). The server resolves once, through its URL policy's resolver,
    and the LLM client connects to that very address; a second lookup (the HTTP stack's own) would reach
    127.0.0.1."""
    port = free_port()
    checked, internal = ScriptedLLM(), ScriptedLLM()
    checked_srv = ThreadedServer(checked.app(), port=port, host="127.0.0.2").start()
    internal_srv = ThreadedServer(internal.app(), port=port, host="127.0.0.1").start()
    lookups: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.2"] if len(lookups) == 1 else ["127.0.0.1"]

    config = load_config(write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                                      llm_max_retries=0, url_allowlist=["127.0.0.2/32"]))
    engine = HuggingGPT(config, ranker=KeywordRanker(),
                        url_policy=UrlPolicy.from_entries(config.url_allowlist, resolver=rebinding))
    srv = ThreadedServer(create_app(config, engine)).start()
    try:
        checked.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]))
        resp = requests.post(srv.url + "/tasks", json=ask("draw a fox", api_endpoint=f"http://localhost:{port}/v1",
                                                         api_key="k-own"), timeout=20)
    finally:
        srv.stop()
        checked_srv.stop()
        internal_srv.stop()
    assert internal.requests == [], "the client looked the name up again and reached the rebound address"
    assert resp.status_code == 200, resp.text
    assert resp.json()[0]["task"] == "text-to-image"
    assert lookups == ["localhost"]  # one lookup, by the policy
    headers = {k.lower(): v for k, v in checked.requests[-1]["headers"].items()}
    assert headers["host"] == f"localhost:{port}" and headers["authorization"] == "Bearer k-own"


def test_jarvis_s_web_client_empty_override_fields_mean_the_config_s_settings(strict, llm):
    """JARVIS's own page sends "" for api_key, api_type and api_endpoint when its user set none: such a request is
    answered with the config's LLM, as JARVIS answers it, neither refused nor sent with an empty key."""
    llm.on("parse_task", "[]")
    llm.on("chitchat", "hello from the config's LLM")
    plain = strict.post("/hugginggpt", ask("hi"))
    sent_plain = {k.lower(): v for k, v in llm.requests[-1]["headers"].items()}
    empty = strict.post("/hugginggpt", ask("hi", api_key="", api_type="", api_endpoint=""))
    sent_empty = {k.lower(): v for k, v in llm.requests[-1]["headers"].items()}
    assert plain.status_code == empty.status_code == 200, empty.text
    assert empty.json()["message"] == plain.json()["message"]
    assert sent_empty.get("authorization") == sent_plain.get("authorization")
    assert sent_empty.get("authorization") not in ("Bearer ", "Bearer")
    assert llm.requests[-1]["path"].startswith("/v1/chat/completions")  # the configured endpoint
