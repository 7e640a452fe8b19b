"""checks.py in-process: the start-up and /health checks a person reads.

Covers port_problem and taken_port_line (a port in use, an address not on this machine, a port out of range, the
hint naming another port), llm_problem (openai-style and Azure: the URL asked, the key header, which statuses mean
a refused key, unreachable and slow backends, redacted endpoints), models_server_problem, CachedCheck's ttl and
print_start_checks's lines on stderr. Every HTTP check talks to a real Flask server on loopback, or to a bare socket
where the bytes sent on the wire matter; `_why`'s resolver wording is checked on the exceptions urllib3 raises."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import requests
from flask import Flask, Response, request
from urllib3 import HTTPConnectionPool
from urllib3.connection import HTTPConnection
from urllib3.exceptions import MaxRetryError, NameResolutionError, NewConnectionError, ProtocolError

from hugginggpt.checks import (
    CachedCheck,
    _why,
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


class Wire:
    """A loopback HTTP peer on a bare socket: keeps each request's head exactly as the bytes arrived (request line,
    header names as spelled) and answers `reply`, or hangs up without a word when `reply` is None."""

    def __init__(self, reply: bytes | None = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"):
        self.reply, self.heads = reply, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                self.heads.append(head.decode("latin-1"))
                if self.reply is not None:
                    conn.sendall(self.reply)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()


@pytest.fixture
def wire():
    peer = Wire()
    yield peer
    peer.close()


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


CAP_SYSCALLS = {"x86_64": (125, 126), "aarch64": (90, 91)}  # capget, capset
CAP_NET_BIND_SERVICE = 10


def as_unprivileged(fn):
    """fn()'s result as a person without the right to bind ports below 1024 sees it. Run as root, fn runs in a
    throwaway thread whose own capability set (Linux keeps one per thread) lacks CAP_NET_BIND_SERVICE."""
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            if int(f.read()) <= 80:
                pytest.skip("anyone may bind port 80 here")
    except OSError:
        pytest.skip("not Linux")
    if os.geteuid() != 0:
        return fn()
    if platform.machine() not in CAP_SYSCALLS:
        pytest.skip("no capset syscall number known for this machine")
    capget, capset = CAP_SYSCALLS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # two (effective, permitted, inheritable) triples
    out = {}

    def thread():
        if libc.syscall(capget, header, data):
            out["skip"] = "cannot read this thread's capabilities"
            return
        if data[0] & 1 << CAP_NET_BIND_SERVICE:  # a root without it (some containers) is unprivileged already
            data[0] &= ~(1 << CAP_NET_BIND_SERVICE)
            if libc.syscall(capset, header, data):
                out["skip"] = "cannot drop a capability"
                return
        out["value"] = fn()

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join()
    if "skip" in out:
        pytest.skip(out["skip"])
    return out["value"]


def test_a_port_below_1024_without_the_privilege_needs_more_privileges(monkeypatch):
    """`--port 80` run as a normal user: the kernel refuses with EACCES, said in words, with the usual hint."""
    monkeypatch.delenv("HUGGINGGPT_VIA", raising=False)
    assert as_unprivileged(lambda: port_problem("127.0.0.1", 80)) == "needs more privileges"
    assert as_unprivileged(lambda: taken_port_line("127.0.0.1", 80, "tools/start.py")) == (
        "error: port 80 needs more privileges (a demo or server already running there? open http://127.0.0.1:80/ "
        "or stop it); choose another with `python tools/start.py --port 9000`")


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


def lower_names(head: str) -> str:
    """A request head with its header names in lower case (HTTP reads them in any case), values as sent."""
    first, *lines = head.split("\r\n")
    named = []
    for line in lines:
        name, colon, value = line.partition(":")
        named.append(f"{name.lower()}{colon}{value}")
    return "\r\n".join([first, *named])


def test_the_key_header_and_path_go_on_the_wire_as_documented(wire):
    """What a gateway reads: OpenAI's `Authorization: Bearer` and Azure's `api-key` (header names in any case,
    as HTTP reads them), and an endpoint's own path (here ending in X) kept, its trailing slash not doubled."""
    assert llm_problem(openai(wire.url + "/SANDBOX/", "sk-wire")) is None
    head = wire.heads[-1]
    assert head.startswith("GET /SANDBOX/models HTTP/1.1\r\n") and "\r\nauthorization: Bearer sk-wire\r\n" in lower_names(head)
    azure = LLMSettings(api_type="azure", endpoint=wire.url + "/SANDBOX/", api_key="az-wire")
    assert llm_problem(azure) is None
    head = wire.heads[-1]
    assert head.startswith("GET /SANDBOX/openai/models?api-version=2024-06-01 HTTP/1.1\r\n")
    assert "\r\napi-key: az-wire\r\n" in lower_names(head) and "authorization" not in head.lower()


def test_an_endpoint_whose_path_holds_models_is_named_whole(http):
    """A router serving each model's API under /models/<name>/v1: the message names that endpoint, not its host."""
    http.replies["/models/llama/v1/models"] = (401, "{}", {})
    assert llm_problem(openai(http.url + "/models/llama/v1", "sk-test")) == \
        f"the LLM at {http.url}/models/llama/v1 refuses the configured key (HTTP 401)"
    assert [s["path"] for s in http.seen] == ["/models/llama/v1/models"]


def test_with_no_proxy_configured_the_environment_proxy_is_used(http, monkeypatch):
    """As the LLM client itself does: behind a proxy set in http_proxy, the check goes through it too (a backend
    only the proxy reaches is not called unreachable)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
                 "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", http.url)
    closed = free_port()
    assert llm_problem(openai(f"http://127.0.0.1:{closed}/v1", "sk-env")) is None
    assert http.seen[-1]["path"] == "/v1/models" and http.seen[-1]["headers"]["Host"] == f"127.0.0.1:{closed}"


def resolver_error(reason: Exception) -> requests.ConnectionError:
    """What requests raises when urllib3 gives up connecting to llm.invalid for `reason`."""
    return requests.ConnectionError(MaxRetryError(HTTPConnectionPool("llm.invalid", 80), "/v1/models", reason))


def test_why_says_a_host_name_does_not_resolve_in_each_resolver_wording():
    """glibc's "Name or service not known", a DNS server that does not answer ("Temporary failure in name
    resolution") and urllib3 1.x's wording without "resolve" all read as a name that does not resolve; a reset
    connection is only a failed one."""
    conn = HTTPConnection("llm.invalid", 80)
    unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    again = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    assert _why(resolver_error(NameResolutionError("llm.invalid", conn, unknown))) == "the host name does not resolve"
    assert _why(resolver_error(NameResolutionError("llm.invalid", conn, again))) == "the host name does not resolve"
    old = NewConnectionError(conn, "Failed to establish a new connection: [Errno -2] Name or service not known")
    assert _why(resolver_error(old)) == "the host name does not resolve"
    reset = ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer"))
    assert _why(resolver_error(reset)) == "connection failed"


def test_a_peer_that_hangs_up_without_answering_is_a_failed_connection():
    """Something listens but closes the connection unanswered (not an HTTP server, or one crashing)."""
    mute = Wire(reply=None)
    try:
        assert llm_problem(openai(mute.url)) == f"the LLM at {mute.url}/v1 is unreachable (connection failed)"
        assert models_server_problem(mute.url) == f"the models server at {mute.url} is down (connection failed)"
    finally:
        mute.close()


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


def test_models_server_wire_keeps_its_path_and_sends_the_token_as_bearer(wire):
    """A models server mounted under a path (here ending in X) behind a gateway: the URL configured with a trailing
    slash asks <path>/running once, not <path>//running, and the token goes as `Authorization: Bearer`."""
    wire.reply = b'HTTP/1.1 200 OK\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{"running": true}'
    assert models_server_problem(wire.url + "/ONNX/", "tok-wire") is None
    head = wire.heads[-1]
    assert head.startswith("GET /ONNX/running HTTP/1.1\r\n") and "\r\nauthorization: Bearer tok-wire\r\n" in lower_names(head)


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
