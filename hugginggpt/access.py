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
    given_bytes = given.encode("utf-8", "surrogateescape")
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(given_bytes, token.encode("utf-8", "surrogateescape"))
    return ok


def send_public_file(public_dir: Path, relative: str) -> Response:
    """A file under public/; a path or a symlink that leads outside it is a 404, like a missing file."""
    try:
        path = public_file(relative, public_dir)
    except ResourceError:
        raise NotFound("no such file") from None
    resp = send_file(path, conditional=True, max_age=0)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp
