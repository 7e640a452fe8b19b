"""Edge cases of hugginggpt/urlpolicy.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md).

Every URL fetched here points at a loopback server the test starts; other address ranges are only checked as
values (`blocked_reason`, a resolver that answers what the test says), never connected to.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import ipaddress
import math
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import unquote

import httpcore2
import httpx2
import pytest
import requests
import urllib3

from hugginggpt import cancel, urlpolicy
from hugginggpt.errors import ResourceError
from hugginggpt.urlpolicy import (
    MAX_REDIRECTS,
    WATCHED_POOL_CLASSES,
    DeadlineBackend,
    FetchStatus,
    PinnedBackend,
    Target,
    UrlPolicy,
    URLRefused,
    WatchedHTTPConnectionPool,
    WatchedHTTPSConnectionPool,
    _DeadlineStream,
    _register_socket,
    _Watch,
    _Watchdog,
    blocked_reason,
    bound_by_deadlines,
    current_deadline,
    deadline_scope,
    embedded_ipv4,
    fetch,
    redact_url,
    redact_urls_in,
    system_resolver,
    watched_adapter,
)

ip = ipaddress.ip_address


# -- redact_url / redact_urls_in -----------------------------------------------------------------------------


@pytest.mark.parametrize("url, shown", [
    ("http://example.com/a/b?q=1#top", "http://example.com/a/b?q=1#top"),
    ("https://user:pw@example.com/x", "https://***@example.com/x"),
    ("https://user@example.com", "https://***@example.com"),
    ("https://a@b:pw@example.com:8443/x", "https://***@example.com:8443/x"),  # the last @ ends the userinfo
    ("http://u:p@host/p?token=a#frag", "http://***@host/p?token=***#frag"),
    ("http://u:p@host?x=1", "http://***@host?x=1"),
    ("http://u:p@host#x", "http://***@host#x"),
    ("https://user:pw@host/?return=http://x", "https://***@host/?return=http://x"),  # the first :// counts
    ("http://host/p#frag@x", "http://host/p#frag@x"),
    ("http://host/a@b/c", "http://host/a@b/c"),
    ("http://Xavier:pw@host/", "http://***@host/"),
    ("http://h/p?token=s3cret?x=1", "http://h/p?token=***"),  # an @ after the authority is not userinfo
    ("http://host?q=a@b", "http://host?q=a@b"),
    ("http://host#a@b/c", "http://host#a@b/c"),
    ("http://host/p?q=1&API_KEY=s3&flag&Token=t&x=&name=bob#f", "http://host/p?q=1&API_KEY=***&flag&Token=***&x=&name=bob#f"),
    ("http://h/?key=1&token=2&secret=3&sig=4&signature=5&password=6&passwd=7&pwd=8&auth=9&credential=10"
     "&session=11&code=12",
     "http://h/?key=***&token=***&secret=***&sig=***&signature=***&password=***&passwd=***&pwd=***&auth=***"
     "&credential=***&session=***&code=***"),
    ("http://h/?X-Amz-Signature=abc&sessionid=9&authorization=z", "http://h/?X-Amz-Signature=***&sessionid=***&authorization=***"),
    ("http://h/p?", "http://h/p?"),
    ("http://h/p?a=b=c&code=x=y", "http://h/p?a=b=c&code=***"),
    ("not a url", "not a url"),
    ("mailto:someone@example.com?code=1", "mailto:someone@example.com?code=1"),
])
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_redact_urls_in_text_redacts_each_url_and_keeps_the_rest():
    text = ("could not fetch 'https://bob:hunter2@img.example/cat.png?sig=abc' (see <http://h2/?password=z>), "
            "nor svn+ssh://u@h3/r\tor ftp://x@y\"q\" or 1http://a:b@c/")
    assert redact_urls_in(text) == (
        "could not fetch 'https://***@img.example/cat.png?sig=***' (see <http://h2/?password=***>), "
        "nor svn+ssh://***@h3/r\tor ftp://***@y\"q\" or 1http://a:b@c/")


def test_redact_urls_in_takes_an_exception():
    err = ValueError("GET https://me:pw@host/x failed")
    assert redact_urls_in(err) == "GET https://***@host/x failed"


def test_redact_urls_in_leaves_text_without_urls_alone():
    assert redact_urls_in("token=abc user:pw@host") == "token=abc user:pw@host"


# -- addresses ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("address, inner", [
    ("::ffff:1.2.3.4", "1.2.3.4"),
    ("2002:102:304::1", "1.2.3.4"),  # 6to4
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),  # Teredo: the client's address
    ("64:ff9b::102:304", "1.2.3.4"),  # NAT64 well-known prefix
    ("64:ff9b::ffff:ffff", "255.255.255.255"),
    ("64:ff9b:1::102:304", "1.2.3.4"),  # NAT64 local-use prefix
    ("64:ff9b:1:ffff:ffff:ffff:ffff:fffe", "255.255.255.254"),
    ("::1.2.3.4", "1.2.3.4"),  # IPv4-compatible
    ("::2", "0.0.0.2"),
    ("::ffff:ffff", "255.255.255.255"),
])
def test_embedded_ipv4(address, inner):
    assert embedded_ipv4(ip(address)) == ip(inner)


@pytest.mark.parametrize("address", [
    "1.2.3.4", "::1", "::", "2606:4700:4700::1111", "64:ff9b::1:102:304", "64:ff9b:2::102:304", "64:ff9a::102:304",
    "::1:102:304", "64:ff9b:0:1::102:304",
])
def test_no_embedded_ipv4(address):
    assert embedded_ipv4(ip(address)) is None


@pytest.mark.parametrize("address, reason", [
    ("127.0.0.1", "loopback address 127.0.0.1"),
    ("::1", "loopback address ::1"),
    ("0.0.0.0", "unspecified address 0.0.0.0"),
    ("::", "unspecified address ::"),
    ("169.254.169.254", "link-local address 169.254.169.254"),
    ("fe80::1", "link-local address fe80::1"),
    ("224.0.0.1", "multicast address 224.0.0.1"),
    ("ff02::1", "multicast address ff02::1"),
    ("100.64.0.1", "carrier-grade NAT address 100.64.0.1"),
    ("100.127.255.254", "carrier-grade NAT address 100.127.255.254"),
    ("10.1.2.3", "private address 10.1.2.3"),
    ("192.168.1.1", "private address 192.168.1.1"),
    ("240.0.0.1", "private address 240.0.0.1"),
    ("fc00::1", "private address fc00::1"),
    ("2001:db8::1", "private address 2001:db8::1"),
    ("fec0::1", "site-local address fec0::1"),
    ("4000::1", "reserved address 4000::1"),
    ("::ffff:127.0.0.1", "loopback address 127.0.0.1 (IPv4 127.0.0.1 inside ::ffff:7f00:1)"),
    ("64:ff9b::a9fe:a9fe", "link-local address 169.254.169.254 (IPv4 169.254.169.254 inside 64:ff9b::a9fe:a9fe)"),
    ("2002:a64:1::1", "private address 10.100.0.1 (IPv4 10.100.0.1 inside 2002:a64:1::1)"),
])
def test_blocked_reason_names_the_range(address, reason):
    assert blocked_reason(ip(address)) == reason


@pytest.mark.parametrize("address", ["8.8.8.8", "100.63.255.255", "100.128.0.0", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8", "2002:808:808::1", "64:ff9b::808:808", "::8.8.8.8"])
def test_public_addresses_have_no_reason(address):
    assert blocked_reason(ip(address)) is None


# -- Target ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme, host, port, header", [
    ("http", "example.com", 80, "example.com"),
    ("http", "example.com", 8080, "example.com:8080"),
    ("http", "example.com", 443, "example.com:443"),
    ("https", "example.com", 443, "example.com"),
    ("https", "example.com", 80, "example.com:80"),
    ("https", "2001:db8::1", 443, "[2001:db8::1]"),
    ("http", "::1", 8080, "[::1]:8080"),
])
def test_host_header(scheme, host, port, header):
    target = Target(url="u", scheme=scheme, host=host, port=port, address="a", request_target="/")
    assert target.host_header == header


# -- UrlPolicy ------------------------------------------------------------------------------------------------


def resolver_of(table: dict[str, list[str]], asked: list | None = None):
    def resolve(host: str, port: int) -> list[str]:
        if asked is not None:
            asked.append((host, port))
        return table.get(host, [])

    return resolve


PUBLIC = {"example.com": ["93.184.216.34"], "inside.test": ["10.0.0.5"], "meta.test": ["169.254.169.254"],
          "v6.test": ["::ffff:169.254.169.254"], "both.test": ["93.184.216.34", "127.0.0.1"],
          "loop.test": ["127.0.0.1"]}


def test_check_returns_the_target_to_connect_to():
    asked = []
    policy = UrlPolicy(resolver=resolver_of(PUBLIC, asked))
    target = policy.check("HTTP://Example.COM./a/b?x=1&y=2#frag")
    assert target == Target(url="HTTP://Example.COM./a/b?x=1&y=2#frag", scheme="http", host="example.com", port=80,
                            address="93.184.216.34", request_target="/a/b?x=1&y=2")
    assert asked == [("example.com", 80)]


@pytest.mark.parametrize("url, port, request_target", [
    ("https://example.com", 443, "/"),
    ("https://example.com?q", 443, "/?q"),
    ("http://example.com:8080/p", 8080, "/p"),
    ("https://[2606:4700::1]:8443/", 8443, "/"),
    ("http://example.com:0/", 80, "/"),
])
def test_check_ports_and_request_targets(url, port, request_target):
    policy = UrlPolicy(resolver=lambda host, p: ["93.184.216.34"])
    target = policy.check(url)
    assert (target.port, target.request_target) == (port, request_target)


def test_check_gives_the_first_resolved_address():
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34", "93.184.216.35"])
    assert policy.check("http://example.com/").address == "93.184.216.34"


@pytest.mark.parametrize("url, why", [
    ("ftp://example.com/x", "'ftp://example.com/x': only http(s) URLs can be fetched"),
    ("file:///etc/passwd", "'file:///etc/passwd': only http(s) URLs can be fetched"),
    ("example.com/x", "'example.com/x': only http(s) URLs can be fetched"),
    ("http://bob:pw@example.com/", "'http://***@example.com/': credentials in URLs are not accepted"),
    ("http://bob@example.com/", "'http://***@example.com/': credentials in URLs are not accepted"),
    ("http://:pw@example.com/", "'http://***@example.com/': credentials in URLs are not accepted"),
    ("http://example.com:99999/", "'http://example.com:99999/': invalid port"),
    ("http://example.com:http/", "'http://example.com:http/': invalid port"),
    ("http:///path", "'http:///path': no host"),
    ("http://[]/x", "'http://[]/x': not a valid URL"),
    ("http://[::1/x?token=t", "'http://[::1/x?token=***': not a valid URL"),
    ("https://./x", "'https://./x': no host"),
])
def test_check_refuses_what_it_cannot_fetch(url, why):
    policy = UrlPolicy(resolver=resolver_of(PUBLIC))
    with pytest.raises(URLRefused) as caught:
        policy.check(url)
    assert str(caught.value) == "refusing " + why


def test_check_an_unresolvable_host_is_an_error_not_a_refusal():
    policy = UrlPolicy(resolver=resolver_of(PUBLIC))
    with pytest.raises(ResourceError) as caught:
        policy.check("http://Nowhere.Test/x")
    assert type(caught.value) is ResourceError
    assert str(caught.value) == "cannot resolve host 'nowhere.test'"


@pytest.mark.parametrize("host, reason", [
    ("inside.test", "private address 10.0.0.5"),
    ("meta.test", "link-local address 169.254.169.254"),
    ("v6.test", "link-local address 169.254.169.254 (IPv4 169.254.169.254 inside ::ffff:a9fe:a9fe)"),
    ("both.test", "loopback address 127.0.0.1"),
])
def test_check_refuses_internal_addresses_and_says_how_to_allow_them(host, reason):
    policy = UrlPolicy(resolver=resolver_of(PUBLIC))
    with pytest.raises(URLRefused) as caught:
        policy.check(f"http://{host}/x?token=t")
    assert str(caught.value) == (f"refusing to fetch 'http://{host}/x?token=***': {host} resolves to {reason}; "
                                 "add it to url_allowlist in the config if this is intended")


def test_urlrefused_is_a_resource_error():
    assert issubclass(URLRefused, ResourceError)


def test_from_entries_reads_hosts_and_networks():
    policy = UrlPolicy.from_entries([" Intranet.Example. ", "", "   ", "10.0.0.0/8", "[::1]", "192.168.1.7/24",
                                     "[fd00::/8]", "LOCALHOST"])
    assert policy.allow_hosts == frozenset({"intranet.example", "localhost"})
    assert policy.allow_networks == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"),
                                     ipaddress.ip_network("192.168.1.0/24"), ipaddress.ip_network("fd00::/8"))
    assert policy.resolver is system_resolver
    assert UrlPolicy.from_entries() == UrlPolicy()
    assert UrlPolicy.from_entries().resolver is system_resolver


def test_from_entries_host_names_keep_every_letter():
    assert UrlPolicy.from_entries(["XBOX", "[Intranet]"]).allow_hosts == frozenset({"xbox", "intranet"})


def test_from_entries_a_network_is_the_whole_entry_not_an_address_inside_it():
    policy = UrlPolicy.from_entries(["X10.0.0.1", "Xfd00::/8X"], resolver=resolver_of({"inside.test": ["10.0.0.1"]}))
    assert policy.allow_networks == ()
    assert policy.allow_hosts == frozenset({"x10.0.0.1", "xfd00::/8x"})
    with pytest.raises(URLRefused, match="private address 10.0.0.1"):
        policy.check("http://inside.test/")


def test_from_entries_accepts_non_string_entries():
    policy = UrlPolicy.from_entries([ipaddress.ip_network("10.0.0.0/8")])
    assert policy.allow_networks == (ipaddress.ip_network("10.0.0.0/8"),)


def test_allowed_host_name_skips_the_address_check():
    policy = UrlPolicy.from_entries(["inside.test"], resolver=resolver_of(PUBLIC))
    assert policy.check("http://INSIDE.test./x").address == "10.0.0.5"
    with pytest.raises(URLRefused):
        policy.check("http://meta.test/x")


def test_allowed_network_covers_the_ipv4_inside_an_ipv6_address():
    policy = UrlPolicy.from_entries(["169.254.0.0/16"], resolver=resolver_of(PUBLIC))
    assert policy.check("http://v6.test/").address == "::ffff:169.254.169.254"
    assert policy.check("http://meta.test/").address == "169.254.169.254"
    with pytest.raises(URLRefused, match="10.0.0.5"):
        policy.check("http://inside.test/")


def test_allowed_ipv6_network():
    policy = UrlPolicy.from_entries(["fd00::/8"], resolver=lambda host, port: ["fd12::1"])
    assert policy.check("http://ula.test/").address == "fd12::1"
    refused = UrlPolicy.from_entries(["fd00::/8"], resolver=lambda host, port: ["fc12::1"])
    with pytest.raises(URLRefused, match="private address fc12::1"):
        refused.check("http://ula.test/")


def test_allowed_network_must_cover_every_address():
    policy = UrlPolicy.from_entries(["10.0.0.0/8"], resolver=lambda host, port: ["10.0.0.1", "127.0.0.1"])
    with pytest.raises(URLRefused, match="loopback address 127.0.0.1"):
        policy.check("http://two.test/")


# -- system_resolver ------------------------------------------------------------------------------------------


def test_system_resolver_numeric_addresses():
    assert system_resolver("127.0.0.1", 80) == ["127.0.0.1"]
    assert system_resolver("::1", 80) == ["::1"]


def test_system_resolver_drops_scope_ids_and_duplicates(monkeypatch):
    asked = []

    def getaddrinfo(host, port, *args, **kwargs):
        asked.append((host, port, args, kwargs))
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%eth0", port, 0, 2)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert system_resolver("host.test", 8080) == ["fe80::1", "10.0.0.1"]
    assert asked == [("host.test", 8080, (), {"type": socket.SOCK_STREAM})]


def test_system_resolver_unknown_host(monkeypatch):
    def getaddrinfo(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(ResourceError) as caught:
        system_resolver("nowhere.test", 80)
    assert str(caught.value) == "cannot resolve host 'nowhere.test'"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_system_resolver_host_that_is_not_a_valid_name():
    host = "x" * 64 + ".example"  # a DNS label is at most 63 bytes: the IDNA codec refuses it
    with pytest.raises(ResourceError) as caught:
        system_resolver(host, 80)
    assert str(caught.value) == f"cannot resolve host {host!r}"


def test_max_redirects_is_five():
    assert MAX_REDIRECTS == 5


# -- fetch, against a loopback server -------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def send(self, status: int, body: bytes = b"", headers: dict | None = None, length: bool = True) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if length:
            self.send_header("Content-Length", str(len(body)))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def send_then_stall(self, header: tuple[str, str], first: bytes) -> None:
        """A 200 with `header`, `first` of its body, then nothing for 5 s."""
        self.send_response(200)
        self.send_header(*header)
        self.end_headers()
        try:
            self.wfile.write(first)
            self.wfile.flush()
            time.sleep(5)
        except OSError:
            pass
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append({"path": self.path, "host": self.headers.get("Host"),
                                 "agent": self.headers.get("User-Agent"), "x": self.headers.get("X-Test")})
        path, _, query = self.path.partition("?")
        if path.startswith("http://"):  # absolute form: we are the proxy
            path = "/" + path.split("/", 3)[3]
            if path == "/to-internal":
                return self.send(302, b"", {"Location": "http://internal.test/secret"})
            if path not in ("/dribble", "/stall", "/paced", "/unsaid") and not path.startswith("/redirect/"):
                return self.send(200, b"via proxy", {"Content-Type": "text/plain"})
        name, _, arg = path.strip("/").partition("/")
        if name == "ok":
            self.send(200, b"hello", {"Content-Type": "text/plain; charset=utf-8"})
        elif name == "notype":
            self.send(200, b"raw")
        elif name == "status":
            self.send(int(arg), b"status page", {"Content-Type": "text/html"})
        elif name == "redirect":
            self.send(int(arg), b"moved", {"Location": unquote(query.partition("=")[2])})
        elif name == "noloc":
            self.send(int(arg), b"moved without a location", {"Content-Type": "text/plain"})
        elif name == "chain":
            n = int(arg)
            if n:
                self.send(302, b"", {"Location": f"/chain/{n - 1}"})
            else:
                self.send(200, b"end", {"Content-Type": "text/plain"})
        elif name == "len":
            self.send(200, b"x" * int(arg), {"Content-Type": "application/octet-stream"})
        elif name == "stream":
            self.send(200, b"y" * int(arg), {"Content-Type": "application/octet-stream"}, length=False)
        elif name == "short":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.close_connection = True
        elif name == "dribble":  # a byte every 50 ms for 5 s: a per-read timeout never fires
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"z")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
            self.close_connection = True
        elif name == "stall":  # a few bytes of a said length
            self.send_then_stall(("Content-Length", "100"), b"abcd")
        elif name == "unsaid":  # no length said (the body ends when the connection does): one whole 64 KiB read
            self.send_then_stall(("Connection", "close"), b"u" * 65536)  # of urllib3's stream
        elif name == "paced":  # 64 KiB every 50 ms for 5 s
            self.send_response(200)
            self.send_header("Content-Length", str(100 * 65536))
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b"p" * 65536)
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass
            self.close_connection = True
        else:
            self.send(404, b"no such page")


class Peer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, context: ssl.SSLContext | None = None):
        super().__init__(("127.0.0.1", 0), Handler)
        if context is not None:
            self.socket = context.wrap_socket(self.socket, server_side=True)
        self.lock = threading.Lock()
        self.connections = 0
        self.seen: list[dict] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def reset(self) -> None:
        with self.lock:
            self.connections = 0
            self.seen.clear()


@pytest.fixture(scope="module")
def peer():
    server = Peer()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def web(peer):
    peer.reset()
    return peer


LOOPBACK = UrlPolicy.from_entries(["127.0.0.1"])


def test_fetch_returns_the_body_its_type_and_url(web):
    url = f"http://127.0.0.1:{web.port}/ok?a=1"
    got = fetch(url, LOOPBACK, 1000, 5)
    assert (got.data, got.content_type, got.url) == (b"hello", "text/plain", url)
    assert web.seen == [{"path": "/ok?a=1", "host": f"127.0.0.1:{web.port}", "agent": "hugginggpt-server", "x": None}]


def test_fetch_sends_the_callers_headers_but_always_the_checked_host(web):
    policy = UrlPolicy.from_entries(["127.0.0.1"], resolver=lambda host, port: ["127.0.0.1"])
    fetch(f"http://named.test:{web.port}/ok", policy, 1000, 5,
          headers={"X-Test": "yes", "User-Agent": "mine", "Host": "evil.test"})
    assert web.seen == [{"path": "/ok", "host": f"named.test:{web.port}", "agent": "mine", "x": "yes"}]


def test_fetch_without_a_content_type(web):
    assert fetch(f"http://127.0.0.1:{web.port}/notype", LOOPBACK, 1000, 5).content_type == ""


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_fetch_follows_redirects(web, code):
    final = f"http://127.0.0.1:{web.port}/ok"
    got = fetch(f"http://127.0.0.1:{web.port}/redirect/{code}?to={final}", LOOPBACK, 1000, 5)
    assert (got.data, got.url) == (b"hello", final)
    assert [s["path"] for s in web.seen] == [f"/redirect/{code}?to={final}", "/ok"]


def test_fetch_follows_a_relative_redirect(web):
    got = fetch(f"http://127.0.0.1:{web.port}/redirect/302?to=../ok", LOOPBACK, 1000, 5)
    assert got.url == f"http://127.0.0.1:{web.port}/ok"


@pytest.mark.parametrize("path, body", [("noloc/302", b"moved without a location"),
                                        ("redirect/300?to=/ok", b"moved"), ("redirect/304?to=/ok", b"")])
def test_fetch_does_not_follow_what_is_not_a_redirect(web, path, body):
    assert fetch(f"http://127.0.0.1:{web.port}/{path}", LOOPBACK, 1000, 5).data == body
    assert len(web.seen) == 1


def test_fetch_follows_five_redirects_not_six(web):
    assert fetch(f"http://127.0.0.1:{web.port}/chain/5", LOOPBACK, 1000, 5).data == b"end"
    web.reset()
    with pytest.raises(ResourceError) as caught:
        fetch(f"http://127.0.0.1:{web.port}/chain/6", LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching 'http://127.0.0.1:{web.port}/chain/0': more than 5 redirects"
    assert len(web.seen) == 6


def test_fetch_checks_each_redirect_hop(web):
    with pytest.raises(URLRefused, match="loopback address 127.0.0.2"):
        fetch(f"http://127.0.0.1:{web.port}/redirect/302?to=http://127.0.0.2:{web.port}/ok", LOOPBACK, 1000, 5)


def test_fetch_a_redirect_to_an_invalid_url_is_an_error_of_the_fetch(web):
    url = f"http://127.0.0.1:{web.port}/redirect/302?to=http://[::1/x"
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching {url!r} failed: it redirects to an invalid URL"


@pytest.mark.parametrize("code", [400, 404, 500])
def test_fetch_an_error_status_is_an_error(web, code):
    url = f"http://127.0.0.1:{web.port}/status/{code}"
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching {url!r} failed: HTTP {code}"
    assert isinstance(caught.value, FetchStatus) and caught.value.status == code  # a provider's expired link: 403


def test_fetch_an_error_after_a_redirect_names_the_url_that_failed(web):
    with pytest.raises(ResourceError) as caught:
        fetch(f"http://u:p@127.0.0.1:{web.port}/redirect/302?to=/status/403?token=abc".replace("u:p@", ""),
              LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching 'http://127.0.0.1:{web.port}/status/403?token=***' failed: HTTP 403"


def test_fetch_a_success_status_below_400_is_data(web):
    assert fetch(f"http://127.0.0.1:{web.port}/status/399", LOOPBACK, 1000, 5).data == b"status page"


MIB = 1024 * 1024


@pytest.mark.parametrize("kind", ["len", "stream"])
def test_fetch_size_limit(web, kind):
    assert len(fetch(f"http://127.0.0.1:{web.port}/{kind}/{MIB}", LOOPBACK, MIB, 5).data) == MIB
    url = f"http://127.0.0.1:{web.port}/{kind}/{MIB + 1}"
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, MIB, 5)
    assert str(caught.value) == f"{url!r} is larger than the 1 MiB limit"


def test_fetch_size_limit_names_mebibytes(web):
    url = f"http://127.0.0.1:{web.port}/len/{3 * MIB}"
    with pytest.raises(ResourceError, match=r"is larger than the 2 MiB limit$"):
        fetch(url, LOOPBACK, 2 * MIB + 5, 5)


def test_fetch_a_declared_length_over_the_limit_is_refused_before_reading(web, monkeypatch):
    streamed = []
    real = urllib3.response.HTTPResponse.stream
    monkeypatch.setattr(urllib3.response.HTTPResponse, "stream",
                        lambda self, *a, **k: streamed.append(1) or real(self, *a, **k))
    with pytest.raises(ResourceError, match="larger than"):
        fetch(f"http://127.0.0.1:{web.port}/len/11", LOOPBACK, 10, 5)
    assert streamed == []


def test_fetch_a_body_cut_short_is_an_error(web):
    url = f"http://127.0.0.1:{web.port}/short"
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching {url!r} failed: ProtocolError"


def test_fetch_nobody_listening(web):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(ResourceError) as caught:
        fetch(f"http://127.0.0.1:{port}/x?key=k", LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching 'http://127.0.0.1:{port}/x?key=***' failed: NewConnectionError"


def test_fetch_a_dribbling_peer_is_cut_at_the_timeout(web):
    url = f"http://127.0.0.1:{web.port}/dribble"
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 10_000, 0.4)
    took = time.monotonic() - started
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"
    assert 0.35 < took < 2.5, took  # the peer goes on for 5 s


def test_fetch_read_loop_stops_at_the_deadline_even_if_the_watchdog_is_late(web, late_watchdog):
    url = f"http://127.0.0.1:{web.port}/paced?token=t"
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 100 * MIB, 0.3)
    assert str(caught.value) == f"fetching 'http://127.0.0.1:{web.port}/paced?token=***' took longer than 0s"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


@pytest.fixture
def late_watchdog(monkeypatch):
    """The deadline watchdog never fires: what is left are the socket timeouts and the read loop's own check."""
    monkeypatch.setattr(urlpolicy._WATCHDOG, "add", lambda watch: None)


def test_fetch_a_silent_peer_is_cut_by_the_read_timeout_even_if_the_watchdog_is_late(web, late_watchdog):
    url = f"http://127.0.0.1:{web.port}/stall"
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 10_000, 0.3)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"  # the read timeout ends at the deadline
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


@pytest.mark.parametrize("path", ["stall", "dribble"])
def test_fetch_cut_by_the_requests_earlier_deadline_says_so(web, path):
    """Inside a request whose deadline comes before the fetch's own: the fetch ends then, and its error names the
    request's deadline, not a fetch_timeout that never ran out."""
    url = f"http://127.0.0.1:{web.port}/{path}"
    started = time.monotonic()
    with deadline_scope(started + 0.4), pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 10_000, 30)
    assert str(caught.value) == f"the request's deadline passed while fetching {url!r}"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_within_a_later_request_deadline_names_its_own_timeout(web):
    url = f"http://127.0.0.1:{web.port}/dribble"
    with deadline_scope(time.monotonic() + 60), pytest.raises(ResourceError) as caught:
        fetch(url, LOOPBACK, 10_000, 0.4)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"


@pytest.mark.parametrize("proxied", [False, True])
def test_fetch_a_body_of_unsaid_length_cut_at_the_deadline_is_no_success(web, proxied):
    """The watchdog's shutdown reads as the end of a body whose length was not said: what came so far (here one
    whole chunk, read before the deadline) must not be handed on as the whole file."""
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"]) if proxied else LOOPBACK
    url = "http://public.test/unsaid" if proxied else f"http://127.0.0.1:{web.port}/unsaid"
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch(url, policy, 100_000, 0.3, proxy=f"http://127.0.0.1:{web.port}" if proxied else None)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_through_a_proxy_a_silent_peer_is_cut_by_the_read_timeout(web, late_watchdog):
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"])
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch("http://public.test/stall", policy, 10_000, 0.3, proxy=f"http://127.0.0.1:{web.port}")
    assert str(caught.value) == "fetching 'http://public.test/stall' took longer than 0s"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_through_a_proxy_a_dribbling_peer_is_cut_at_the_timeout(web):
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"])
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch("http://public.test/dribble", policy, 10_000, 0.4, proxy=f"http://127.0.0.1:{web.port}")
    assert str(caught.value) == "fetching 'http://public.test/dribble' took longer than 0s"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_through_a_proxy_is_cut_at_the_size_limit_while_it_streams(web):
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"])
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"^'http://public.test/paced' is larger than the 0 MiB limit$"):
        fetch("http://public.test/paced", policy, 100_000, 10, proxy=f"http://127.0.0.1:{web.port}")
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_a_peer_that_never_accepts_is_cut_at_the_timeout():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    waiting = []
    for _ in range(4):  # fill the accept queue: further connects wait for a SYN answer that never comes
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        waiting.append(s)
    try:
        started = time.monotonic()
        with pytest.raises(ResourceError, match="took longer than 0s"):
            fetch(f"http://127.0.0.1:{port}/", LOOPBACK, 1000, 0.3)
        assert time.monotonic() - started < 5  # not at a 10 s connect timeout
    finally:
        for s in waiting:
            s.close()
        listener.close()


def test_fetch_a_slow_lookup_counts_against_the_timeout(web):
    def slow(host: str, port: int) -> list[str]:
        time.sleep(0.25)
        return ["127.0.0.1"]

    url = f"http://slow.test:{web.port}/ok"
    with pytest.raises(ResourceError) as caught:
        fetch(url, UrlPolicy.from_entries(["127.0.0.1"], resolver=slow), 1000, 0.2)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"
    assert web.seen == []


def test_fetch_a_slow_lookup_is_stopped_before_connecting_even_if_the_watchdog_is_late(web, late_watchdog):
    def slow(host: str, port: int) -> list[str]:
        time.sleep(0.25)
        return ["127.0.0.1"]

    with pytest.raises(ResourceError) as caught:
        fetch(f"http://slow.test:{web.port}/ok?key=k", UrlPolicy.from_entries(["127.0.0.1"], resolver=slow), 1000, 0.2)
    assert str(caught.value) == f"fetching 'http://slow.test:{web.port}/ok?key=***' took longer than 0s"
    assert web.seen == []


def test_fetch_timeout_message_rounds_to_seconds(web):
    def slow(host: str, port: int) -> list[str]:
        time.sleep(0.05)
        return ["127.0.0.1"]

    with pytest.raises(ResourceError, match="took longer than 0s"):
        fetch(f"http://slow.test:{web.port}/ok", UrlPolicy.from_entries(["127.0.0.1"], resolver=slow), 1000, 0.04)


@pytest.fixture
def frozen_clock(monkeypatch, late_watchdog):
    """urlpolicy's clock (its `time` only) stands still at 1000.0 until the test moves it."""
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(urlpolicy, "time", SimpleNamespace(monotonic=lambda: clock.now))
    return clock


def test_fetch_a_lookup_that_takes_the_whole_timeout_leaves_no_time_to_connect(web, frozen_clock):
    def slow(host: str, port: int) -> list[str]:
        frozen_clock.now += 0.5  # the answer comes at the deadline exactly
        return ["127.0.0.1"]

    url = f"http://slow.test:{web.port}/ok"
    with pytest.raises(ResourceError) as caught:
        fetch(url, UrlPolicy.from_entries(["127.0.0.1"], resolver=slow), 1000, 0.5)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"
    assert web.seen == []


@pytest.fixture
def connect_waits(monkeypatch):
    """How long each new connection's connect was allowed to wait."""
    waits = []
    real = urllib3.util.connection.create_connection

    def spy(address, timeout, *args, **kwargs):
        waits.append(timeout)
        return real(address, timeout, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", spy)
    return waits


def test_fetch_waits_at_most_10s_for_a_connect_however_long_the_fetch_may_take(web, connect_waits):
    assert fetch(f"http://127.0.0.1:{web.port}/ok", LOOPBACK, 1000, 60).data == b"hello"
    assert connect_waits == [10.0]
    connect_waits.clear()
    assert fetch(f"http://127.0.0.1:{web.port}/ok", LOOPBACK, 1000, 3).data == b"hello"
    assert len(connect_waits) == 1 and 2.5 < connect_waits[0] <= 3  # less time left: no more than that


def test_fetch_through_a_proxy_checks_the_name_and_lets_the_proxy_connect(web):
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"])
    got = fetch("http://public.test/x?y=1", policy, 1000, 5, proxy=f"http://127.0.0.1:{web.port}")
    assert got.data == b"via proxy"
    assert web.seen == [{"path": "http://public.test/x?y=1", "host": "public.test", "agent": "hugginggpt-server",
                         "x": None}]
    web.reset()
    inside = UrlPolicy(resolver=lambda host, port: ["10.1.1.1"])
    with pytest.raises(URLRefused, match="private address 10.1.1.1"):
        fetch("http://internal.test/x", inside, 1000, 5, proxy=f"http://127.0.0.1:{web.port}")
    assert web.seen == []


def test_fetch_through_a_proxy_checks_each_redirect_hop(web):
    policy = UrlPolicy(resolver=lambda host, port: ["10.1.1.1"] if host == "internal.test" else ["93.184.216.34"])
    with pytest.raises(URLRefused, match="internal.test resolves to private address 10.1.1.1"):
        fetch("http://public.test/to-internal", policy, 1000, 5, proxy=f"http://127.0.0.1:{web.port}")
    assert [s["path"] for s in web.seen] == ["http://public.test/to-internal"]


def test_fetch_through_a_proxy_a_redirect_to_an_invalid_url_is_an_error_of_the_fetch(web):
    policy = UrlPolicy(resolver=lambda host, port: ["93.184.216.34"])
    url = "http://public.test/redirect/302?to=http://[::1/x"
    with pytest.raises(ResourceError) as caught:
        fetch(url, policy, 1000, 5, proxy=f"http://127.0.0.1:{web.port}")
    assert str(caught.value) == f"fetching {url!r} failed: it redirects to an invalid URL"
    assert len(web.seen) == 1


def test_fetch_a_proxy_that_is_not_there(web):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    policy = UrlPolicy(resolver=lambda host, p: ["93.184.216.34"])
    with pytest.raises(ResourceError, match=r"^fetching 'http://public.test/x' failed: ProxyError$"):
        fetch("http://public.test/x", policy, 1000, 5, proxy=f"http://127.0.0.1:{port}")


# -- https: a CA of the test's own, trusted through SSL_CERT_FILE -------------------------------------------


def _certificates(folder):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test ca")).issuer_name(name("test ca"))
          .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(name("secure.test")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(2).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("secure.test")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "leaf.pem").write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return folder / "ca.pem", folder / "leaf.pem"


@pytest.fixture(scope="module")
def tls_peer(tmp_path_factory):
    ca, leaf = _certificates(tmp_path_factory.mktemp("tls"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(leaf)
    names = []
    context.sni_callback = lambda sock, server_name, ctx: names.append(server_name)
    server = Peer(context)
    server.names = names
    server.ca = ca
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def tls(tls_peer, monkeypatch):
    tls_peer.reset()
    tls_peer.names.clear()
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_peer.ca))
    return tls_peer


TO_LOOPBACK = UrlPolicy.from_entries(["127.0.0.1"], resolver=lambda host, port: ["127.0.0.1"])


def test_fetch_https_connects_to_the_checked_address_and_verifies_the_name(tls):
    got = fetch(f"https://secure.test:{tls.port}/ok", TO_LOOPBACK, 1000, 5)
    assert got.data == b"hello"
    assert tls.names == ["secure.test"]
    assert tls.seen[0]["host"] == f"secure.test:{tls.port}"


def test_fetch_https_refuses_a_certificate_for_another_name(tls):
    url = f"https://other.test:{tls.port}/ok"
    with pytest.raises(ResourceError) as caught:
        fetch(url, TO_LOOPBACK, 1000, 5)
    assert str(caught.value) == f"fetching {url!r} failed: SSLError"
    assert tls.seen == []


def test_fetch_https_a_silent_peer_is_cut_by_the_read_timeout_even_if_the_watchdog_is_late(tls, late_watchdog):
    url = f"https://secure.test:{tls.port}/stall"
    started = time.monotonic()
    with pytest.raises(ResourceError) as caught:
        fetch(url, TO_LOOPBACK, 10_000, 0.3)
    assert str(caught.value) == f"fetching {url!r} took longer than 0s"  # the read timeout ends at the deadline
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_fetch_https_refuses_an_untrusted_certificate(tls, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(ResourceError, match="failed: SSLError"):
        fetch(f"https://secure.test:{tls.port}/ok", TO_LOOPBACK, 1000, 5)
    assert tls.seen == []


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_watched_https_pool_is_cut_at_the_deadline(tls):
    session = requests.Session()
    session.mount("https://", watched_adapter())
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 0.3), pytest.raises(requests.RequestException):
        _ = session.get(f"https://127.0.0.1:{tls.port}/dribble", verify=False, timeout=5).content
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


# -- deadline scopes and their watch --------------------------------------------------------------------------


def is_shut(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False


@pytest.fixture
def pairs():
    made = []

    def pair():
        a, b = socket.socketpair()
        made.extend((a, b))
        return a

    yield pair
    for s in made:
        s.close()


def test_watch_fire_shuts_registered_sockets_and_any_registered_later(pairs):
    watch = _Watch(math.inf)
    a, b = pairs(), pairs()
    watch.register(a)
    watch.register(None)
    assert not is_shut(a) and not watch.fired
    watch.fire()
    assert watch.fired and is_shut(a) and not is_shut(b)
    watch.register(b)
    assert is_shut(b)


def test_watch_a_socket_given_back_to_its_pool_is_not_shut(pairs):
    watch = _Watch(math.inf)
    a, b = pairs(), pairs()
    watch.register(a)
    watch.register(a)
    watch.register(b)
    watch.unregister(a)
    watch.unregister(None)
    watch.unregister(pairs())
    watch.fire()
    assert not is_shut(a) and is_shut(b)


def test_watch_socket_in_use_is_shut_on_cancel_not_at_the_deadline(pairs):
    watch = _Watch(math.inf)
    a, b, c = pairs(), pairs(), pairs()
    watch.register(b)
    with watch.using(a), watch.using(None):
        watch.fire()
        assert not is_shut(a) and is_shut(b)
        watch.cancel()
        assert is_shut(a)
    assert watch.cancelled and watch.fired
    with watch.using(c):  # cancelled already: shut at once
        assert is_shut(c)


def test_watch_a_socket_no_longer_in_use_is_not_shut_on_cancel(pairs):
    watch = _Watch(math.inf)
    a, b = pairs(), pairs()
    with watch.using(a):
        pass
    watch.register(b)
    watch.cancel()
    assert not is_shut(a) and is_shut(b)
    assert watch.fired and watch.cancelled


def test_watch_after_finish_takes_and_gives_back_sockets_harmlessly(pairs):
    watch = _Watch(math.inf)
    watch.finish()
    a = pairs()
    watch.register(a)
    watch.unregister(a)
    watch.unregister(pairs())
    assert not is_shut(a)


def test_watch_after_finish_shuts_nothing(pairs):
    watch = _Watch(math.inf)
    a, b = pairs(), pairs()
    watch.register(a)
    with watch.using(b):
        watch.finish()
        watch.cancel()
        watch.fire()
    assert not is_shut(a) and not is_shut(b)
    assert not watch.fired and not watch.cancelled and watch.done


def wait_until(condition, within: float = 3.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


def test_watchdog_fires_each_watch_at_its_deadline(pairs):
    dog = _Watchdog()
    late, early = _Watch(time.monotonic() + 30), _Watch(time.monotonic() + 0.3)
    sock = pairs()
    early.register(sock)
    before = {t.ident for t in threading.enumerate()}
    dog.add(late)
    dog.add(early)  # an earlier deadline than the one it sleeps for wakes it
    same = _Watch(early.deadline)  # the same deadline twice
    dog.add(same)
    started = [t for t in threading.enumerate() if t.ident not in before]
    assert [(t.name, t.daemon) for t in started] == [("deadline-watchdog", True)]  # one thread, whatever the count
    assert not early.fired
    assert wait_until(lambda: early.fired and same.fired)
    assert time.monotonic() >= early.deadline
    assert is_shut(sock) and not late.fired
    late.finish()


def test_watchdog_skips_finished_watches_and_goes_on():
    dog = _Watchdog()
    done, later = _Watch(time.monotonic() + 0.02), _Watch(time.monotonic() + 0.08)
    dog.add(done)
    done.finish()
    dog.add(later)
    assert wait_until(lambda: later.fired)
    assert not done.fired
    again = _Watch(time.monotonic() + 0.02)  # after its heap ran empty, a new watch still fires
    time.sleep(0.05)
    dog.add(again)
    assert wait_until(lambda: again.fired)


def test_deadline_scope_without_deadline_or_request_is_none():
    with deadline_scope(None) as watch:
        assert watch is None
        assert current_deadline() is None


def test_deadline_scope_sets_and_restores_the_deadline():
    assert current_deadline() is None
    deadline = time.monotonic() + 10
    with deadline_scope(deadline) as watch:
        assert watch.deadline == deadline and current_deadline() == deadline
        with deadline_scope(deadline + 5) as inner:  # a later deadline does not extend the outer one
            assert inner is watch
        with deadline_scope(deadline) as inner:
            assert inner is watch
        with deadline_scope(None) as inner:
            assert inner is watch
        with deadline_scope(deadline - 5) as inner:  # an earlier one wins while it runs
            assert inner is not watch and current_deadline() == deadline - 5
        assert inner.done and current_deadline() == deadline
        assert not watch.done
    assert watch.done and current_deadline() is None


def test_deadline_scope_shuts_registered_sockets_at_the_deadline(pairs):
    a = pairs()
    with deadline_scope(time.monotonic() + 0.05) as watch:
        _register_socket(a)
        assert wait_until(lambda: watch.fired)
        assert is_shut(a)


def test_register_socket_outside_a_scope_does_nothing(pairs):
    a = pairs()
    _register_socket(a)
    assert not is_shut(a)


def in_request(fn, token: cancel.CancelToken):
    def run():
        cancel.CURRENT.set(token)
        return fn()

    return contextvars.Context().run(run)


def test_deadline_scope_of_a_cancellable_request_without_deadline(pairs):
    token = cancel.CancelToken()
    a, b = pairs(), pairs()

    def work():
        with deadline_scope(None) as watch:
            assert watch is not None and watch.deadline == math.inf
            assert current_deadline() is None
            _register_socket(a)
            token.cancel()
            assert watch.cancelled and is_shut(a)
        _register_socket(b)
        return watch

    watch = in_request(work, token)
    assert watch.done and not is_shut(b)


def test_deadline_scope_of_a_cancelled_request_shuts_at_once(pairs):
    token = cancel.CancelToken()
    token.cancel()
    a = pairs()

    def work():
        with deadline_scope(time.monotonic() + 30) as watch:
            assert watch.cancelled
            _register_socket(a)
            assert is_shut(a)

    in_request(work, token)


def test_deadline_scope_unhooks_from_the_request_when_it_ends(pairs):
    token = cancel.CancelToken()

    def work():
        with deadline_scope(time.monotonic() + 30) as watch:
            pass
        return watch

    watch = in_request(work, token)
    token.cancel()
    assert not watch.cancelled


# -- urllib3 pools and requests adapter -----------------------------------------------------------------------


def test_watched_pool_is_cut_at_the_deadline(web):
    pool = WatchedHTTPConnectionPool("127.0.0.1", web.port, timeout=5, retries=False)
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 0.3), pytest.raises(urllib3.exceptions.HTTPError):
        _ = pool.urlopen("GET", "/dribble").data
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s
    pool.close()


def test_watched_pool_connection_back_in_the_pool_is_not_shut_at_the_deadline(web):
    pool = WatchedHTTPConnectionPool("127.0.0.1", web.port, timeout=5, retries=False, maxsize=1)
    with deadline_scope(time.monotonic() + 0.3) as watch:
        assert pool.urlopen("GET", "/ok").data == b"hello"
        assert wait_until(lambda: watch.fired)
    assert pool.urlopen("GET", "/ok").data == b"hello"
    assert web.connections == 1  # the kept-alive connection served both
    pool.close()


def test_watched_pool_classes():
    assert WATCHED_POOL_CLASSES == {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}


def test_watched_adapter_is_cut_at_the_deadline_and_takes_adapter_options(web):
    adapter = watched_adapter(max_retries=3, pool_maxsize=7, pool_block=True)
    assert adapter.max_retries.total == 3
    assert adapter.poolmanager.connection_pool_kw["maxsize"] == 7
    assert adapter.poolmanager.connection_pool_kw["block"] is True
    session = requests.Session()
    session.mount("http://", adapter)
    assert session.get(f"http://127.0.0.1:{web.port}/ok", timeout=5).text == "hello"
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 0.3), pytest.raises(requests.RequestException):
        _ = session.get(f"http://127.0.0.1:{web.port}/dribble", timeout=5).content
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s
    session.close()


# -- httpcore2 backends ---------------------------------------------------------------------------------------


class FakeStream(httpcore2.NetworkStream):
    def __init__(self, sock=None, on_read=None):
        self.calls: list[tuple] = []
        self.sock = sock
        self.on_read = on_read

    def read(self, max_bytes, timeout=None):
        self.calls.append(("read", max_bytes, timeout))
        if self.on_read:
            self.on_read()
        return b"data"

    def write(self, buffer, timeout=None):
        self.calls.append(("write", buffer, timeout))

    def close(self):
        self.calls.append(("close",))

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        self.calls.append(("start_tls", ssl_context, server_hostname, timeout))
        return FakeStream(self.sock)

    def get_extra_info(self, info):
        return {"socket": self.sock, "is_readable": "yes"}.get(info)


class FakeBackend(httpcore2.NetworkBackend):
    def __init__(self):
        self.calls: list[tuple] = []

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        self.calls.append(("tcp", host, port, timeout, local_address, socket_options))
        return FakeStream()

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        self.calls.append(("unix", path, timeout, socket_options))
        return FakeStream()

    def sleep(self, seconds):
        self.calls.append(("sleep", seconds))


def test_deadline_stream_outside_a_scope_passes_timeouts_through():
    inner = FakeStream()
    stream = _DeadlineStream(inner)
    assert stream.read(10, 5.0) == b"data"
    stream.read(11)
    stream.write(b"x", 2.0)
    stream.write(b"y")
    stream.close()
    assert inner.calls == [("read", 10, 5.0), ("read", 11, None), ("write", b"x", 2.0), ("write", b"y", None),
                           ("close",)]
    assert stream.get_extra_info("is_readable") == "yes"


def test_deadline_stream_clamps_each_timeout_to_the_deadline():
    inner = FakeStream()
    stream = _DeadlineStream(inner)
    with deadline_scope(time.monotonic() + 20):
        stream.read(10, 30.0)
        stream.read(10, 0.5)
        stream.read(10)
        stream.write(b"x", 30.0)
        stream.write(b"x")
    timeouts = [call[2] for call in inner.calls]
    assert 15 < timeouts[0] <= 20 and timeouts[1] == 0.5 and 15 < timeouts[2] <= 20
    assert 15 < timeouts[3] <= 20 and 15 < timeouts[4] <= 20


def test_deadline_stream_less_than_a_second_left_is_still_time():
    inner = FakeStream()
    with deadline_scope(time.monotonic() + 0.5):
        _DeadlineStream(inner).read(10, 30.0)
    assert 0 < inner.calls[0][2] <= 0.5


@pytest.mark.parametrize("call, error", [
    (lambda s: s.read(10, 5.0), httpcore2.ReadTimeout),
    (lambda s: s.write(b"x", 5.0), httpcore2.WriteTimeout),
    (lambda s: s.start_tls(None, "h", 5.0), httpcore2.ConnectTimeout),
])
def test_deadline_stream_past_the_deadline_times_out_at_once(call, error):
    inner = FakeStream()
    with deadline_scope(time.monotonic() - 0.001), pytest.raises(error) as caught:
        call(_DeadlineStream(inner))
    assert type(caught.value) is error and str(caught.value) == "the request's deadline passed"
    assert inner.calls == []


@pytest.mark.parametrize("call, error", [
    (lambda s: s.read(10, 5.0), httpcore2.ReadTimeout),
    (lambda s: s.write(b"x", 5.0), httpcore2.WriteTimeout),
    (lambda s: s.start_tls(None, "h", 5.0), httpcore2.ConnectTimeout),
])
def test_deadline_stream_at_the_deadline_exactly_times_out_at_once(call, error, frozen_clock):
    inner = FakeStream()
    with deadline_scope(frozen_clock.now), pytest.raises(error) as caught:
        call(_DeadlineStream(inner))
    assert type(caught.value) is error and str(caught.value) == "the request's deadline passed"
    assert inner.calls == []


def test_deadline_backend_at_the_deadline_exactly_does_not_connect(frozen_clock):
    inner = FakeBackend()
    with deadline_scope(frozen_clock.now), pytest.raises(httpcore2.ConnectTimeout, match="deadline passed"):
        DeadlineBackend(inner).connect_tcp("example.com", 443, 30.0)
    assert inner.calls == []


@pytest.mark.parametrize("call, error", [
    (lambda s: s.read(10, 5.0), httpcore2.ReadTimeout),
    (lambda s: s.write(b"x", 5.0), httpcore2.WriteTimeout),
])
def test_deadline_stream_of_a_cancelled_request_stops_at_once(call, error):
    token = cancel.CancelToken()
    token.cancel()
    inner = FakeStream()

    def work():
        with pytest.raises(error) as caught:
            call(_DeadlineStream(inner))
        return caught.value

    exc = in_request(work, token)
    assert type(exc) is error and str(exc) == "the request was cancelled"
    assert inner.calls == []


def test_deadline_stream_socket_is_shut_when_the_request_is_cancelled_mid_read(pairs):
    token = cancel.CancelToken()
    sock = pairs()
    inner = FakeStream(sock, on_read=token.cancel)

    def work():
        with deadline_scope(time.monotonic() + 30):
            _DeadlineStream(inner).read(10, 5.0)

    in_request(work, token)
    assert is_shut(sock)


def test_deadline_stream_socket_is_not_shut_by_a_cancel_after_the_read(pairs):
    token = cancel.CancelToken()
    sock = pairs()
    inner = FakeStream(sock)

    def work():
        with deadline_scope(time.monotonic() + 30):
            stream = _DeadlineStream(inner)
            stream.read(10, 5.0)
            stream.write(b"x", 5.0)
            token.cancel()

    in_request(work, token)
    assert not is_shut(sock)


def test_deadline_stream_socket_is_shut_when_cancelled_mid_write(pairs):
    token = cancel.CancelToken()
    sock = pairs()

    class Writer(FakeStream):
        def write(self, buffer, timeout=None):
            token.cancel()

    def work():
        with deadline_scope(time.monotonic() + 30):
            _DeadlineStream(Writer(sock)).write(b"x", 5.0)

    in_request(work, token)
    assert is_shut(sock)


def test_deadline_stream_start_tls_wraps_the_new_stream():
    inner = FakeStream()
    context = object()
    with deadline_scope(time.monotonic() + 20):
        tls = _DeadlineStream(inner).start_tls(context, "example.com", 30.0)
        assert isinstance(tls, _DeadlineStream)
        tls.read(5, 30.0)
        _DeadlineStream(inner).start_tls(context, "example.com", 0.5)
    (name, ctx, host, timeout), second = inner.calls
    assert (name, ctx, host) == ("start_tls", context, "example.com") and 15 < timeout <= 20
    assert second == ("start_tls", context, "example.com", 0.5)
    assert 15 < tls._inner.calls[0][2] <= 20


def test_deadline_backend_connects_with_the_time_left():
    inner = FakeBackend()
    backend = DeadlineBackend(inner)
    with deadline_scope(time.monotonic() + 20):
        stream = backend.connect_tcp("example.com", 443, 30.0, "0.0.0.0", ["opt"])
        assert isinstance(stream, _DeadlineStream)
        backend.connect_tcp("example.com", 443, 0.5)
        unix = backend.connect_unix_socket("/tmp/s", 3.0, ["o"])
        assert isinstance(unix, _DeadlineStream)
    backend.sleep(0.25)
    (name, host, port, timeout, local, options), short, unix_call, sleep_call = inner.calls
    assert (name, host, port, local, options) == ("tcp", "example.com", 443, "0.0.0.0", ["opt"])
    assert 15 < timeout <= 20
    assert short == ("tcp", "example.com", 443, 0.5, None, None)
    assert unix_call == ("unix", "/tmp/s", 3.0, ["o"]) and sleep_call == ("sleep", 0.25)
    with deadline_scope(time.monotonic() - 0.001), pytest.raises(httpcore2.ConnectTimeout):
        backend.connect_tcp("example.com", 443, 30.0)
    assert len(inner.calls) == 4


def test_deadline_backend_defaults_to_real_sockets(web):
    stream = DeadlineBackend().connect_tcp("127.0.0.1", web.port, 5.0)
    stream.write(b"GET /ok HTTP/1.0\r\n\r\n", 5.0)
    data = b""
    while chunk := stream.read(4096, 5.0):
        data += chunk
    stream.close()
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"hello")


def test_pinned_backend_connects_only_to_the_checked_address():
    inner = FakeBackend()
    backend = PinnedBackend({("Example.COM.", 443): "93.184.216.34"}, inner)
    backend.connect_tcp("EXAMPLE.com", 443, 5.0, "0.0.0.0", ["opt"])
    assert inner.calls == [("tcp", "93.184.216.34", 443, 5.0, "0.0.0.0", ["opt"])]
    with pytest.raises(httpcore2.ConnectError) as caught:
        backend.connect_tcp("example.com", 80, 5.0)
    assert str(caught.value) == "example.com:80 was not checked by the URL policy"
    with pytest.raises(httpcore2.ConnectError) as caught:
        backend.connect_tcp("other.test", 443, 5.0)
    assert str(caught.value) == "other.test:443 was not checked by the URL policy"
    with pytest.raises(httpcore2.ConnectError) as caught:
        backend.connect_unix_socket("/tmp/s")
    assert str(caught.value) == "a pinned client connects only to checked addresses"
    backend.sleep(0.5)
    assert inner.calls[1:] == [("sleep", 0.5)]


def test_pinned_backend_matches_an_ipv6_host_written_in_brackets():
    inner = FakeBackend()
    PinnedBackend({("[2001:DB8::1]", 443): "2001:db8::1"}, inner).connect_tcp("2001:db8::1", 443, 5.0)
    assert inner.calls == [("tcp", "2001:db8::1", 443, 5.0, None, None)]


def test_pinned_backend_defaults_to_real_sockets(web):
    stream = PinnedBackend({("pinned.test", web.port): "127.0.0.1"}).connect_tcp("pinned.test", web.port, 5.0)
    stream.write(b"GET /ok HTTP/1.0\r\n\r\n", 5.0)
    assert stream.read(4096, 5.0).startswith(b"HTTP/1.1 200")
    stream.close()


def test_bound_by_deadlines_pins_an_httpx_client(web):
    transport = bound_by_deadlines(httpx2.HTTPTransport(), pins={("pinned.test", web.port): "127.0.0.1"})
    with httpx2.Client(transport=transport) as client:
        resp = client.get(f"http://pinned.test:{web.port}/ok")
        assert resp.text == "hello"
        assert web.seen[-1]["host"] == f"pinned.test:{web.port}"
        with pytest.raises(httpx2.ConnectError, match=f"other.test:{web.port} was not checked by the URL policy"):
            client.get(f"http://other.test:{web.port}/ok")


def test_bound_by_deadlines_cuts_an_httpx_client_at_the_deadline(web):
    transport = bound_by_deadlines(httpx2.HTTPTransport())
    with httpx2.Client(transport=transport, timeout=5) as client:
        assert client.get(f"http://127.0.0.1:{web.port}/ok").text == "hello"
        started = time.monotonic()
        with deadline_scope(time.monotonic() + 0.3), pytest.raises(httpx2.TimeoutException):
            client.get(f"http://127.0.0.1:{web.port}/dribble")
        assert time.monotonic() - started < 2.5  # the peer goes on for 5 s


def test_bound_by_deadlines_wraps_once():
    transport = httpx2.HTTPTransport()
    assert bound_by_deadlines(bound_by_deadlines(transport)) is transport
    backend = transport._pool._network_backend
    assert isinstance(backend, DeadlineBackend) and isinstance(backend._inner, httpcore2.SyncBackend)
    pinned = bound_by_deadlines(httpx2.HTTPTransport(), pins={})._pool._network_backend
    assert isinstance(pinned._inner, PinnedBackend)


@pytest.mark.parametrize("pins, address", [(None, "example.com"), ({("example.com", 443): "93.184.216.34"},
                                                                    "93.184.216.34")])
def test_bound_by_deadlines_keeps_the_transports_own_network_backend(pins, address):
    inner = FakeBackend()
    transport = SimpleNamespace(_pool=SimpleNamespace(_network_backend=inner))
    assert bound_by_deadlines(transport, pins=pins) is transport
    transport._pool._network_backend.connect_tcp("example.com", 443, 5.0)
    assert inner.calls == [("tcp", address, 443, 5.0, None, None)]


def test_bound_by_deadlines_leaves_other_transports_alone():
    plain = object()
    assert bound_by_deadlines(plain) is plain
    odd = type("T", (), {"_pool": object()})()
    assert bound_by_deadlines(odd) is odd


# -- a thread that never entered a deadline scope (a worker of a client, no request around it) ------------------


def in_fresh_thread(fn):
    """What `fn` returns, run in a new thread: its `deadline_scope` state was never set."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_watched_pool_works_in_a_thread_that_never_had_a_deadline_scope(web):
    pool = WatchedHTTPConnectionPool("127.0.0.1", web.port, timeout=5, retries=False, maxsize=1)
    assert in_fresh_thread(lambda: [pool.urlopen("GET", "/ok").data for _ in range(2)]) == [b"hello", b"hello"]
    assert web.connections == 1  # the connection went back to the pool and served the second request
    pool.close()


def test_watched_adapter_works_in_a_thread_that_never_had_a_deadline_scope(web):
    session = requests.Session()
    session.mount("http://", watched_adapter())
    assert in_fresh_thread(lambda: session.get(f"http://127.0.0.1:{web.port}/ok", timeout=5).text) == "hello"
    session.close()


def test_bound_httpx_client_works_in_a_thread_that_never_had_a_deadline_scope(web):
    with httpx2.Client(transport=bound_by_deadlines(httpx2.HTTPTransport()), timeout=5) as client:
        assert in_fresh_thread(lambda: client.get(f"http://127.0.0.1:{web.port}/ok").text) == "hello"
