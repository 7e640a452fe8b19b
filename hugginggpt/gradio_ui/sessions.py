"""What each visitor's browser owns in the Gradio app, and the door that keeps it theirs.

Left alone, Gradio serves every file in its upload folder to anyone who names it (`/gradio_api/file=<path>`,
the folders named by content hashes) and takes any file there as an event's input. Here each browser gets a
visitor id: a random HttpOnly cookie set on its first request (also for API clients: gradio_client keeps the
cookies of its first `/config`). Then:

- `VisitorFiles` records which files in Gradio's folders each visitor uploaded, or was shown as the output of
  their own run; the files the app shows everyone (the examples) are public.
- `PrivateFiles` (ASGI middleware) answers a file of Gradio's folders only to a visitor who owns it (404 for
  anyone else), records each upload as its uploader's, and closes what this app does not use that could hand
  a session's values or files to someone else (`/gradio_api/deep_link`, `file=<URL>`).
- `launch_options` is what `demo.launch` needs for that, with the run history off: Gradio's run history keeps
  each event's inputs (the settings' API key among them) in the browser's localStorage.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

COOKIE = "hugginggpt-visitor"  # SameSite=Lax: the app opened on its own
CROSS_SITE_COOKIE = "hugginggpt-visitor-x"  # SameSite=None; Secure; Partitioned: the app inside a Space's iframe
VISITOR_ID = re.compile(r"^[A-Za-z0-9_-]{32}$")
FILE_ROUTE = re.compile(r"^.*?/gradio_api/file[=/](.*)$", re.DOTALL)
UPLOAD_ROUTE = re.compile(r"^.*?/gradio_api/upload/?$")
CLOSED_ROUTES = re.compile(r"^.*?/gradio_api/deep_link/?$")
MAX_TRACKED = 50_000  # files remembered; past that, forgotten once gone from disk (Gradio's cache ages them out)


def new_visitor_id() -> str:
    return secrets.token_urlsafe(24)  # 192 random bits, 32 characters


def visitor_from_cookies(cookies: Mapping[str, str]) -> str | None:
    for name in (CROSS_SITE_COOKIE, COOKIE):
        value = cookies.get(name) or ""
        if VISITOR_ID.match(value):
            return value
    return None


def visitor_of(request: Any) -> str | None:
    """The visitor id of a `gr.Request` (its cookies), or None (an app launched without `PrivateFiles`)."""
    try:
        cookies = request.cookies
    except AttributeError:
        return None
    return visitor_from_cookies(cookies or {})


def _key(path: str | os.PathLike) -> str:
    return str(Path(os.path.abspath(os.fspath(path))).resolve())


def _is_url(value: str) -> bool:
    return "://" in value[:16] or value.lower().startswith(("http:", "https:", "//"))


class VisitorFiles:
    """The files in Gradio's folders that each visitor may read and use as input; all the rest are refused."""

    def __init__(self, roots: Iterable[str | os.PathLike] | None = None):
        if roots is None:
            from gradio.utils import get_cache_folder, get_upload_folder

            roots = [get_upload_folder(), get_cache_folder()]
        self.roots = [Path(_key(r)) for r in roots]
        self._owners: dict[str, set[str]] = {}
        self._public: set[str] = set()
        self._lock = threading.Lock()

    def guarded(self, path: str | os.PathLike) -> bool:
        """True for a path in Gradio's own folders (where its uploads and cached outputs live)."""
        try:
            key = Path(_key(path))
        except (OSError, ValueError, RuntimeError):
            return True
        return any(key == root or root in key.parents for root in self.roots)

    def add_public(self, paths: Iterable[str]) -> None:
        with self._lock:
            self._public.update(_key(p) for p in paths)

    def own(self, visitor: str | None, path: str | os.PathLike) -> None:
        if not visitor:
            return
        key = _key(path)
        with self._lock:
            self._owners.setdefault(key, set()).add(visitor)
            if len(self._owners) > MAX_TRACKED:
                self._forget_gone()

    def _forget_gone(self) -> None:
        for key in [k for k in self._owners if not os.path.exists(k)]:
            del self._owners[key]
        while len(self._owners) > MAX_TRACKED * 3 // 4:  # still over: the oldest go
            del self._owners[next(iter(self._owners))]

    def allowed(self, visitor: str | None, path: str | os.PathLike) -> bool:
        """May this visitor read or send this file: one of the app's public files, or one of theirs."""
        try:
            key = _key(path)
        except (OSError, ValueError, RuntimeError):
            return False
        with self._lock:
            return key in self._public or (visitor is not None and visitor in self._owners.get(key, ()))

    def may_read(self, visitor: str | None, path: str) -> bool:
        """The answer for `/gradio_api/file=<path>`: Gradio's own rules decide outside its folders."""
        if _is_url(path):
            return False  # this app shows no remote files; no fetching through it
        return not self.guarded(path) or self.allowed(visitor, path)

    def public_from_config(self, config: Any) -> None:
        """Every file the app's config names (the examples, cached by Gradio at build) is shown to everyone."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, dict):
                path = value.get("path")
                if isinstance(path, str) and not _is_url(path):
                    found.append(path)
                for v in value.values():
                    walk(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        walk(config)
        self.add_public(p for p in found if self.guarded(p))


def _cookie_headers(visitor: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"set-cookie", f"{COOKIE}={visitor}; Path=/; HttpOnly; SameSite=Lax".encode()),
        (b"set-cookie", f"{CROSS_SITE_COOKIE}={visitor}; Path=/; HttpOnly; SameSite=None; Secure; "
                        "Partitioned".encode()),
    ]


def _with_cookie(headers: list[tuple[bytes, bytes]], visitor: str) -> list[tuple[bytes, bytes]]:
    """The request's headers as if it had sent its visitor cookie (so the app's handlers see the same id)."""
    ours = f"{COOKIE}={visitor}".encode()
    out, added = [], False
    for name, value in headers:
        if name.lower() == b"cookie" and not added:
            value, added = (value + b"; " + ours) if value.strip() else ours, True
        out.append((name, value))
    if not added:
        out.append((b"cookie", ours))
    return out


class PrivateFiles:
    """ASGI middleware: the visitor cookie, each upload recorded as its uploader's, Gradio's files kept to
    their owners (404 for anyone else, as for a file that is not there)."""

    def __init__(self, app, files: VisitorFiles):
        self.app = app
        self.files = files

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from starlette.requests import cookie_parser

        headers = list(scope.get("headers") or [])
        cookie = b"; ".join(v for k, v in headers if k.lower() == b"cookie").decode("latin-1")
        visitor = visitor_from_cookies(cookie_parser(cookie))
        fresh = visitor is None
        if fresh:
            visitor = new_visitor_id()
            scope = {**scope, "headers": _with_cookie(headers, visitor)}
        path = scope["path"]  # an HTTP scope always has one (ASGI)

        async def send_with_cookie(message) -> None:
            if fresh and message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers") or []) + _cookie_headers(visitor)}
            await send(message)

        found = FILE_ROUTE.match(path)
        if (found and not self.files.may_read(visitor, found.group(1))) or CLOSED_ROUTES.match(path):
            await _not_found(send_with_cookie)
            return
        if scope.get("method") == "POST" and UPLOAD_ROUTE.match(path):
            await self._upload(scope, receive, send_with_cookie, visitor)
            return
        await self.app(scope, receive, send_with_cookie)

    async def _upload(self, scope, receive, send, visitor: str) -> None:
        """Gradio's upload, its answer (the stored paths) held back until they are recorded as the visitor's."""
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def capture(message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            if start.get("status") == 200:
                try:
                    stored = json.loads(b"".join(body))
                except ValueError:  # not Gradio's list of stored paths: nothing to record
                    pass
                else:
                    for path in stored if isinstance(stored, list) else []:
                        if isinstance(path, str):
                            self.files.own(visitor, path)
            await send(start)
            await send({"type": "http.response.body", "body": b"".join(body)})

        await self.app(scope, receive, capture)


async def _not_found(send) -> None:
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": b"Not found"})


def launch_options(files: VisitorFiles) -> dict[str, Any]:
    """`demo.launch` keyword arguments: the middleware, no run history in the browser, no server-side rendering
    (its Node server would stand between the browser and the middleware's cookie)."""
    from starlette.middleware import Middleware

    return {"app_kwargs": {"middleware": [Middleware(PrivateFiles, files=files)]}, "run_history": False,
            "ssr_mode": False}
