"""The outbound URL policy: user-named URLs never reach internal addresses, redirects included.

Every URL these tests fetch or try to fetch points at loopback, where a recording server counts hits;
other address ranges are only ever checked as values by `blocked_reason`, never put in a URL.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time

import pytest
from flask import Flask, Response, redirect, request

from hugginggpt.errors import ResourceError
from hugginggpt.urlpolicy import UrlPolicy, URLRefused, blocked_reason, fetch
from tests.conftest import start_server, stop_server, write_config
from tests.fakes.llm_server import ThreadedServer
from tests.fakes.raw_peer import RawPeer


class Recorder:
    """A loopback web server that counts every request and can redirect."""

    def __init__(self):
        self.hits: list[dict[str, str]] = []
        self.lock = threading.Lock()
        app = Flask("recorder")

        @app.route("/<path:path>")
        def any_path(path: str) -> Response:
            with self.lock:
                self.hits.append({"path": path, "host": request.headers.get("Host", "")})
            if path == "to" and request.args.get("url"):
                return redirect(request.args["url"], code=302)
            if path == "missing":
                return Response("no such page", status=404, mimetype="text/plain")
            if path == "red.png":
                import io

                from PIL import Image

                buf = io.BytesIO()
                Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="PNG")
                return Response(buf.getvalue(), mimetype="image/png")
            return Response("secret internal data", mimetype="text/plain")

        self.server = ThreadedServer(app).start()
        self.port = self.server.port


@pytest.fixture(scope="module")
def inside():
    rec = Recorder()
    yield rec
    rec.server.stop()


@pytest.fixture
def hits(inside):
    with inside.lock:
        inside.hits.clear()
    return inside


BLOCKED = ["127.0.0.1", "127.8.9.10", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
           "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
           "::ffff:169.254.169.254", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::127.0.0.1", "64:ff9b::a9fe:a9fe",
           "2002:a9fe:a9fe::1", "2001:db8::1", "fec0::1", "fec0:1234::5", "feff:ffff::1"]  # fec0::/10: site-local
PUBLIC = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", BLOCKED)
def test_internal_addresses_are_blocked(address):
    assert blocked_reason(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address):
    assert blocked_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("form", ["127.0.0.1", "127.1", "2130706433", "0x7f.0.0.1", "017700000001", "localhost",
                                  "LOCALHOST.", "[::ffff:127.0.0.1]", "[::1]"])
def test_every_spelling_of_loopback_is_refused_before_connecting(hits, form):
    with pytest.raises(URLRefused, match="refusing"):
        fetch(f"http://{form}:{hits.port}/secret", UrlPolicy(), 10**6, 5)
    assert hits.hits == []


def test_allowlist_entries_match_exactly_not_by_prefix(hits):
    policy = UrlPolicy.from_entries(["127.0.0.1"])
    assert fetch(f"http://127.0.0.1:{hits.port}/ok", policy, 10**6, 5).data == b"secret internal data"
    for near in ("127.0.0.10", "127.0.0.100", "127.0.0.12"):  # a string-prefix compare would let these through
        with pytest.raises(URLRefused):
            fetch(f"http://{near}:{hits.port}/secret", policy, 10**6, 5)
    by_name = UrlPolicy.from_entries(["localhost"])
    with pytest.raises(URLRefused):  # the name is allowed, a numeric spelling of its address is not
        fetch(f"http://127.0.0.1:{hits.port}/secret", by_name, 10**6, 5)
    assert [h["path"] for h in hits.hits] == ["ok"]


def test_each_redirect_hop_is_checked_again(hits):
    """localhost is allowed by name; a redirect to 127.0.0.1 (not allowed) must stop before connecting."""
    policy = UrlPolicy.from_entries(["localhost"])
    inner = f"http://127.0.0.1:{hits.port}/secret"
    with pytest.raises(URLRefused):
        fetch(f"http://localhost:{hits.port}/to?url={inner}", policy, 10**6, 5)
    assert [h["path"] for h in hits.hits] == ["to"]
    # an allowed hop is followed
    got = fetch(f"http://localhost:{hits.port}/to?url=http://localhost:{hits.port}/red.png", policy, 10**6, 5)
    assert got.content_type == "image/png" and got.url.endswith("/red.png")


def test_the_connection_goes_to_the_address_that_was_checked(hits):
    """The name is resolved once; the socket connects to that address (a second lookup could rebind)."""
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["127.0.0.2"]

    policy = UrlPolicy.from_entries(["127.0.0.1/32"], resolver=rebinding)
    got = fetch(f"http://rebind.test:{hits.port}/pinned", policy, 10**6, 5)
    assert got.data == b"secret internal data"
    assert calls == ["rebind.test"]
    assert hits.hits == [{"path": "pinned", "host": f"rebind.test:{hits.port}"}]


def test_every_address_a_name_resolves_to_is_checked(hits):
    """A name that resolves to a public and an internal address is refused (the connection could go to either)."""
    policy = UrlPolicy(resolver=lambda host, port: ["8.8.8.8", "127.0.0.1"])
    with pytest.raises(URLRefused, match="loopback address 127.0.0.1"):
        fetch(f"http://two-faced.test:{hits.port}/secret", policy, 10**6, 5)
    assert hits.hits == []


def test_an_error_status_is_an_error_not_data(hits):
    policy = UrlPolicy.from_entries(["127.0.0.1"])
    with pytest.raises(ResourceError, match="HTTP 404"):
        fetch(f"http://127.0.0.1:{hits.port}/missing", policy, 10**6, 5)


def test_size_limit_and_schemes(hits):
    policy = UrlPolicy.from_entries(["127.0.0.1"])
    with pytest.raises(ResourceError, match="larger than"):
        fetch(f"http://127.0.0.1:{hits.port}/big", policy, 5, 5)
    for bad in ("file:///etc/passwd", "gopher://127.0.0.1/", f"http://user:pw@127.0.0.1:{hits.port}/"):
        with pytest.raises(URLRefused):
            fetch(bad, policy, 10**6, 5)


def test_plan_arguments_cannot_reach_internal_urls(tmp_path, llm, models, models_server, public_dir, hits):
    """A plan that names an internal URL fails that task with the reason; the internal server sees nothing."""
    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False),
                       tmp_path)
    try:
        for form in ("127.0.0.1", "[::ffff:127.0.0.1]", "2130706433"):
            url = f"http://{form}:{hits.port}/red.png"
            llm.on("parse_task", json.dumps([{"task": "image-classification", "id": 0, "dep": [-1],
                                              "args": {"image": url}}]))
            results = srv.post("/results", {"messages": [{"role": "user", "content": f"classify {url}"}]}).json()
            assert "refusing" in results["0"]["inference result"]["error"]["message"]
        assert hits.hits == []
    finally:
        stop_server(srv)


def test_url_allowlist_in_the_config_opens_an_exception(tmp_path, llm, models, models_server, public_dir, hits):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          url_allowlist=["127.0.0.1/32"])
    srv = start_server(config, tmp_path)
    try:
        url = f"http://127.0.0.1:{hits.port}/red.png"
        llm.on("parse_task", json.dumps([{"task": "image-classification", "id": 0, "dep": [-1],
                                          "args": {"image": url}}]))
        results = srv.post("/results", {"messages": [{"role": "user", "content": "classify it"}]}).json()
        assert "error" not in results["0"]["inference result"], results
        assert [h["path"] for h in hits.hits] == ["red.png"]
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def raw_peer():
    peer = RawPeer()
    yield peer
    peer.stop.set()
    peer.sock.close()


def test_a_body_streamed_without_content_length_is_cut_at_the_size_limit(raw_peer):
    policy = UrlPolicy.from_entries(["127.0.0.1"])
    started = time.monotonic()
    with pytest.raises(ResourceError, match="larger than"):
        fetch(f"http://127.0.0.1:{raw_peer.port}/endless", policy, 200_000, 20)
    assert time.monotonic() - started < 5  # stopped at the limit, not at the peer's end (10 s of data)


@pytest.mark.parametrize("mode", ["stall", "dribble"])
def test_a_peer_that_stops_or_dribbles_is_cut_at_the_fetch_timeout(raw_peer, mode):
    """A peer that stops sending, or sends a byte now and then (a per-read timeout restarts on each), is cut at
    the fetch's own timeout, with an error that says so."""
    policy = UrlPolicy.from_entries(["127.0.0.1"])
    started = time.monotonic()
    with pytest.raises(ResourceError, match="took longer than 1s"):
        fetch(f"http://127.0.0.1:{raw_peer.port}/{mode}", policy, 10**6, 1)
    took = time.monotonic() - started
    assert 0.9 < took < 3, took


def test_a_stalled_url_in_a_request_is_cut_at_fetch_timeout_not_at_the_request_deadline(
        tmp_path, llm, models, models_server, public_dir, raw_peer):
    """What a user sees: a plan naming a URL whose server stops sending (or sends a byte now and then) fails that
    task after `fetch_timeout`, saying so, while the request's own deadline is far away; the rest still runs.
    The same for an image a /v1 client names."""
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          url_allowlist=["127.0.0.1/32"], fetch_timeout=1, request_timeout=120)
    srv = start_server(config, tmp_path)
    try:
        for mode in ("stall", "dribble"):
            url = f"http://127.0.0.1:{raw_peer.port}/{mode}"
            llm.on("parse_task", json.dumps([
                {"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": url}},
                {"task": "token-classification", "id": 1, "dep": [-1], "args": {"text": "Anna lives in Berlin"}}]))
            started = time.monotonic()
            results = srv.post("/results", {"messages": [{"role": "user", "content": "classify it"}]},
                               timeout=60).json()
            took = time.monotonic() - started
            assert "took longer than 1s" in results["0"]["inference result"]["error"]["message"], results
            assert "error" not in results["1"]["inference result"]
            assert took < 8, took  # the peer goes on for 10 s; the request's deadline is 120 s
        started = time.monotonic()
        resp = srv.post("/v1/chat/completions", {"model": "hugginggpt", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"http://127.0.0.1:{raw_peer.port}/dribble"}}]}]}, timeout=60)
        assert resp.status_code == 400 and "took longer than 1s" in resp.json()["error"]["message"], resp.text
        assert time.monotonic() - started < 8
    finally:
        stop_server(srv)
