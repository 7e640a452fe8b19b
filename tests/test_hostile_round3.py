"""Hostile clients, round 3 (issue 29): streams left early must stop their work, every door draws from one
admission, and a server without a token answers only its own host names (DNS rebinding).

The LLM here is a real TCP peer on loopback that answers its model list (so start checks pass) and reads
completion requests without ever answering them: what a stuck vLLM or a dead upstream looks like. It counts
the connections the orchestrator holds open to it, which is what a user's LLM bill and file descriptors see.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import start_server, stop_server, write_config


class SilentLLM:
    """Answers `GET .../models`; holds every other request open without a byte of answer."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.lock = threading.Lock()
        self.open = 0  # completion requests whose connection the orchestrator still holds
        self.peak = 0
        self.requests = 0
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        counted = False
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    return
                head += data
            if head.startswith(b"GET "):
                body = b'{"object": "list", "data": [{"id": "scripted", "object": "model"}]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                return
            with self.lock:
                self.open += 1
                self.requests += 1
                self.peak = max(self.peak, self.open)
                counted = True
            while conn.recv(65536):  # never answer; wait for the orchestrator to hang up
                pass
        except OSError:
            pass
        finally:
            if counted:
                with self.lock:
                    self.open -= 1
            conn.close()

    def reset(self) -> None:
        with self.lock:
            self.peak = self.open
            self.requests = 0

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()


@pytest.fixture(scope="module")
def silent_llm() -> Iterator[SilentLLM]:
    llm = SilentLLM()
    yield llm
    llm.stop()


@pytest.fixture(scope="module")
def held_server(tmp_path_factory, silent_llm, models_server, public_dir):
    """max_concurrent_requests 2, the silent LLM, a long deadline: only a cancel can stop a request here."""
    folder = tmp_path_factory.mktemp("round3")
    _, models_url = models_server
    config = write_config(folder, silent_llm.url, models_url, public_dir, semantic_ranking=False,
                          max_concurrent_requests=2, request_timeout=120, llm_timeout=60, llm_max_retries=2)
    running = start_server(config, folder)
    yield running
    stop_server(running)


def in_flight(url: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    found = re.search(r"^hugginggpt_requests_in_flight(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    assert found, text[:500]
    return float(found.group(1))


STREAMS = {
    "/hugginggpt": {"messages": [{"role": "user", "content": "draw a fox"}], "stream": True},
    "/v1/chat/completions": {"model": "hugginggpt", "messages": [{"role": "user", "content": "draw a fox"}],
                             "stream": True},
}


def open_stream(url: str, path: str) -> tuple[int, socket.socket]:
    """POST a streamed request; (HTTP status, the socket after the first bytes of the answer)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(STREAMS[path]).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    head = b""
    while b"\r\n" not in head:
        got = sock.recv(1)
        if not got:
            break
        head += got
    return int(head.split()[1]), sock


def wait_for(what: str, check, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("path", list(STREAMS))
def test_a_stream_client_that_leaves_stops_its_work(held_server, silent_llm, path):
    """Issue 29.1: each client reads one byte and hangs up; its LLM call is closed and its slot comes back."""
    wait_for("the LLM is still held from before", lambda: silent_llm.open == 0)
    for _ in range(4):
        status, sock = open_stream(held_server.url, path)
        assert status == 200
        wait_for("the request never reached the LLM", lambda: silent_llm.open == 1)
        sock.close()
        wait_for("the LLM call of a request whose client left was not closed", lambda: silent_llm.open == 0, 8)
        wait_for("the request still runs after its client left", lambda: in_flight(held_server.url) == 0, 8)
    assert "client went away" in held_server.logs()


@pytest.mark.parametrize("path", list(STREAMS))
def test_a_client_that_leaves_a_request_answered_in_one_piece_stops_its_work_too(held_server, silent_llm, path):
    wait_for("the LLM is still held from before", lambda: silent_llm.open == 0)
    host, port = held_server.url.removeprefix("http://").split(":")
    body = json.dumps({**STREAMS[path], "stream": False}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for("the request never reached the LLM", lambda: silent_llm.open == 1)
    wait_for("the LLM call of a request whose client left was not closed", lambda: silent_llm.open == 0, 8)
    wait_for("the request still runs after its client left", lambda: in_flight(held_server.url) == 0, 8)


def test_slots_come_back_only_when_the_work_has_stopped(held_server, silent_llm):
    """12 clients, one every 0.6 s, each leaving at once: never more requests at the LLM than slots."""
    wait_for("the LLM is still held from before", lambda: silent_llm.open == 0)
    silent_llm.reset()
    statuses = []
    for i in range(12):
        status, sock = open_stream(held_server.url, list(STREAMS)[i % 2])
        statuses.append(status)
        sock.close()
        time.sleep(0.6)
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 3, statuses  # slots did come back
    wait_for("LLM calls outlived their clients", lambda: silent_llm.open == 0, 8)
    assert silent_llm.peak <= 2, f"{silent_llm.peak} LLM calls at once with max_concurrent_requests 2"
    wait_for("requests still in flight", lambda: in_flight(held_server.url) == 0, 8)


def mcp_call(url: str, name: str, arguments: dict, ident: int = 1, headers: dict | None = None) -> requests.Response:
    return requests.post(url + "/mcp", json={"jsonrpc": "2.0", "id": ident, "method": "tools/call",
                                             "params": {"name": name, "arguments": arguments}},
                         headers={"Accept": "application/json, text/event-stream", **(headers or {})}, timeout=30)


def test_mcp_calls_draw_from_the_same_slots_as_http(held_server, silent_llm):
    """Issue 29.2: both slots held by HTTP requests at the LLM: MCP `plan` calls are refused, not run."""
    wait_for("the LLM is still held from before", lambda: silent_llm.open == 0)
    silent_llm.reset()
    held = [open_stream(held_server.url, "/hugginggpt") for _ in range(2)]
    try:
        assert [status for status, _ in held] == [200, 200]
        wait_for("the two requests never reached the LLM", lambda: silent_llm.open == 2)
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda i: mcp_call(held_server.url, "plan", {"text": "caption a photo"}, i),
                                    range(3)))
        for resp in answers:
            assert resp.status_code == 200, resp.text
            result = resp.json()["result"]
            assert result["isError"] is True
            assert "max_concurrent_requests" in result["content"][0]["text"]
        time.sleep(0.5)
        assert silent_llm.requests == 2 and silent_llm.peak == 2  # no MCP call reached the LLM
    finally:
        for _, sock in held:
            sock.close()
    wait_for("the held requests did not stop", lambda: silent_llm.open == 0, 8)
    wait_for("requests still in flight", lambda: in_flight(held_server.url) == 0, 8)


@pytest.mark.parametrize("tool", ["plan", "hugginggpt"])
def test_an_mcp_caller_that_leaves_stops_its_work(held_server, silent_llm, tool):
    """An MCP tool call over HTTP whose client hangs up is cancelled like any other request."""
    wait_for("the LLM is still held from before", lambda: silent_llm.open == 0)
    host, port = held_server.url.removeprefix("http://").split(":")
    body = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                       "params": {"name": tool, "arguments": {"text": "caption a photo"}}}).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                     f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body)
        wait_for("the call never reached the LLM", lambda: silent_llm.open == 1)
    wait_for("the LLM call of an MCP caller that left was not closed", lambda: silent_llm.open == 0, 8)
    wait_for("the call still runs after its client left", lambda: in_flight(held_server.url) == 0, 8)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, llm_server, models_server, public_dir):
    """The default access settings: no api_tokens."""
    folder = tmp_path_factory.mktemp("rebind")
    _, models_url = models_server
    config = write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          allowed_hosts=["jarvis.lan"])
    running = start_server(config, folder)
    yield running
    stop_server(running)


def raw(url: str, method: str, path: str, host: str, body: dict | None = None, origin: str | None = None) -> tuple[int, dict]:
    """One request with the Host (and Origin) a rebinding page's browser would send."""
    port = url.rsplit(":", 1)[1]
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
    if origin:
        head += f"Origin: {origin}\r\n"
    with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + data)
        chunks = []
        while True:
            got = sock.recv(65536)
            if not got:
                break
            chunks.append(got)
    answer = b"".join(chunks)
    header, _, payload = answer.partition(b"\r\n\r\n")
    try:
        parsed = json.loads(payload)
    except ValueError:
        parsed = {}
    return int(header.split()[1]), parsed


RUN_MODEL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
             "params": {"name": "run_model", "arguments": {"task": "image-classification",
                                                           "model": "google/vit-base-patch16-224",
                                                           "image": "/examples/red.png"}}}
TASKS = {"messages": [{"role": "user", "content": "caption /examples/red.png"}]}


@pytest.mark.parametrize("origin", [None, "http://rebind.attacker.test:{port}"])
def test_a_rebound_host_name_is_refused_without_a_token(open_server, llm, models, origin):
    """Issue 29.3: a page at rebind.attacker.test whose name now resolves to 127.0.0.1."""
    port = open_server.url.rsplit(":", 1)[1]
    host = f"rebind.attacker.test:{port}"
    origin = origin.format(port=port) if origin else None
    status, body = raw(open_server.url, "POST", "/mcp", host, RUN_MODEL, origin)
    assert status == 403 and "allowed_hosts" in body["error"]["message"], body
    assert "result" not in body
    status, body = raw(open_server.url, "POST", "/tasks", host, TASKS, origin)
    assert status == 403 and "allowed_hosts" in body["error"]["message"]
    status, _ = raw(open_server.url, "GET", "/examples/red.png", host)
    assert status == 403  # files too: a rebinding page must not read what others generated
    assert not models.calls and not llm.stage_requests("parse_task")


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}", "jarvis.lan:{port}",
                                  "JARVIS.LAN.", "10.1.2.3"])
def test_the_servers_own_names_are_answered(open_server, llm, models, host):
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    status, body = raw(open_server.url, "POST", "/tasks", host.format(port=open_server.url.rsplit(":", 1)[1]), TASKS)
    assert status == 200, body
    assert body == [{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}}]
