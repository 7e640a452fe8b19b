"""Slow clients (issue 20, item 2): 200 connections that send their headers one byte a second on each server.

Both real servers run with `http_header_timeout: 3`; while the slow connections are open, `/health` (the
orchestrator) and `/running` (the models server) answer at once, and the slow connections are closed once
their headers have taken longer than the deadline, although each sends a byte every second.
"""

from __future__ import annotations

import socket
import time

import requests

from hugginggpt.server import HttpLimits, overdue
from tests.conftest import start_server, stop_server, write_config
from tests.test_models_server import start_models_server

SLOW = 200
HEADER_TIMEOUT = 3
REQUEST = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60 + b"\r\n\r\n"


def open_slow(url: str, count: int) -> list[socket.socket]:
    host, port = url.rsplit("/", 1)[1].split(":")
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=2)
        sock.setblocking(False)
        socks.append(sock)
    return socks


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def dribble(socks: list[socket.socket], index: int) -> None:
    """One more byte of the request on every connection the server has not closed."""
    for sock in socks:
        try:
            sock.send(REQUEST[index:index + 1])
        except OSError:
            pass


def test_slow_connections_leave_both_servers_serving_and_are_cut_at_the_header_deadline(tmp_path, llm_server,
                                                                                         public_dir):
    limits = [f"http_header_timeout: {HEADER_TIMEOUT}"]
    models_proc, models_url = start_models_server(tmp_path, tmp_path / "models", public_dir, deployment="minimal",
                                                  extra=tuple(limits))
    config = write_config(tmp_path, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          http_header_timeout=HEADER_TIMEOUT)
    srv = start_server(config, tmp_path)
    socks: list[socket.socket] = []
    try:
        socks = open_slow(srv.url, SLOW) + open_slow(models_url, SLOW)
        start = time.monotonic()
        for index in range(HEADER_TIMEOUT + 3):
            dribble(socks, index)
            if index < HEADER_TIMEOUT:  # while every slow connection is still open
                for url in (srv.url + "/health", models_url + "/running"):
                    t0 = time.monotonic()
                    assert requests.get(url, timeout=2).status_code == 200, url
                    assert time.monotonic() - t0 < 2, url
            time.sleep(max(0.0, start + index + 1 - time.monotonic()))
        assert index + 1 < len(REQUEST)  # no slow request was ever complete
        still_open = [s for s in socks if not closed_by_peer(s)]
        assert not still_open, f"{len(still_open)} of {len(socks)} slow connections outlived the header deadline"
        assert requests.get(srv.url + "/health", timeout=2).ok and requests.get(models_url + "/running", timeout=2).ok
    finally:
        for sock in socks:
            sock.close()
        stop_server(srv)
        models_proc.terminate()
        models_proc.wait(10)


GREEDY = 60
LIMIT = 40  # http_connection_limit; the default cap per client address is a quarter: 10


def refused(sock: socket.socket) -> bool:
    """The server closed this connection, with or without its 429."""
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 429")


def test_one_client_address_cannot_take_every_connection_slot(tmp_path, llm_server, public_dir):
    """A greedy client on 127.0.0.2 opens 60 slow connections to each server (http_connection_limit 40, the
    header deadline far away): it keeps 10 (the default cap per address), the rest are turned away at once,
    and a client on 127.0.0.1 is still served by both servers."""
    limits = [f"http_connection_limit: {LIMIT}", "http_header_timeout: 60"]
    models_proc, models_url = start_models_server(tmp_path, tmp_path / "models", public_dir, deployment="minimal",
                                                  extra=tuple(limits))
    config = write_config(tmp_path, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          http_connection_limit=LIMIT, http_header_timeout=60)
    srv = start_server(config, tmp_path)
    greedy: dict[str, list[socket.socket]] = {}
    try:
        for url in (srv.url, models_url):
            host, port = url.rsplit("/", 1)[1].split(":")
            socks = greedy[url] = []
            for _ in range(GREEDY):
                sock = socket.create_connection((host, int(port)), timeout=2, source_address=("127.0.0.2", 0))
                sock.sendall(REQUEST[:1])  # a request that has begun and will never finish
                sock.setblocking(False)
                socks.append(sock)
        time.sleep(1.5)
        for url, path in ((srv.url, "/health"), (models_url, "/running")):
            t0 = time.monotonic()
            resp = requests.get(url + path, timeout=3)
            assert resp.status_code == 200 and time.monotonic() - t0 < 2, url
            kept = [s for s in greedy[url] if not refused(s)]
            assert len(kept) == LIMIT // 4, f"{url}: the greedy client holds {len(kept)} connections"
        assert "http_connections_per_client" in srv.logs()
    finally:
        for socks in greedy.values():
            for sock in socks:
                sock.close()
        stop_server(srv)
        models_proc.terminate()
        models_proc.wait(10)


class FakeRequest:
    def __init__(self, started: float, headers_finished: bool = False):
        self.started, self.headers_finished, self.completed = started, headers_finished, False


class FakeChannel:
    def __init__(self, request=None, accepted: float = 0.0, read: bool = True):
        self.requests, self.will_close, self.request, self.accepted = [], False, request, accepted
        self.creation_time, self.last_activity = 1.0, 2.0 if read else 1.0


def test_overdue_counts_from_the_first_byte_not_the_last():
    limits = HttpLimits(header_timeout=10, read_timeout=60)
    assert overdue(FakeChannel(FakeRequest(started=0)), 9, limits) is None
    assert "http_header_timeout" in overdue(FakeChannel(FakeRequest(started=0)), 11, limits)
    body = FakeChannel(FakeRequest(started=0, headers_finished=True))
    assert overdue(body, 59, limits) is None
    assert "http_read_timeout" in overdue(body, 61, limits)
    assert overdue(FakeChannel(None, accepted=0, read=False), 11, limits)  # connected, never sent a byte
    assert overdue(FakeChannel(None, accepted=0, read=True), 11, limits) is None  # idle keep-alive: idle_timeout
    busy = FakeChannel(FakeRequest(started=0))
    busy.requests = ["being served"]
    assert overdue(busy, 100, limits) is None
