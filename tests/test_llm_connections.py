"""Streamed LLM calls keep their HTTP/1.1 connection, as OpenAI, vLLM and llama.cpp serve them (keep-alive,
chunked), and a peer that goes on writing after `[DONE]` costs its connection, not the request's time.

The OpenAI SDK's sync stream closes the response at `[DONE]`, before the chunked body's last chunk is read,
so every streamed call (each plan) opened a new connection: a TCP and TLS handshake with a hosted LLM. The
server here is Python's own HTTP/1.1 server, writing chunks by hand, and counts the connections it accepts.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hugginggpt.config import LLMSettings
from hugginggpt.llm import DRAIN_SECONDS, LLMClient


class QuietServer(ThreadingHTTPServer):
    """A client that drops its connection mid-answer is what these tests do on purpose: no traceback for it."""

    def handle_error(self, request, client_address) -> None:
        pass


class StreamingLLM(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    connections = 0
    after_done = 0.0  # seconds of comments written after [DONE] before the body ends
    error_event = False  # an error object in the stream after the first piece, as OpenAI sends one
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with StreamingLLM.lock:
            StreamingLLM.connections += 1

    def log_message(self, *args) -> None:
        pass

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            reply = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "plain"}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in ("Hello", ", ", "world"):
            event = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            self.chunk(f"data: {json.dumps(event)}\n\n".encode())
            if StreamingLLM.error_event:
                self.chunk(b'data: {"error": {"message": "the model is overloaded", "type": "server_error"}}\n\n')
        self.chunk(b"data: [DONE]\n\n")
        until = time.monotonic() + StreamingLLM.after_done
        while time.monotonic() < until:
            time.sleep(0.2)
            try:
                self.chunk(b"data: {\"still\": \"here\"}\n\n")
            except OSError:
                return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


@pytest.fixture
def streaming_llm():
    StreamingLLM.connections, StreamingLLM.after_done, StreamingLLM.error_event = 0, 0.0, False
    srv = QuietServer(("127.0.0.1", 0), StreamingLLM)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    client = LLMClient(LLMSettings(api_type="local", endpoint=f"http://127.0.0.1:{srv.server_address[1]}/v1",
                                   model="scripted"))
    yield client
    srv.shutdown()


def test_streamed_calls_reuse_one_connection(streaming_llm):
    pieces: list[str] = []
    for _ in range(5):
        assert streaming_llm.chat([{"role": "user", "content": "hi"}], on_token=pieces.append) == "Hello, world"
    assert streaming_llm.chat([{"role": "user", "content": "hi"}]) == "plain"
    assert pieces == ["Hello", ", ", "world"] * 5
    assert StreamingLLM.connections == 1


def test_a_peer_writing_on_after_done_loses_its_connection_not_the_requests_time(streaming_llm):
    StreamingLLM.after_done = 30.0
    started = time.monotonic()
    assert streaming_llm.chat([{"role": "user", "content": "hi"}], on_token=lambda piece: None) == "Hello, world"
    assert time.monotonic() - started < DRAIN_SECONDS + 2.0
    StreamingLLM.after_done = 0.0
    assert streaming_llm.chat([{"role": "user", "content": "hi"}], on_token=lambda piece: None) == "Hello, world"
    assert StreamingLLM.connections == 2  # the drained-too-long connection was dropped, a new one serves


def test_an_error_in_the_stream_is_the_calls_error(streaming_llm):
    from hugginggpt.errors import LLMError

    StreamingLLM.error_event = True
    pieces: list[str] = []
    with pytest.raises(LLMError, match="the model is overloaded"):
        streaming_llm.chat([{"role": "user", "content": "hi"}], on_token=pieces.append)
    assert pieces == ["Hello"]
