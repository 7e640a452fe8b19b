"""Bodies past the limit, or without the token, are refused on their headers (issue 29, hole 6).

waitress reads a whole body (spooling it to a temporary file) before the app sees the request; `httpbody`
answers both real servers' refusals as soon as the headers are complete (a Content-Length over
`max_body_bytes`, a missing or wrong token) or as soon as a chunked body passes the limit. Each test streams a
300 MB body over a raw socket and checks that the JSON answer came while the client had sent a few MB at most,
that the server then closed the connection, and that it goes on serving.
"""

from __future__ import annotations

import io
import json
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from PIL import Image

from tests.conftest import make_public, start_server, stop_server, write_config

LIMIT = 1024 * 1024  # the orchestrator's max_body_bytes here
MODELS_LIMIT = 50 * 1024 * 1024  # the models server's
HUGE = 300_000_000
TOKEN = "tok-body-limits"
MODELS_TOKEN = "models-tok-body-limits"
BLOCK = b"\0" * 65536


@dataclass
class Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    sent: int = 0  # body bytes the client had written when the answer came
    closed: bool = False  # the server closed the connection after the answer

    def error(self) -> dict[str, Any]:
        assert isinstance(self.body, dict) and set(self.body) == {"error"}, self.body
        return self.body["error"]


def parse(raw: bytes) -> Answer | None:
    """The response in `raw`, once it is complete (headers and Content-Length bytes)."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    if len(rest) < length:
        return None
    body = rest[:length]
    is_json = headers.get("content-type", "").startswith("application/json")
    return Answer(int(lines[0].split()[1]), headers, json.loads(body) if is_json else body)


def address(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[1].split(":")
    return host, int(port)


def pieces(total: int, chunked: bool) -> Iterator[bytes]:
    """`total` zero bytes of body in 64 KiB blocks (chunked: framed, then the last chunk)."""
    left = total
    while left > 0:
        block = BLOCK[:left]
        left -= len(block)
        yield (b"%x\r\n" % len(block)) + block + b"\r\n" if chunked else block
    if chunked:
        yield b"0\r\n\r\n"


def push(url: str, head: str, total: int = HUGE, chunked: bool = False, budget: float = 60.0) -> Answer:
    """Send `head` (request line and headers), then stream `total` zero bytes of body as fast as the server
    takes them, until the answer comes. The client's send buffer is small, so `sent` is close to what the
    server's socket took."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    sock.settimeout(5)
    sock.connect(address(url))
    sock.sendall(head.encode("latin-1"))
    sock.setblocking(False)
    body = pieces(total, chunked)
    pending: bytes | None = b""
    sent, raw, ended = 0, b"", time.monotonic() + budget
    answer = None
    try:
        while answer is None and time.monotonic() < ended:
            readable, writable, _ = select.select([sock], [sock] if pending is not None else [], [], 1.0)
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                raw += data
                answer = parse(raw)
            elif writable:
                pending = pending or next(body, None)
                if pending is None:
                    continue
                try:
                    n = sock.send(pending)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError):
                    break
                pending, sent = pending[n:], sent + n
        sock.setblocking(True)
        sock.settimeout(5)
        closed = False
        while answer is None or not closed:  # the rest of the answer, then the end of the connection
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                break
            closed = data == b""
            raw += data
            answer = answer or parse(raw)
            if closed:
                break
        assert answer is not None, f"no answer after {sent} bytes of body: {raw[:300]!r}"
        answer.sent, answer.closed = sent, closed
        return answer
    finally:
        sock.close()


def request_head(method: str, path: str, headers: dict[str, str]) -> str:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return "\r\n".join(lines) + "\r\n\r\n"


def refused_early(answer: Answer, status: int, limit: int = LIMIT) -> None:
    """Answered `status` with JSON and closed, while the client had sent less than twice the limit of its
    300 MB (what sits in the sockets' buffers included: a few hundred KB)."""
    assert answer.sent < 2 * limit, f"the answer ({answer.status}) came after {answer.sent} bytes of body"
    assert answer.status == status, answer
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.headers.get("connection") == "close"
    assert answer.closed, "the server kept the connection open after refusing its body"


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("body-limits")
    _, models_url = models_server
    config = write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          max_body_bytes=LIMIT, api_tokens=[TOKEN])
    srv = start_server(config, folder)
    yield srv
    stop_server(srv)


AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json"}


def still_serving(url: str) -> None:
    """Three uploads within the limit, a chunked one among them, on one kept-alive connection: each stored and
    the connection kept (a refusal closes only its own connection)."""
    boundary = "b0undary"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n"
            f"Content-Type: image/png\r\n\r\n").encode() + png() + f"\r\n--{boundary}--\r\n".encode()
    head = {"Content-Type": f"multipart/form-data; boundary={boundary}", **AUTH}
    plain = request_head("POST", "/upload", {**head, "Content-Length": str(len(form))}).encode() + form
    chunked = (request_head("POST", "/upload", {**head, "Transfer-Encoding": "chunked"}).encode()
               + b"%x\r\n" % len(form) + form + b"\r\n0\r\n\r\n")
    with socket.create_connection(address(url), timeout=10) as sock:
        for message in (plain, chunked, plain):
            sock.sendall(message)
            raw, answer = b"", None
            while answer is None:
                data = sock.recv(65536)
                assert data, f"the server closed a kept-alive connection: {raw[:300]!r}"
                raw += data
                answer = parse(raw)
            assert answer.status == 200 and answer.body["kind"] == "image", answer
            assert answer.headers.get("connection") != "close"
    assert requests.get(url + "/health", timeout=5).status_code == 200


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def test_a_content_length_over_the_limit_on_tasks_is_refused_before_its_body(orchestrator):
    """Token first: without one a 401 (nothing about the size), with a wrong one a 403, with it a 413."""
    head = {**JSON, "Content-Length": str(HUGE)}
    missing = push(orchestrator.url, request_head("POST", "/tasks", head))
    refused_early(missing, 401)
    assert missing.error() == {"message": "this server needs `Authorization: Bearer <token>` (one of its api_tokens)",
                               "type": "authentication_error"}
    past_waitress = push(orchestrator.url, request_head("POST", "/tasks", {**head, "Content-Length": "5000000000"}))
    refused_early(past_waitress, 401)  # over waitress's own 1 GiB limit: still the token first, and JSON
    assert past_waitress.body == missing.body
    wrong = push(orchestrator.url, request_head("POST", "/tasks", {**head, "Authorization": "Bearer nope"}))
    refused_early(wrong, 403)
    assert wrong.error()["type"] == "permission_error"
    too_large = push(orchestrator.url, request_head("POST", "/tasks", {**head, **AUTH}))
    refused_early(too_large, 413)
    assert too_large.error() == {"message": f"request body is larger than {LIMIT} bytes",
                                 "type": "invalid_request_error"}
    v1 = push(orchestrator.url, request_head("POST", "/v1/chat/completions", {**head, **AUTH}))
    refused_early(v1, 413)
    assert v1.error() == {"message": f"request body is larger than {LIMIT} bytes", "type": "invalid_request_error",
                          "param": None, "code": None}  # OpenAI's shape on /v1, as the app gives it
    small = requests.post(orchestrator.url + "/tasks", json={"messages": []}, timeout=5)  # a small body: the
    assert small.status_code == 401 and small.json() == missing.body  # same 401 (from the headers, or the app)
    still_serving(orchestrator.url)


def test_a_chunked_body_on_mcp_is_refused_once_it_passes_the_limit(orchestrator):
    head = {**JSON, "Accept": "application/json, text/event-stream", "Transfer-Encoding": "chunked"}
    missing = push(orchestrator.url, request_head("POST", "/mcp", head), chunked=True)
    refused_early(missing, 401)
    assert missing.sent < LIMIT // 2  # token first: refused on the headers, not at the limit
    too_large = push(orchestrator.url, request_head("POST", "/mcp", {**head, **AUTH}), chunked=True)
    refused_early(too_large, 413)
    assert too_large.sent > LIMIT  # the limit was reached: the chunks before it were taken
    # at /mcp a refusal is a JSON-RPC error, as the app makes it, for MCP clients to show
    assert too_large.body == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32001, "message": f"request body is larger than {LIMIT} bytes",
        "data": {"type": "invalid_request_error", "status": 413}}}
    assert missing.body["error"]["data"] == {"type": "authentication_error", "status": 401}
    still_serving(orchestrator.url)


def test_an_upload_over_the_limit_is_refused_before_its_body(orchestrator):
    boundary = "b0undary"
    head = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(HUGE)}
    refused_early(push(orchestrator.url, request_head("POST", "/upload", head)), 401)
    refused_early(push(orchestrator.url, request_head("POST", "/upload", {**head, **AUTH})), 413)
    chunked = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Transfer-Encoding": "chunked", **AUTH}
    refused_early(push(orchestrator.url, request_head("POST", "/upload", chunked), chunked=True), 413)
    still_serving(orchestrator.url)


@pytest.fixture(scope="module")
def models_url(tmp_path_factory):
    from tests.test_models_server import start_models_server

    folder = tmp_path_factory.mktemp("models-body-limits")
    proc, url = start_models_server(folder, folder / "no-models", make_public(folder / "public"), deployment="minimal",
                                    token=MODELS_TOKEN)
    yield url
    proc.terminate()
    proc.wait(10)


def test_the_models_server_refuses_a_body_without_its_token_or_over_its_limit_before_reading_it(models_url):
    path = "/models/dslim/bert-base-NER"
    auth = {"Authorization": f"Bearer {MODELS_TOKEN}"}
    head = {**JSON, "Content-Length": str(HUGE)}
    missing = push(models_url, request_head("POST", path, head))
    refused_early(missing, 401, LIMIT)  # on the headers: long before the 50 MiB limit
    assert missing.error() == {"message": "this models server needs `Authorization: Bearer <models_server_token>`"}
    too_large = push(models_url, request_head("POST", path, {**head, **auth}))
    refused_early(too_large, 413, LIMIT)
    assert too_large.error() == {"message": f"request body is larger than {MODELS_LIMIT} bytes"}
    chunked = push(models_url, request_head("POST", path, {**JSON, **auth, "Transfer-Encoding": "chunked"}),
                   chunked=True)
    refused_early(chunked, 413, MODELS_LIMIT)
    assert chunked.sent > MODELS_LIMIT
    assert requests.get(models_url + "/running", headers=auth, timeout=5).ok
    small = requests.post(models_url + path, json={"text": "hi"}, headers=auth, timeout=30)
    assert small.status_code == 404 and "unknown model" in small.json()["error"]["message"]  # read and judged


def test_body_bytes_that_came_with_refused_headers_are_never_read_as_a_request(models_url):
    """A refusal takes what came in the same packet: a request hidden in the body is not answered."""
    hidden = b"GET /running HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + MODELS_TOKEN.encode() + b"\r\n\r\n"
    head = request_head("POST", "/models/dslim/bert-base-NER", {**JSON, "Content-Length": str(len(hidden))})
    sock = socket.create_connection(address(models_url), timeout=5)
    try:
        sock.sendall(head.encode("latin-1") + hidden)  # one write: headers and body arrive together
        raw = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            raw += data
    finally:
        sock.close()
    assert raw.startswith(b"HTTP/1.1 401 ")
    assert raw.count(b"HTTP/1.1 ") == 1, raw  # no second answer: the hidden GET was never parsed


def test_a_refused_connection_whose_client_stays_is_closed_after_the_linger(models_url):
    """The client reads its 401 and the end of the answer, then keeps the connection open and silent: the server
    closes it once the linger (2 s) is over, not when its idle timeout (60 s) ends."""
    head = request_head("POST", "/models/dslim/bert-base-NER", {**JSON, "Content-Length": "100"})
    sock = socket.create_connection(address(models_url), timeout=5)
    try:
        sock.sendall(head.encode("latin-1"))
        raw = b""
        while not raw.endswith(b"}") or b"\r\n\r\n" not in raw:
            data = sock.recv(65536)
            if not data:
                break
            raw += data
        assert raw.startswith(b"HTTP/1.1 401 ")
        time.sleep(4.5)  # linger 2 s, then the sweep (each second)
        closed = False
        for _ in range(20):  # to a socket the server has closed, the second write at most is refused
            try:
                sock.send(b"x" * 100)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
        assert closed, "the server still held a refused connection 4.5 s after refusing it"
    finally:
        sock.close()


def test_a_client_that_sends_its_whole_body_before_reading_still_gets_its_refusal(models_url):
    """As `requests` does: the body (under the linger's MiB) goes out whole, then the answer is read; here also
    streamed from a generator, piece by piece, as an upload of a file being read. The server drains what comes
    after refusing, so the client sees the 401, not a connection reset under its feet."""
    path = models_url + "/models/dslim/bert-base-NER"

    def slowly():
        for _ in range(16):  # 512 KB, 32 KB every 20 ms
            yield b"x" * 32768
            time.sleep(0.02)

    for body in (b"x" * 200_000, b"x" * 900_000, slowly()):
        resp = requests.post(path, data=body, headers={**JSON}, timeout=30)
        assert resp.status_code == 401
        assert "models_server_token" in resp.json()["error"]["message"]


def send_after_refusal(url: str, piece: int, pause: float, budget: float = 10.0) -> tuple[bytes, int, float]:
    """Refused on its headers (no token), the client reads the answer and keeps sending body: (the answer, the
    bytes sent after it until the server cut the connection, the seconds that took)."""
    head = request_head("POST", "/models/dslim/bert-base-NER", {**JSON, "Content-Length": str(HUGE)})
    sock = socket.create_connection(address(url), timeout=5)
    try:
        sock.sendall(head.encode("latin-1"))
        raw = b""
        while b"}" not in raw:
            raw += sock.recv(65536)
        sent, started = 0, time.monotonic()
        block = b"\0" * piece
        while time.monotonic() - started < budget:
            try:
                sent += sock.send(block)
            except (BrokenPipeError, ConnectionResetError):
                return raw, sent, time.monotonic() - started
            time.sleep(pause)
        return raw, sent, time.monotonic() - started
    finally:
        sock.close()


def test_after_a_refusal_the_server_drains_a_mebibyte_or_two_seconds_then_cuts_the_client_off(models_url):
    answer, sent, seconds = send_after_refusal(models_url, 65536, 0.002)  # a fast sender: about 30 MB/s
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert seconds < 1.9, f"a fast sender was cut after {seconds:.1f} s, not after its first MiB"
    assert sent < 16 * 2**20  # a MiB drained, plus what the sockets' buffers held
    answer, sent, seconds = send_after_refusal(models_url, 1024, 0.05)  # a slow one: 20 KB/s, never a MiB
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert 1.5 < seconds < 6, f"a slow sender was cut after {seconds:.1f} s, not once the 2 s linger ended"
