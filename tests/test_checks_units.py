"""checks.py in-process: the start-up and /health checks a person reads.

Covers port_problem and taken_port_line (a port in use, an address not on this machine, a port out of range, the
hint naming another port), llm_problem (openai-style and Azure: the URL asked, the key header, which statuses mean
a refused key, unreachable and slow backends, redacted endpoints), models_server_problem, CachedCheck's ttl and
print_start_checks's lines on stderr. Every HTTP check talks to a real Flask server on loopback."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest
from flask import Flask, Response, request

from hugginggpt.checks import (
    CachedCheck,
    llm_problem,
    models_server_problem,
    port_problem,
    print_start_checks,
    taken_port_line,
)
from hugginggpt.config import LLMSettings
from tests.fakes.llm_server import ThreadedServer

ABSENT = "192.0.2.1"  # TEST-NET-1: never an address of this machine


class Recorder:
    """A loopback server answering each path what the test sets (default 200 `{}`), recording each request."""

    def __init__(self):
        self.seen: list[dict] = []
        self.replies: dict[str, tuple[int, str, dict]] = {}
        self.delay = 0.0
        app = Flask("checks-recorder")

        @app.route("/", defaults={"path": ""})
        @app.route("/<path:path>")
        def anything(path):
            self.seen.append({"path": request.path, "query": request.query_string.decode(),
                              "headers": dict(request.headers)})
            time.sleep(self.delay)
            status, body, headers = self.replies.get(request.path, (200, "{}", {}))
            return Response(body, status=status, headers=headers, content_type="application/json")

        self.server = ThreadedServer(app).start()
        self.url = self.server.url


@pytest.fixture
def http():
    rec = Recorder()
    yield rec
    rec.server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_free_port_is_fine_and_a_listening_one_is_already_in_use():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert port_problem("127.0.0.1", port) == "is already in use"
    assert port_problem("127.0.0.1", port) is None


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_an_ipv6_host_is_bound_as_ipv6():
    with socket.socket(socket.AF_INET6) as held:
        held.bind(("::1", 0))
        held.listen(1)
        assert port_problem("::1", held.getsockname()[1]) == "is already in use"
    assert port_problem("::1", free_port()) is None


def test_foreign_addresses_bad_port_numbers_and_unknown_hosts_are_named():
    assert port_problem(ABSENT, 8004) == "is not an address of this machine"
    assert port_problem("127.0.0.1", 70000) == "is not a port number (1-65535)"
    unknown = port_problem("999.1.1.1", 8004)  # the reason is the resolver's own words
    assert unknown.startswith("cannot be used (") and unknown.endswith(")") and len(unknown) > 17


def test_taken_port_line_hints_the_command_typed_and_another_port(monkeypatch):
    monkeypatch.delenv("HUGGINGGPT_VIA", raising=False)
    assert taken_port_line("127.0.0.1", free_port(), "tools/demo.py") is None
    assert taken_port_line(ABSENT, 8004, "tools/demo.py") == (
        "error: port 8004 is not an address of this machine (a demo or server already running there? open "
        "http://127.0.0.1:8004/ or stop it); choose another with `python tools/demo.py --port 9000`")
    assert taken_port_line(ABSENT, 9000, "tools/start.py").endswith(
        "open http://127.0.0.1:9000/ or stop it); choose another with `python tools/start.py --port 9001`")
    monkeypatch.setenv("HUGGINGGPT_VIA", "make run")
    assert taken_port_line(ABSENT, 9000, "tools/start.py").endswith("choose another with `make run PORT=9001`")
    assert taken_port_line(ABSENT, 8004, "tools/start.py").endswith("choose another with `make run PORT=9000`")


def openai(endpoint, key=None):
    return LLMSettings(api_type="openai", endpoint=endpoint, api_key=key)


def test_openai_style_asks_models_with_a_bearer_key_and_only_401_403_refuse(http):
    for status in (200, 404, 500):
        http.replies["/v1/models"] = (status, "{}", {})
        assert llm_problem(openai(http.url, "sk-test")) is None
    assert http.seen[0]["path"] == "/v1/models" and http.seen[0]["query"] == ""
    assert http.seen[0]["headers"]["Authorization"] == "Bearer sk-test"
    for status in (401, 403):
        http.replies["/v1/models"] = (status, "{}", {})
        assert llm_problem(openai(http.url + "/v1/chat/completions", "sk-test")) == \
            f"the LLM at {http.url}/v1 refuses the configured key (HTTP {status})"
    assert [s["path"] for s in http.seen] == ["/v1/models"] * 5


def test_no_key_sends_no_header_and_the_message_hides_credentials_in_the_endpoint(http):
    http.replies["/v1/models"] = (401, "{}", {})
    host = http.url.removeprefix("http://")
    assert llm_problem(openai(f"http://me:hunter2@{host}/v1")) == \
        f"the LLM at http://***@{host}/v1 refuses the configured key (HTTP 401)"
    assert llm_problem(openai(http.url)) == f"the LLM at {http.url}/v1 refuses the configured key (HTTP 401)"
    assert "Authorization" not in http.seen[-1]["headers"]


def test_a_redirect_is_not_followed(http):
    http.replies["/v1/models"] = (302, "", {"Location": "/denied"})
    http.replies["/denied"] = (401, "{}", {})
    assert llm_problem(openai(http.url, "sk-test")) is None
    assert [s["path"] for s in http.seen] == ["/v1/models"]


def test_azure_asks_openai_models_with_the_api_version_and_an_api_key_header(http):
    azure = LLMSettings(api_type="azure", endpoint=http.url + "/", api_key="az-key")
    assert azure.azure_api_version == "2024-06-01"
    assert llm_problem(azure) is None
    seen = http.seen[-1]
    assert (seen["path"], seen["query"]) == ("/openai/models", "api-version=2024-06-01")
    assert seen["headers"]["Api-Key"] == "az-key" and "Authorization" not in seen["headers"]
    http.replies["/openai/models"] = (403, "{}", {})
    assert llm_problem(LLMSettings(api_type="azure", endpoint=http.url, azure_api_version="2025-01-01-preview")) \
        == f"the LLM at {http.url}/openai refuses the configured key (HTTP 403)"
    assert http.seen[-1]["query"] == "api-version=2025-01-01-preview"
    assert http.seen[-1]["headers"]["Api-Key"] == ""


def test_unreachable_slow_and_malformed_backends_are_named(http):
    port = free_port()
    assert llm_problem(openai(f"http://127.0.0.1:{port}")) == \
        f"the LLM at http://127.0.0.1:{port}/v1 is unreachable (connection refused: nothing listens there)"
    http.delay = 1.5
    assert llm_problem(openai(http.url), timeout=0.3) == f"the LLM at {http.url}/v1 is unreachable (no answer in time)"
    assert llm_problem(openai("http://127.0.0.1:99999")) == \
        "the LLM at http://127.0.0.1:99999/v1 is unreachable (InvalidURL)"


def test_the_proxy_is_used_and_openai_is_the_default_endpoint(http):
    assert llm_problem(openai("http://llm.invalid/v1", "sk-p"), proxy=http.url) is None
    assert http.seen[-1]["path"] == "/v1/models" and http.seen[-1]["headers"]["Host"] == "llm.invalid"
    assert llm_problem(openai(None), proxy=f"http://127.0.0.1:{free_port()}", timeout=1) == \
        "the LLM at https://api.openai.com/v1 is unreachable (connection refused: nothing listens there)"


def test_no_configured_backend_is_no_problem(http):
    assert llm_problem(LLMSettings(api_type=None, endpoint=http.url, api_key="k")) is None
    assert http.seen == []


def test_models_server_runs_only_when_it_says_running_true(http):
    http.replies["/running"] = (200, '{"running": true}', {})
    assert models_server_problem(http.url + "/", "tok-1") is None
    assert http.seen[-1]["path"] == "/running" and http.seen[-1]["headers"]["Authorization"] == "Bearer tok-1"
    assert models_server_problem(http.url) is None
    assert "Authorization" not in http.seen[-1]["headers"]
    for status, body in ((200, '{"running": false}'), (500, '{"running": true}'), (200, "<html>up</html>"),
                         (200, '["running"]')):
        http.replies["/running"] = (status, body, {})
        assert models_server_problem(http.url) == \
            f'the models server at {http.url} answered HTTP {status}, not {{"running": true}}'


def test_a_down_or_slow_models_server_is_down(http):
    port = free_port()
    assert models_server_problem(f"http://127.0.0.1:{port}") == \
        f"the models server at http://127.0.0.1:{port} is down (connection refused: nothing listens there)"
    http.delay = 1.5
    assert models_server_problem(http.url, timeout=0.3) == \
        f"the models server at {http.url} is down (no answer in time)"


def test_cached_check_runs_once_per_ttl():
    answers = iter(["down", None, "again"])
    calls = []

    def check():
        calls.append(1)
        return next(answers)

    assert CachedCheck(check).ttl == 10.0
    cached = CachedCheck(check, ttl=0.3)
    assert cached() == "down" and cached() == "down" and len(calls) == 1
    time.sleep(0.35)
    assert cached() is None and len(calls) == 2
    assert CachedCheck(check, ttl=0)() == "again" and len(calls) == 3


class StandIn:
    def __init__(self, problems):
        self.problems, self.asked = problems, []
        self.config = SimpleNamespace(llm=LLMSettings(api_type="openai", endpoint="http://llm.test/v1", api_key="k"),
                                      models_server_url="http://models.test:8005")

    def checks(self, fresh=False):
        self.asked.append(fresh)
        return self.problems


def test_print_start_checks_says_what_answers_and_warns_about_the_rest(capsys):
    engine = StandIn({"llm": None, "models_server": "unused"})
    print_start_checks(engine)
    out = capsys.readouterr()
    assert out.out == "" and engine.asked == [True]
    assert out.err == "check: the LLM (openai at http://llm.test/v1, model gpt-4o-mini, with an API key) answers\n"
    print_start_checks(StandIn({"llm": "the LLM at http://llm.test/v1 is unreachable (connection failed)",
                                "models_server": None}))
    assert capsys.readouterr().err == (
        "warning: the LLM at http://llm.test/v1 is unreachable (connection failed); requests that need it fail "
        "until it is up\ncheck: the models server at http://models.test:8005 answers\n")
