"""access.py on its own: who may call (bearer tokens, Host, Origin) and which files are served.

The same rules are exercised through both servers in test_keys_and_access.py and test_hostile_round3.py; these
pin each rule's edge cases directly, fast enough for CI's quick mutation check.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from flask import Flask
from werkzeug.exceptions import NotFound

from hugginggpt.access import (
    ANY_ADDRESS,
    LOOPBACK_NAMES,
    allowed_host_names,
    bearer_ok,
    bearer_token,
    host_allowed,
    host_name,
    is_ip_literal,
    origin_is_local_or_same,
    send_public_file,
)


@pytest.mark.parametrize("header, token", [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),
    ("BEARER abc", "abc"),
    ("  Bearer   abc  ", "abc"),
    ("Bearer a b", "a b"),
    ("Basic abc", None),
    ("Bearer", None),
    ("Bearer    ", None),
    ("Bearerabc", None),
    ("", None),
    (None, None),
])
def test_bearer_token_reads_only_the_bearer_scheme(header, token):
    assert bearer_token(header) == token


def test_bearer_ok_accepts_any_configured_token_and_nothing_else():
    tokens = ["tok-one", "tok-two", "tok-three"]
    assert bearer_ok("Bearer tok-two", tokens)  # a match that is not the last token still counts
    assert bearer_ok("Bearer tok-one", tokens)
    assert bearer_ok("Bearer tok-three", tokens)
    assert not bearer_ok("Bearer tok-four", tokens)
    assert not bearer_ok("Bearer tok-tw", tokens)
    assert not bearer_ok("Basic tok-two", tokens)
    assert not bearer_ok(None, tokens)
    assert not bearer_ok("Bearer tok-two", [])


def test_bearer_ok_compares_any_text_without_raising():
    assert bearer_ok("Bearer clé-✓", ["clé-✓"])
    assert bearer_ok("Bearer \udcff", ["\udcff"])  # a lone surrogate, as WSGI can hand it over
    assert not bearer_ok("Bearer \udcff", ["x"])


@pytest.mark.parametrize("header, name", [
    ("Example.COM:8080", "example.com"),
    ("example.com.", "example.com"),
    ("example.com.:80", "example.com"),
    ("  a.b  ", "a.b"),
    ("[::1]:8004", "::1"),
    ("[::1]", "::1"),
    ("[::1", "[::1"),
    ("[::1]:80]", "::1"),
    ("a:b:c", "a:b:c"),
    (":8004", ""),
    ("::1", "::1"),
    ("127.0.0.1:5000", "127.0.0.1"),
    ("", ""),
    (None, ""),
])
def test_host_name_is_the_name_without_port_case_or_trailing_dot(header, name):
    assert host_name(header) == name


def test_is_ip_literal():
    assert is_ip_literal("10.1.2.3")
    assert is_ip_literal("::1")
    assert not is_ip_literal("example.com")
    assert not is_ip_literal("")


def test_allowed_host_names_are_loopback_the_listen_name_this_machine_and_extra():
    names = allowed_host_names("MyBox.lan", ["Models.Internal:8005", ""])
    assert LOOPBACK_NAMES <= names
    assert {"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"} <= names
    assert "mybox.lan" in names
    assert "models.internal" in names
    assert socket.gethostname().lower() in names
    assert "" not in names
    assert names == LOOPBACK_NAMES | {"mybox.lan", "models.internal", socket.gethostname().lower()}


@pytest.mark.parametrize("listen", sorted(ANY_ADDRESS) + [None])
def test_a_listen_address_that_is_every_interface_adds_no_name(listen):
    assert allowed_host_names(listen) == LOOPBACK_NAMES | {socket.gethostname().lower()}
    assert ANY_ADDRESS == {"", "0.0.0.0", "::", "*"}


def test_host_allowed_takes_listed_names_and_ip_literals_only():
    allowed = allowed_host_names("127.0.0.1", ["api.example"])
    assert host_allowed("api.example:443", allowed)
    assert host_allowed("LOCALHOST:8004", allowed)
    assert host_allowed("203.0.113.9:80", allowed)
    assert host_allowed("[2001:db8::1]:80", allowed)
    assert not host_allowed("rebind.attacker.test", allowed)
    assert not host_allowed("", allowed)
    assert not host_allowed(None, allowed)
    assert not host_allowed(":80", allowed)


@pytest.mark.parametrize("origin, host, ok", [
    ("http://localhost:3000", "api.example", True),
    ("https://127.0.0.1", "api.example", True),
    ("http://[::1]:5173", "api.example", True),
    ("HTTP://LOCALHOST", "api.example", True),
    ("http://api.example:8004", "api.example:8004", True),
    ("http://API.example:8004", " api.EXAMPLE:8004 ", True),
    ("http://api.example:8004", "api.example:9000", False),
    ("http://evil.example", "api.example", False),
    ("http://evil.example", None, False),
    ("http://xxxx", None, False),
    ("http://xxxx", "", False),
    ("ftp://localhost", "api.example", False),
    ("file://localhost/x", "localhost", False),
    ("http://", "", False),
    ("null", "null", False),
    ("http://[::1", "api.example", False),
    ("  http://localhost  ", "api.example", True),
])
def test_origin_is_local_or_same(origin, host, ok):
    assert origin_is_local_or_same(origin, host) is ok


@pytest.fixture
def site(tmp_path: Path) -> Path:
    public = tmp_path / "public"
    (public / "images").mkdir(parents=True)
    (public / "images" / "a.txt").write_text("hello public")
    (tmp_path / "secret.txt").write_text("not public")
    (public / "images" / "link.txt").symlink_to(tmp_path / "secret.txt")
    return public


def test_send_public_file_serves_a_file_under_public_without_caching_or_sniffing(site):
    app = Flask(__name__)
    with app.test_request_context("/images/a.txt"):
        resp = send_public_file(site, "/images/a.txt")
        resp.direct_passthrough = False
        assert resp.status_code == 200
        assert resp.get_data() == b"hello public"
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Cache-Control"] == "no-cache, max-age=0"
        assert resp.headers.get("Last-Modified")  # conditional: a browser may revalidate


def test_send_public_file_answers_304_to_a_revalidation(site):
    app = Flask(__name__)
    with app.test_request_context("/images/a.txt"):
        etag = send_public_file(site, "images/a.txt").headers["ETag"]
    with app.test_request_context("/images/a.txt", headers={"If-None-Match": etag}):
        assert send_public_file(site, "images/a.txt").status_code == 304


@pytest.mark.parametrize("path", ["/images/missing.txt", "/../secret.txt", "/images/link.txt", "/images/a.txt\x00"])
def test_send_public_file_gives_404_for_anything_else(site, path):
    app = Flask(__name__)
    with app.test_request_context("/"), pytest.raises(NotFound) as err:
        send_public_file(site, path)
    assert err.value.description == "no such file"
