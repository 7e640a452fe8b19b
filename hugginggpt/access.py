"""Who may call a server and what it may read: bearer tokens and files served from public/.

Shared by the orchestration server and the models server, so both check a token and serve a file
the same way.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from pathlib import Path

from flask import Response, send_file
from werkzeug.exceptions import NotFound

from .errors import ResourceError
from .resources import public_file


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def bearer_ok(header: str | None, tokens: Iterable[str]) -> bool:
    """Constant-time comparison against every configured token."""
    given = bearer_token(header)
    if given is None:
        return False
    given_bytes = given.encode(errors="surrogateescape")
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given_bytes, token.encode(errors="surrogateescape"))
    return ok


def send_public_file(public_dir: Path, relative: str) -> Response:
    """A file under public/; a path or a symlink that leads outside it is a 404, like a missing file."""
    try:
        path = public_file(relative, public_dir)
    except ResourceError:
        raise NotFound("no such file") from None
    resp = send_file(path, max_age=0)  # conditional (ETag, Last-Modified) by default: a browser may revalidate
    resp.headers["X-Content-Type-Options"] = "nosniff"  # pragma: no mutate: header names are case-insensitive
    return resp


LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain", "ip6-localhost"})
ANY_ADDRESS = frozenset({"", "0.0.0.0", "::", "*"})


def host_name(host_header: str | None) -> str:
    """The name in a `Host` header, lower case, without its port or a trailing dot ('' when absent)."""
    host = (host_header or "").strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    name, colon, _port = host.rpartition(":")
    if colon and ":" not in name:  # one colon: a port (more than one: a bare IPv6 address)
        host = name
    return host[:-1] if host.endswith(".") else host


def is_ip_literal(name: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_host_names(listen_host: str | None, extra: Iterable[str] = ()) -> frozenset[str]:
    """Names a client may put in `Host` when it reaches this server: loopback, the listen address when it is a
    name, this machine's own name, and `extra` (e.g. `models_server_hosts`). IP literals are always accepted
    (DNS rebinding needs a name)."""
    import socket

    names = set(LOOPBACK_NAMES) | {host_name(e) for e in extra if e}
    if listen_host and listen_host not in ANY_ADDRESS:
        names.add(host_name(listen_host))
    try:
        names.add(socket.gethostname().lower())
    except OSError:  # pragma: no cover
        pass
    return frozenset(names)


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    name = host_name(host_header)
    return bool(name) and (name in allowed or is_ip_literal(name))


def origin_is_local_or_same(origin: str, host_header: str | None) -> bool:
    """A browser `Origin` this server may serve without a token: its own origin or a loopback page."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(origin.strip())
        name = (parts.hostname or "").lower()
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not name:
        return False
    return name in ("localhost", "127.0.0.1", "::1") or parts.netloc.lower() == (host_header or "").strip().lower()
