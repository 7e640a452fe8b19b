"""The Gradio app's parts in-process (hugginggpt/gradio_ui/): what each visitor owns, the plan table and outputs as
text, both orchestrators, the Blocks app's event functions and the launcher, fast enough for the mutation audit
(docs/TESTING.md). tests/test_gradio_app.py and tests/test_gradio_sessions.py drive the same app as a subprocess
through gradio_client and a browser; these pin each message, each limit and what is given back on each error path.

The LLM is the scripted OpenAI-compatible server on loopback (tests/fakes/llm_server.py), the models server the
fake one; a running orchestrator is either the project's own server (create_app, on loopback) or, for the answers
only a broken one gives, a small stand-in served the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gradio as gr
import pytest
from flask import Flask, Response, jsonify, request
from PIL import Image

from hugginggpt.admission import Busy, local_slots
from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.config import load_config
from hugginggpt.errors import BackendError
from hugginggpt.gradio_ui import launch, sessions
from hugginggpt.gradio_ui.app import (
    CSS,
    EXAMPLES_DIR,
    ActiveRuns,
    Conversation,
    build_app,
    error_line,
    example_inputs,
    file_message,
    named_files,
    read_upload,
)
from hugginggpt.gradio_ui.orchestrators import (
    GENERATED,
    MAX_DOWNLOAD_BYTES,
    InProcess,
    Remote,
    Run,
    UserError,
    VisitorLLM,
    error_event,
    size_text,
    sse_events,
)
from hugginggpt.gradio_ui.progress import (
    COLUMNS,
    Progress,
    Row,
    describe,
    files_of,
    status_of,
    table_of,
    task_title,
)
from hugginggpt.gradio_ui.sessions import (
    COOKIE,
    CROSS_SITE_COOKIE,
    MAX_TRACKED,
    PrivateFiles,
    VisitorFiles,
    launch_options,
    new_visitor_id,
    visitor_from_cookies,
    visitor_of,
)
from hugginggpt.server import create_app
from tests.conftest import ROOT, ephemeral_ports, free_port, wait_until, write_config
from tests.fakes.llm_server import ThreadedServer

ALICE = "a" * 32
BOB = "b" * 32
VIT = "google/vit-base-patch16-224"
SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
CLASSIFY_RED = json.dumps([{"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}}])
DRAW_FOX = json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a unit fox"}}])


def png_bytes(size: tuple[int, int] = (20, 10), color: tuple[int, int, int] = (1, 2, 3)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


# == sessions.py: visitor ids, the files each visitor owns ==============================================================

def test_a_visitor_id_is_32_url_safe_characters_and_new_each_time():
    ids = {new_visitor_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(sessions.VISITOR_ID.match(i) for i in ids)


def test_the_cross_site_cookie_wins_and_a_malformed_cookie_is_no_visitor():
    assert visitor_from_cookies({CROSS_SITE_COOKIE: ALICE, COOKIE: BOB}) == ALICE
    assert visitor_from_cookies({COOKIE: BOB}) == BOB
    assert visitor_from_cookies({CROSS_SITE_COOKIE: "short", COOKIE: BOB}) == BOB  # a bad one falls through
    assert visitor_from_cookies({CROSS_SITE_COOKIE: None, COOKIE: BOB}) == BOB
    assert visitor_from_cookies({COOKIE: "a" * 31}) is None
    assert visitor_from_cookies({COOKIE: "a" * 33}) is None
    assert visitor_from_cookies({COOKIE: "a" * 31 + "="}) is None
    assert visitor_from_cookies({COOKIE: "a" * 31 + "\n"}) is None
    assert visitor_from_cookies({COOKIE: "-_" * 16}) == "-_" * 16
    assert visitor_from_cookies({}) is None
    assert visitor_from_cookies({"other": ALICE}) is None


def test_the_visitor_of_a_gradio_request_is_its_cookie_or_none():
    assert visitor_of(gr.Request(session_hash="s", cookies={COOKIE: ALICE})) == ALICE
    assert visitor_of(gr.Request(session_hash="s", cookies=None)) is None
    assert visitor_of(gr.Request(session_hash="s")) is None  # launched without PrivateFiles: no cookies at all
    assert visitor_of(None) is None


def test_a_visitors_file_is_theirs_and_a_public_one_everyones(tmp_path):
    files = VisitorFiles([tmp_path / "gradio"])
    mine = tmp_path / "gradio" / "x" / "mine.png"
    files.own(ALICE, mine)
    files.own(None, tmp_path / "gradio" / "x" / "nobody.png")  # no visitor: nobody owns it
    files.own("", tmp_path / "gradio" / "x" / "empty.png")
    assert files.allowed(ALICE, mine) and files.allowed(ALICE, str(mine))
    assert files.allowed(ALICE, tmp_path / "gradio" / "x" / ".." / "x" / "mine.png")  # the same file, spelled longer
    assert not files.allowed(BOB, mine) and not files.allowed(None, mine)
    assert not files.allowed(None, tmp_path / "gradio" / "x" / "nobody.png")
    assert not files.allowed("", tmp_path / "gradio" / "x" / "empty.png")
    files.own(BOB, mine)  # both uploaded the same content
    assert files.allowed(ALICE, mine) and files.allowed(BOB, mine)
    files.add_public([str(tmp_path / "gradio" / "pub.jpg")])
    assert files.allowed(None, tmp_path / "gradio" / "pub.jpg") and files.allowed(BOB, tmp_path / "gradio" / "pub.jpg")
    assert not files.allowed(ALICE, "bad\0path") and not files.allowed(None, "bad\0path")


def test_only_gradios_folders_are_guarded(tmp_path):
    files = VisitorFiles([tmp_path / "up", tmp_path / "cache"])
    assert files.roots == [tmp_path.resolve() / "up", tmp_path.resolve() / "cache"]
    assert files.guarded(tmp_path / "up") and files.guarded(tmp_path / "up" / "a" / "b.png")
    assert files.guarded(tmp_path / "cache" / "c.png")
    assert not files.guarded(tmp_path / "upper" / "b.png")  # a sibling whose name starts the same
    assert not files.guarded(tmp_path / "b.png")
    assert not files.guarded(tmp_path / "up" / ".." / "b.png")
    assert files.guarded("bad\0path")  # unreadable: kept to its owners (of which it has none)


def test_without_roots_the_folders_are_gradios_own():
    from gradio.utils import get_cache_folder, get_upload_folder

    files = VisitorFiles()
    assert files.roots == [Path(os.path.abspath(get_upload_folder())).resolve(),
                           Path(os.path.abspath(get_cache_folder())).resolve()]


def test_what_a_file_url_may_read(tmp_path):
    files = VisitorFiles([tmp_path / "gradio"])
    mine = tmp_path / "gradio" / "m.png"
    files.own(ALICE, mine)
    files.add_public([str(tmp_path / "gradio" / "pub.png")])
    assert files.may_read(ALICE, str(mine)) and not files.may_read(BOB, str(mine)) and not files.may_read(None, str(mine))
    assert files.may_read(None, str(tmp_path / "gradio" / "pub.png"))
    assert files.may_read(BOB, str(tmp_path / "elsewhere.png"))  # outside Gradio's folders: Gradio's own rules
    assert not files.may_read(BOB, "bad\0path")
    outside = str(tmp_path / "o.png")
    for url in ("http://example.com/a.png", "HTTPS://example.com/a.png", "https:example.com", "http:x",
                "//example.com/a.png", "s3://bucket/a.png", "abcdefghijkl://x"):
        assert not files.may_read(ALICE, url), url
    files.add_public(["http://example.com/a.png"])
    assert not files.may_read(ALICE, "http://example.com/a.png")  # never a remote file, public or not
    assert files.may_read(ALICE, "/x/abcdefghijklmn://x")  # "://" past the scheme's place: a local path
    assert files.may_read(ALICE, outside)


def test_every_file_the_apps_config_names_in_its_folders_is_public(tmp_path):
    files = VisitorFiles([tmp_path / "gradio"])
    inside = [str(tmp_path / "gradio" / n) for n in ("a.jpg", "b.jpg", "c.jpg")]
    outside = str(tmp_path / "elsewhere" / "d.jpg")
    files.public_from_config({"components": [
        {"props": {"value": {"path": inside[0]}, "samples": [[{"path": inside[1]}], ({"path": inside[2]},)]}},
        {"path": outside}, {"path": "https://example.com/e.jpg"}, {"path": 7}, "just text", None]})
    assert all(files.allowed(None, p) for p in inside)
    assert not files.allowed(None, outside)  # not Gradio's: left to Gradio's own rules, not made public
    assert files._public == {sessions._key(p) for p in inside}


def test_past_max_tracked_the_files_gone_from_disk_are_forgotten(tmp_path):
    files = VisitorFiles([tmp_path])
    kept = tmp_path / "kept.png"
    kept.write_bytes(b"x")
    files.own(ALICE, kept)
    gone = {str(tmp_path / f"gone{i}.png"): {BOB} for i in range(MAX_TRACKED - 2)}
    files._owners.update(gone)
    files.own(BOB, tmp_path / "last.png")  # MAX_TRACKED files: none forgotten yet
    assert len(files._owners) == MAX_TRACKED
    assert files.allowed(BOB, tmp_path / "gone0.png")
    (tmp_path / "one-more.png").write_bytes(b"y")
    files.own(BOB, tmp_path / "one-more.png")  # one past: those gone from disk are forgotten, the rest kept
    assert files.allowed(ALICE, kept) and files.allowed(BOB, tmp_path / "one-more.png")
    assert not files.allowed(BOB, tmp_path / "gone0.png")
    assert len(files._owners) == 2


def test_past_max_tracked_with_every_file_still_there_the_oldest_go(tmp_path):
    files = VisitorFiles([tmp_path])
    folders = [tmp_path / f"d{i}" for i in range(1000)]
    for folder in folders:
        folder.mkdir()
    # MAX_TRACKED names that all exist (the same folders, spelled longer): nothing is gone from disk
    existing = [f"{folder}{'/.' * n}" for n in range(MAX_TRACKED // len(folders)) for folder in folders]
    assert len(existing) == MAX_TRACKED
    files._owners.update({k: {BOB} for k in existing})
    newest = tmp_path / "d0" / "newest.png"
    newest.write_bytes(b"z")
    files.own(ALICE, newest)
    assert len(files._owners) == MAX_TRACKED * 3 // 4
    assert existing[0] not in files._owners and existing[MAX_TRACKED // 4] not in files._owners
    assert existing[MAX_TRACKED // 4 + 1] in files._owners and files.allowed(ALICE, newest)


# == sessions.py: the ASGI middleware ====================================================================================

class Downstream:
    """The app behind the middleware (Gradio, in the real app): records what it was sent (the scope, and the
    request's body, read as Gradio reads an upload), answers as told. A chunk of None is a last body message
    without a `body` key, which ASGI allows (an empty body)."""

    def __init__(self, status: int = 200, body: bytes = b"ok", chunks: list[bytes | None] | None = None,
                 extra: list[dict] | None = None):
        self.scopes: list[dict] = []
        self.bodies: list[bytes] = []
        self.status, self.body, self.chunks, self.extra = status, body, chunks, extra or []

    async def __call__(self, scope, receive, send) -> None:
        self.scopes.append(scope)
        if scope["type"] == "http":
            received, more = b"", True
            while more:
                message = await receive()
                received, more = received + message.get("body", b""), message.get("more_body", False)
            self.bodies.append(received)
        await send({"type": "http.response.start", "status": self.status, "headers": [(b"x-down", b"1")]})
        for message in self.extra:
            await send(message)
        if self.chunks is None:
            await send({"type": "http.response.body", "body": self.body})
        else:
            for i, chunk in enumerate(self.chunks):
                message = {"type": "http.response.body", "more_body": i < len(self.chunks) - 1}
                await send(message if chunk is None else {**message, "body": chunk})


def asgi(app, path: str, method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None,
         kind: str = "http", body: bytes = b"") -> list[dict]:
    sent: list[dict] = []
    parts = [body[:5], body[5:]] if body else [b""]

    async def receive():
        part = parts.pop(0) if parts else b""
        return {"type": "http.request", "body": part, "more_body": bool(parts)}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "method": method, "headers": list(headers or [])}
    asyncio.run(app(scope, receive, send))
    return sent


def cookies_set(sent: list[dict]) -> list[bytes]:
    return [v for k, v in sent[0].get("headers", []) if k == b"set-cookie"]


def test_a_browser_without_a_cookie_gets_one_and_the_app_sees_it_at_once(tmp_path):
    down = Downstream()
    sent = asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/config")
    [scope] = down.scopes
    [cookie_header] = [v for k, v in scope["headers"] if k == b"cookie"]
    visitor = cookie_header.decode().split("=", 1)[1]
    assert cookie_header == f"{COOKIE}={visitor}".encode() and sessions.VISITOR_ID.match(visitor)
    assert cookies_set(sent) == [
        f"{COOKIE}={visitor}; Path=/; HttpOnly; SameSite=Lax".encode(),
        f"{CROSS_SITE_COOKIE}={visitor}; Path=/; HttpOnly; SameSite=None; Secure; Partitioned".encode()]
    assert (b"x-down", b"1") in sent[0]["headers"] and sent[1] == {"type": "http.response.body", "body": b"ok"}


def test_the_new_cookie_joins_the_first_cookie_header_the_browser_sent(tmp_path):
    down = Downstream()
    asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/",
         headers=[(b"Cookie", b"theme=dark"), (b"accept", b"*/*"), (b"cookie", b"lang=en")])
    headers = down.scopes[0]["headers"]
    assert [k for k, _ in headers] == [b"Cookie", b"accept", b"cookie"]
    first = headers[0][1].decode()
    assert first.startswith(f"theme=dark; {COOKIE}=") and len(first) == len(f"theme=dark; {COOKIE}=") + 32
    assert headers[2] == (b"cookie", b"lang=en")
    down = Downstream()
    asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/", headers=[(b"cookie", b"  ")])  # an empty header: ours
    [(name, value)] = down.scopes[0]["headers"]
    assert name == b"cookie" and value.startswith(f"{COOKIE}=".encode()) and len(value) == len(COOKIE) + 33


def test_a_browser_with_its_cookie_is_passed_through_as_it_is(tmp_path):
    down = Downstream()
    headers = [(b"cookie", f"{CROSS_SITE_COOKIE}={ALICE}".encode())]
    sent = asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/config", headers=headers)
    assert down.scopes[0]["headers"] == headers and cookies_set(sent) == []
    assert sent[0]["headers"] == [(b"x-down", b"1")]
    down = Downstream()
    sent = asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/", headers=[(b"cookie", b"a=1"),
                                                                           (b"cookie", f"{COOKIE}={BOB}".encode())])
    assert cookies_set(sent) == []  # found in the second cookie header


def test_a_websocket_or_lifespan_scope_is_not_touched(tmp_path):
    down = Downstream()
    sent = asgi(PrivateFiles(down, VisitorFiles([tmp_path])), "/gradio_api/deep_link", kind="websocket")
    assert down.scopes[0]["headers"] == [] and cookies_set(sent) == []


def test_a_guarded_file_is_served_to_its_owner_only_and_to_others_it_is_not_there(tmp_path):
    files = VisitorFiles([tmp_path / "gradio"])
    mine = tmp_path / "gradio" / "h" / "mine.png"
    files.own(ALICE, mine)
    as_alice = [(b"cookie", f"{COOKIE}={ALICE}".encode())]
    as_bob = [(b"cookie", f"{COOKIE}={BOB}".encode())]
    for route in (f"/gradio_api/file={mine}", f"/gradio_api/file/{mine}", f"/app/gradio_api/file={mine}"):
        down = Downstream()
        assert asgi(PrivateFiles(down, files), route, headers=as_alice)[1]["body"] == b"ok"
        down = Downstream()
        sent = asgi(PrivateFiles(down, files), route, headers=as_bob)
        assert down.scopes == [] and sent == [
            {"type": "http.response.start", "status": 404,
             "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"cache-control", b"no-store")]},
            {"type": "http.response.body", "body": b"Not found"}]
    down = Downstream()
    sent = asgi(PrivateFiles(down, files), f"/gradio_api/file={mine}")  # a new browser: 404, and its cookie
    assert sent[0]["status"] == 404 and len(cookies_set(sent)) == 2 and down.scopes == []
    down = Downstream()
    sent = asgi(PrivateFiles(down, files), "/gradio_api/file=http://127.0.0.1:1/a.png", headers=as_alice)
    assert sent[0]["status"] == 404 and down.scopes == []
    down = Downstream()
    sent = asgi(PrivateFiles(down, files), f"/gradio_api/file={tmp_path / 'other.png'}", headers=as_bob)
    assert sent[0]["status"] == 200 and len(down.scopes) == 1  # outside Gradio's folders: Gradio decides


def test_deep_links_are_closed_and_nothing_else_is(tmp_path):
    files = VisitorFiles([tmp_path])
    for path in ("/gradio_api/deep_link", "/gradio_api/deep_link/", "/x/gradio_api/deep_link"):
        down = Downstream()
        assert asgi(PrivateFiles(down, files), path)[0]["status"] == 404 and down.scopes == [], path
    for path in ("/gradio_api/deep_linkx", "/gradio_api/info", "/gradio_api/upload"):
        down = Downstream()
        assert asgi(PrivateFiles(down, files), path)[0]["status"] == 200 and len(down.scopes) == 1, path


def test_an_upload_is_recorded_as_its_uploaders_before_its_answer_is_sent(tmp_path):
    files = VisitorFiles([tmp_path])
    stored = [str(tmp_path / "u1" / "a.png"), str(tmp_path / "u2" / "b.wav")]
    body = json.dumps(stored).encode()
    down = Downstream(chunks=[body[:10], body[10:], None], extra=[{"type": "http.response.debug", "info": 1}])
    as_alice = [(b"cookie", f"{COOKIE}={ALICE}".encode())]
    form = b"--x\r\ncontent-disposition: form-data; name=files; filename=a.png\r\n\r\nPNG...\r\n--x--\r\n"
    sent = asgi(PrivateFiles(down, files), "/gradio_api/upload", method="POST", headers=as_alice, body=form)
    assert down.bodies == [form]  # Gradio reads the upload whole, through the middleware
    assert (down.scopes[0]["path"], down.scopes[0]["method"]) == ("/gradio_api/upload", "POST")
    assert all(files.allowed(ALICE, p) for p in stored) and not files.allowed(BOB, stored[0])
    assert sent == [{"type": "http.response.debug", "info": 1},
                    {"type": "http.response.start", "status": 200, "headers": [(b"x-down", b"1")]},
                    {"type": "http.response.body", "body": body}]
    sent = asgi(PrivateFiles(Downstream(body=json.dumps([str(tmp_path / "c.png")]).encode()), files),
                "/gradio_api/upload/", method="POST")  # a new browser's upload is its new visitor's
    visitor = cookies_set(sent)[0].split(b";")[0].split(b"=")[1].decode()
    assert files.allowed(visitor, tmp_path / "c.png") and not files.allowed(ALICE, tmp_path / "c.png")
    assert sent[1]["body"] == json.dumps([str(tmp_path / "c.png")]).encode()


def test_an_upload_that_failed_or_answered_oddly_records_nothing_and_is_passed_on(tmp_path):
    files = VisitorFiles([tmp_path])
    as_alice = [(b"cookie", f"{COOKIE}={ALICE}".encode())]
    refused = json.dumps([str(tmp_path / "r.png")]).encode()
    sent = asgi(PrivateFiles(Downstream(status=413, body=refused), files), "/gradio_api/upload", "POST", as_alice)
    assert sent[0]["status"] == 413 and sent[1]["body"] == refused and not files.allowed(ALICE, tmp_path / "r.png")
    for body in (b"not json", json.dumps({"path": str(tmp_path / "d.png")}).encode(),
                 json.dumps([7, None, str(tmp_path / "e.png")]).encode()):
        sent = asgi(PrivateFiles(Downstream(body=body), files), "/gradio_api/upload", "POST", as_alice)
        assert sent[-1] == {"type": "http.response.body", "body": body}
    assert not files.allowed(ALICE, tmp_path / "d.png") and files.allowed(ALICE, tmp_path / "e.png")
    assert set(files._owners) == {sessions._key(tmp_path / "e.png")}
    down = Downstream(body=json.dumps([str(tmp_path / "g.png")]).encode())
    asgi(PrivateFiles(down, files), "/gradio_api/upload", "GET", as_alice)  # not an upload: not recorded
    assert not files.allowed(ALICE, tmp_path / "g.png")


def test_launch_options_install_the_middleware_with_no_run_history_and_no_ssr(tmp_path):
    files = VisitorFiles([tmp_path])
    options = launch_options(files)
    [middleware] = options["app_kwargs"]["middleware"]
    assert set(options) == {"app_kwargs", "run_history", "ssr_mode"}
    assert options["run_history"] is False and options["ssr_mode"] is False
    assert middleware.cls is PrivateFiles and middleware.kwargs == {"files": files} and not middleware.args


# == progress.py: the plan table and the outputs as text ================================================================

def test_a_progress_status_says_the_phase_and_its_percentage_where_one_is_known():
    assert status_of({"phase": "running", "fraction": 0.4}) == "running 40%"
    assert status_of({"phase": "downloading", "fraction": 0.125}) == "downloading 12%"
    assert status_of({"phase": "downloading", "fraction": 1}) == "downloading 100%"
    assert status_of({"fraction": 0.5}) == "running 50%"
    assert status_of({"phase": "loading", "fraction": 0.5}) == "loading"
    assert status_of({"phase": "queued", "fraction": 0.5}) == "queued"
    assert status_of({"phase": "running", "fraction": True}) == "running"
    assert status_of({"phase": "running", "fraction": "0.5"}) == "running"
    assert status_of({"phase": "running"}) == "running"
    assert status_of({}) == "running"


def test_the_plan_table_follows_the_events():
    progress = Progress()
    assert progress.table() == []
    progress.update({"event": "plan", "tasks": [
        {"task": "image-to-text", "id": 2, "dep": [0, 1]}, {"task": "text-to-image", "id": 0, "dep": [-1]},
        {"task": "object-detection", "id": 1}]})
    assert progress.table() == [["text-to-image", 0, "-", "", "planned", ""], ["object-detection", 1, "-", "", "planned", ""],
                                ["image-to-text", 2, "0, 1", "", "planned", ""]]
    progress.update({"event": "model_selected", "id": 0, "model": SDXL})
    progress.update({"event": "model_selected", "id": 1, "model": None, "error": "no local model"})
    progress.update({"event": "model_selected", "id": 2})
    assert [r[3] for r in progress.table()] == [SDXL, "none: no local model", "none: no model available"]
    progress.update({"event": "task_started", "id": 0})
    progress.update({"event": "task_progress", "id": 0, "phase": "running", "fraction": 0.5})
    assert progress.table()[0][4] == "running 50%"
    progress.update({"event": "task_progress", "id": 0, "phase": "loading"})
    assert progress.table()[0][4] == "loading"
    progress.update({"event": "task_progress", "id": 0, "phase": "queued"})
    assert progress.table()[0][4] == "queued"
    progress.update({"event": "task_progress", "id": 1, "phase": "downloading", "fraction": 0.25})  # before its start
    assert progress.table()[1][4] == "downloading 25%"
    progress.update({"event": "task_progress", "id": 1, "phase": "downloading", "fraction": 0.5})
    assert progress.table()[1][4] == "downloading 50%"
    progress.update({"event": "task_finished", "id": 0, "seconds": 2.5, "model_seconds": 1.234})
    progress.update({"event": "task_progress", "id": 0, "phase": "running", "fraction": 0.9})  # late: not after its end
    progress.update({"event": "task_failed", "id": 1, "seconds": 0.5, "error": "broke"})
    progress.update({"event": "task_progress", "id": 1, "phase": "running"})
    progress.update({"event": "task_failed", "id": 2, "skipped": True, "seconds": 3.0})
    assert progress.table() == [["text-to-image", 0, "-", SDXL, "done", "1.23"],
                                ["object-detection", 1, "-", "none: no local model", "failed", "0.50"],
                                ["image-to-text", 2, "0, 1", "none: no model available", "skipped", ""]]
    progress.update({"event": "task_finished", "id": 3, "task": "summarization", "seconds": 0.125})  # no model time
    assert progress.table()[3] == ["summarization", 3, "", "", "done", "0.12"]
    progress.update({"event": "mystery", "id": 0})
    assert progress.table()[0][4] == "done"


def test_a_replan_keeps_what_ran_and_replaces_what_failed_or_never_started():
    progress = Progress()
    progress.update({"event": "plan", "tasks": [{"task": "a", "id": 0, "dep": [-1]}, {"task": "b", "id": 1, "dep": [-1]},
                                                {"task": "c", "id": 2, "dep": [-1]}, {"task": "d", "id": 3, "dep": [-1]},
                                                {"task": "e", "id": 4, "dep": [-1]}]})
    progress.update({"event": "task_finished", "id": 0, "seconds": 1.0})
    progress.update({"event": "task_failed", "id": 1, "seconds": 1.0})
    progress.update({"event": "task_failed", "id": 2, "skipped": True})
    progress.update({"event": "task_started", "id": 4})
    progress.update({"event": "replan", "tasks": [{"task": "A", "id": 0, "dep": [-1]}, {"task": "B", "id": 1, "dep": [0]},
                                                  {"task": "C", "id": 2, "dep": [1]}, {"task": "D", "id": 3, "dep": [2]},
                                                  {"task": "E", "id": 4, "dep": [-1]}, {"task": "F", "id": 5}]})
    assert progress.table() == [["a", 0, "-", "", "done", "1.00"], ["B", 1, "0", "", "planned", ""],
                                ["C", 2, "1", "", "planned", ""], ["D", 3, "2", "", "planned", ""],
                                ["e", 4, "-", "", "running", ""], ["F", 5, "-", "", "planned", ""]]
    progress.update({"event": "plan", "tasks": None})
    assert len(progress.table()) == 6


def test_an_event_of_an_unknown_task_makes_its_row():
    progress = Progress()
    row = progress.row({"id": "7", "task": "summarization"})
    assert row == Row(7, "summarization", "") and row.status == "planned" and row.model == "" and row.seconds is None
    assert progress.row({"id": 7, "task": "other"}) is row
    assert progress.row({}) == Row(-1, "", "")


def test_the_files_a_task_made_are_its_public_paths_once_each_and_no_examples():
    result = {"generated image": "/images/a1.png", "boxes": "/images/a1.png", "audio": "/audios/b-2.wav",
              "video": "/videos/c.mp4", "up": "/uploads/d.png", "example": "/examples/chelsea.jpg",
              "text": "see /images/a1.png", "nested": "/images/sub/x.png", "n": 3, "far": "https://x/images/e.png"}
    assert files_of(result) == ["/images/a1.png", "/audios/b-2.wav", "/videos/c.mp4", "/uploads/d.png"]
    assert files_of(["/images/a.png"]) == [] and files_of("/images/a.png") == [] and files_of(None) == []
    assert GENERATED.match("/images/a.png") and not GENERATED.match("/images/a.png/") and not GENERATED.match("images/a")
    assert not GENERATED.match("/public/a.png") and not GENERATED.match("/images/")


def test_labels_boxes_and_entities_read_as_a_table_best_first():
    assert table_of(["cat", "a|b", "x\ny", 3]) == "cat, a\\|b, x y, 3"
    assert table_of([]) == ""
    assert table_of([{"label": "dog", "score": 0.2, "box": {"xmin": 1, "ymin": 2, "xmax": 3, "ymax": 4}},
                     {"score": 0.7, "label": "cat", "box": {"xmin": 5}}, "ignored"]) == (
        "| label | box | score |\n|---|---|---|\n| cat | {'xmin': 5} | 0.70 |\n| dog | (1, 2) to (3, 4) | 0.20 |")
    assert table_of([{"word": "Anna", "entity": "B-PER", "start": 0, "end": 4, "index": 1, "extra": 1.5},
                     {"word": "Paris", "entity": "B-LOC", "extra": None}]) == (
        "| entity | word | extra |\n|---|---|---|\n| B-PER | Anna | 1.50 |\n| B-LOC | Paris | None |")
    # sorted only when every row has a score; a missing score counts as 0
    assert table_of([{"label": "a", "score": 0.1}, {"label": "b"}]).splitlines()[2:] == ["| a | 0.10 |", "| b |  |"]
    assert table_of([{"label": "a", "score": None}, {"label": "b", "score": 0.5}, {"label": "c", "score": -1.0}]
                    ).splitlines()[2:] == ["| b | 0.50 |", "| a | None |", "| c | -1.00 |"]
    many = table_of([{"label": f"l{i}", "score": i / 100} for i in range(25)]).splitlines()
    assert len(many) == 22 and many[2] == "| l24 | 0.24 |" and many[-1] == "| l5 | 0.05 |"
    assert table_of([{"answer": "x" * 300}]).splitlines()[2] == "| " + "x" * 200 + " |"
    # the columns a reader looks for come first, in the order the pipelines' keys do not give them
    grouped = [{"entity_group": "PER", "score": 0.99, "word": "anna", "start": 0, "end": 4}]
    assert table_of(grouped).splitlines()[:3] == ["| entity_group | word | score |", "|---|---|---|",
                                                  "| PER | anna | 0.99 |"]
    answers = [{"score": 0.5, "start": 1, "end": 3, "answer": "paris", "page": 2}]
    assert table_of(answers).splitlines()[0] == "| answer | score | page |"
    assert table_of([{"model": "m", "label": "cat", "score": 0.5}]).splitlines()[0] == "| label | score | model |"


def test_a_tasks_output_reads_as_markdown_without_its_files():
    assert describe({"generated text": "a cat", "text": "b", "response": "c", "answer": "d"}) == "a cat\n\nb\n\nc\n\nd"
    assert describe({"generated image": "/images/a.png", "path": "/images/b.png", "error": None, "fallback": "x",
                     "start": 1, "end": 2, "generated audio": "a", "generated video": "v"}) == ""
    assert describe({"predicted": [{"label": "cat", "score": 0.5}]}) == "| label | score |\n|---|---|\n| cat | 0.50 |"
    assert describe({"predicted": "cat"}) == "**predicted**: cat"
    assert describe({"score": 0.87654}) == "similarity 0.877"
    assert describe({"score": 1}) == "similarity 1.000"
    assert describe({"score": "high"}) == "**score**: high"
    assert describe({"labels": ["a", "b"]}) == "**labels**\n\na, b"
    assert describe({"size": {"w": 3, "h": "4|5"}}) == "**size**: w 3, h 4\\|5"
    assert describe({"text": 5}) == "**text**: 5"
    assert describe({"note": "line one\nline | two" + "z" * 300}) == "**note**: " + ("line one line \\| two" + "z" * 300)[:200]
    assert describe("plain\nanswer") == "plain answer"
    assert describe(None) == "None"


def test_a_tasks_title_names_its_model_when_it_has_one():
    assert task_title({"id": 3, "task": "text-to-image"}, SDXL) == f"#3 text-to-image · {SDXL}"
    assert task_title({"id": 3, "task": "text-to-image"}, "") == "#3 text-to-image"
    assert task_title({"id": 3, "task": "text-to-image"}, "none: no model available") == "#3 text-to-image"
    assert task_title({"id": 4}, "m") == "#4  · m"
    assert COLUMNS == ["task", "id", "deps", "model", "status", "seconds"]


# == orchestrators.py: the small pieces =================================================================================

def test_sizes_read_in_kib_below_a_mib_and_in_mib_from_one():
    assert size_text(1024 * 1024) == "1.0 MiB"
    assert size_text(1024 * 1024 - 1) == "1024 KiB"
    assert size_text(10 * 1024 * 1024) == "10.0 MiB"
    assert size_text(3 * 1024 * 1024 // 2) == "1.5 MiB"
    assert size_text(200 * 1024 * 1024) == "200.0 MiB"  # a MiB is 1024 * 1024 bytes: 1025 * 1024 reads 199.8
    assert size_text(2048) == "2 KiB"
    assert size_text(0) == "0 KiB"


def test_a_visitors_llm_settings_never_show_their_key():
    llm = VisitorLLM(api_key="sk-secret-1", api_type="local", api_endpoint="http://127.0.0.1:9/v1")
    assert repr(llm) == "VisitorLLM(api_type='local', api_key=set)" and str(llm) == repr(llm)
    assert repr(VisitorLLM()) == "VisitorLLM(api_type=None, api_key=unset)"
    assert llm.body() == {"api_key": "sk-secret-1", "api_type": "local", "api_endpoint": "http://127.0.0.1:9/v1"}
    assert VisitorLLM(api_key="k", api_endpoint="").body() == {"api_key": "k"}
    assert VisitorLLM().body() == {}
    assert error_event("boom") == {"event": "error", "error": {"message": "boom"}}


def test_a_run_ends_once_and_a_cancel_stops_its_work_once():
    stops: list[int] = []
    run = Run()
    run._stop = lambda: stops.append(1)
    run.put({"event": "plan"})
    run.cancel()
    run.cancel()  # twice: one stop, one "cancelled"
    run.put({"event": "answer"})
    run.put(None)
    assert run_events(run) == [{"event": "plan"}, {"event": "cancelled"}] and stops == [1]
    assert run.finished.is_set() and run.cancelled.is_set()
    done = Run()
    done._stop = lambda: stops.append(2)
    done.put({"event": "answer"})
    done.put(None)
    assert run_events(done) == [{"event": "answer"}] and done.finished.is_set()
    done.cancel()  # after its end: nothing to stop
    assert stops == [1] and not done.cancelled.is_set() and done.events.empty()
    bare = Run()  # no work attached yet
    bare.cancel()
    assert run_events(bare) == [{"event": "cancelled"}]


def test_server_sent_events_become_the_objects_the_server_sent():
    lines = [None, ": comment", "event: plan", 'data: {"tasks": [1,', "data:2]}", "", "event:answer",
             'data:{"event": "kept", "message": "hi"}', "", "event: done", "data: {}", "", "event: nodata", "",
             "data: {}", "", "event: bad", "data: {not json", "", "event: list", "data: [1]", "", "id: 3",
             "event:  spaced  ", 'data:   {"x": 1}', "", "event:done", 'data: {"z": 3}', "",
             ": data: {}", "event: commented", "", "event: unended", 'data: {"y": 2}']
    assert list(sse_events(iter(lines))) == [{"tasks": [1, 2], "event": "plan"}, {"event": "kept", "message": "hi"},
                                             {"x": 1, "event": "spaced"}]


def run_events(run: Iterable[dict[str, Any]], seconds: float = 30, *, cancel: bool = False) -> list[dict[str, Any]]:
    """A run's events until it ends. A run that has not ended within `seconds` is cancelled (never left running
    behind the test) and fails the test (a page waiting for ever, as a visitor would see it), or, with `cancel`,
    its events are returned, the cancel's own last."""
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=events.extend, args=(run,), daemon=True)
    reader.start()
    reader.join(seconds)
    if reader.is_alive() and isinstance(run, Run):
        run.cancel()
        reader.join(5)
        assert cancel, f"the run did not end within {seconds} s; its events: {events}"
    assert not reader.is_alive(), f"the run did not end within {seconds} s; its events so far: {events}"
    return events


# == orchestrators.py: InProcess, on the real engine ===================================================================

def engine_config(tmp_path: Path, llm, models_server, public: Path, **extra):
    return load_config(write_config(tmp_path, llm.base_url, models_server[1], public, semantic_ranking=False, **extra))


@pytest.fixture
def in_process(tmp_path, llm, models, models_server, public_dir) -> InProcess:
    """The engine in this process with one request slot, on the scripted LLM and the fake models server."""
    config = engine_config(tmp_path, llm, models_server, public_dir, max_concurrent_requests=1, max_body_bytes=60_000,
                           url_allowlist=["127.0.0.1"])
    return InProcess(HuggingGPT(config, ranker=KeywordRanker()), config)


def slot_free(engine) -> bool:
    if engine.admission.acquire(blocking=False):
        engine.admission.release()
        return True
    return False


def wait_free(engine) -> None:
    wait_until(lambda: slot_free(engine), timeout=5, what="the slot given back")


def test_in_process_uploads_are_stored_as_the_servers_are_and_refused_in_one_line(in_process, public_dir):
    picture = png_bytes()
    path, kind = in_process.upload(picture, "mine.png")
    assert kind == "image" and GENERATED.match(path) and path.startswith("/uploads/")
    assert (public_dir / path.lstrip("/")).read_bytes() == picture
    assert in_process.local_file(path) == (public_dir / path.lstrip("/")).resolve()
    with pytest.raises(UserError, match=r"^big\.png is larger than 59 KiB$"):
        in_process.upload(b"x" * 60_001, "big.png")
    with pytest.raises(UserError, match=r"^the file is larger than 59 KiB$"):
        in_process.upload(b"x" * 60_001, "")
    with pytest.raises(UserError, match=r"^the uploaded file is empty$"):
        in_process.upload(b"", "empty.png")
    with pytest.raises(UserError, match=r"^unsupported file type"):
        in_process.upload(b"x" * 60_000, "notes.txt")  # at the limit: read, and refused for what it is
    assert in_process.needs_llm_settings is False


def test_in_process_local_files_are_the_generated_ones_inside_public_only(in_process, public_dir, tmp_path):
    (public_dir / "images").mkdir(exist_ok=True)
    made = public_dir / "images" / "unit-made.png"
    made.write_bytes(png_bytes())
    assert in_process.local_file("/images/unit-made.png") == made.resolve()
    assert in_process.local_file("/examples/red.png") == (public_dir / "examples" / "red.png").resolve()
    assert in_process.local_file("/images/missing.png") is None
    assert in_process.local_file("images/unit-made.png") is None
    assert in_process.local_file("/secret.txt") is None and in_process.local_file("/../secret.txt") is None
    assert in_process.local_file("/images") is None
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"o")
    link = public_dir / "images" / "unit-link.png"
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    try:
        assert in_process.local_file("/images/unit-link.png") is None  # a link out of public/ is not served
    finally:
        link.unlink()


def test_in_process_a_run_streams_the_engines_events_and_gives_its_slot_back(in_process, llm):
    llm.on("parse_task", CLASSIFY_RED, contains="classify the red one")
    run = in_process.start([{"role": "user", "content": "classify the red one"}], VisitorLLM())
    assert not slot_free(in_process.engine)
    events = run_events(run)
    names = [e["event"] for e in events]
    assert names[0] == "plan" and names[-1] == "answer"
    assert {"model_selected", "task_started", "task_finished"} <= set(names)
    finished = next(e for e in events if e["event"] == "task_finished")
    assert finished["result"]["predicted"][0] == {"label": "tabby cat", "score": 0.9}
    assert events[-1]["message"].startswith("ANSWER based on:")
    wait_free(in_process.engine)


def test_in_process_the_visitors_own_llm_is_used_and_bad_settings_are_refused_before_a_slot(in_process, llm):
    run = in_process.start([{"role": "user", "content": "hi with my key"}],
                           VisitorLLM(api_key="sk-visitor-unit-1", api_type="local", api_endpoint=llm.base_url + "/v1"))
    assert [e for e in run if e["event"] == "answer"][0]["message"] == "CHITCHAT: hi with my key"
    assert {r["headers"].get("Authorization") for r in llm.requests} == {"Bearer sk-visitor-unit-1"}
    wait_free(in_process.engine)
    with pytest.raises(UserError, match=r"^api_endpoint must be an http\(s\) URL$"):
        in_process.start([{"role": "user", "content": "x"}], VisitorLLM(api_type="local", api_endpoint="ftp://x"))
    assert slot_free(in_process.engine)
    with pytest.raises(UserError, match=r"^api_type must be one of openai, azure, local, got 'bogus'$"):
        in_process.start([{"role": "user", "content": "x"}], VisitorLLM(api_type="bogus", api_key="k"))
    assert slot_free(in_process.engine)
    with pytest.raises(UserError, match=r"^`messages` is empty: send at least one user message$"):
        in_process.start([], VisitorLLM())
    assert slot_free(in_process.engine)


def test_in_process_past_the_slots_a_run_is_refused_at_once_and_the_slot_comes_back(in_process, llm, models):
    gate = models.gates[SDXL] = threading.Event()
    llm.on("parse_task", DRAW_FOX, contains="draw a unit fox")
    try:
        run = in_process.start([{"role": "user", "content": "draw a unit fox"}], VisitorLLM())
        with pytest.raises(Busy, match=r"^the server is running 1 requests \(max_concurrent_requests\); retry shortly$"):
            in_process.start([{"role": "user", "content": "hello"}], VisitorLLM())
        events = iter(run)
        assert next(events)["event"] == "plan"
        run.cancel()  # the visitor is free at once; the slot comes back once the held model call has ended
        assert [e["event"] for e in events][-1] == "cancelled"
        assert not slot_free(in_process.engine)
    finally:
        gate.set()
    wait_free(in_process.engine)
    assert llm.stage_requests("response_results") == []


class StandInEngine:
    """An engine of plain Python for the ends no real run reaches on demand: its run raises what the test says."""

    def __init__(self, outcome: Any):
        self.admission = local_slots(2)
        self.outcome = outcome
        self.states: list[SimpleNamespace] = []
        self.hold: threading.Event | None = None  # set: the run hands its request state over only once it opens
        self.events: list[dict[str, Any]] = []  # sent after the plan
        self.pause: threading.Event | None = None  # set: the run ends only once it opens (after its events)
        self.asked: list[tuple[str, str]] = []  # (request id, mode) of each run

    def llm_for(self, request) -> None:
        return None

    def run(self, request, mode, on_event, state_ready):
        self.asked.append((request.request_id, mode))
        if self.hold is not None:
            self.hold.wait(5)
        state = SimpleNamespace(cancelled=False)
        state.cancel = lambda: setattr(state, "cancelled", True)
        self.states.append(state)
        state_ready(state)
        on_event("plan", {"event": "plan", "tasks": []})
        for event in self.events:
            on_event(event["event"], event)
        if self.pause is not None:
            self.pause.wait(5)
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def stand_in(tmp_path: Path, outcome: Any, **llm) -> InProcess:
    config = SimpleNamespace(public_dir=tmp_path, upload_quota_bytes=1 << 20, max_image_pixels=1 << 20,
                             max_body_bytes=1 << 20, max_concurrent_requests=2,
                             llm=SimpleNamespace(**{"api_type": None, "api_key": None, **llm}))
    return InProcess(StandInEngine(outcome), config)


def test_in_process_a_failed_run_says_why_in_one_line_and_gives_its_slot_back(tmp_path, caplog):
    failing = stand_in(tmp_path, BackendError("the models server is down"))
    assert run_events(failing.start([{"role": "user", "content": "x"}], VisitorLLM())) == [
        {"event": "plan", "tasks": []}, error_event("the models server is down")]
    wait_until(lambda: failing.engine.admission._value == 2, timeout=5)
    broken = stand_in(tmp_path, KeyError("boom"))
    assert run_events(broken.start([{"role": "user", "content": "x"}], VisitorLLM()))[-1] == error_event(
        "internal error (KeyError); see the app's log")
    [(request_id, mode)] = broken.engine.asked
    assert mode == "answer"  # the full run: plan, models, results and the answer, as POST /hugginggpt
    failed = [r for r in caplog.records if r.levelname == "ERROR" and r.name == "hugginggpt.gradio_ui.orchestrators"]
    assert [r.getMessage() for r in failed] == [f"[{request_id}] request failed"]  # the trace, found by its id
    assert failed[0].exc_info[0] is KeyError
    wait_until(lambda: broken.engine.admission._value == 2, timeout=5)
    cancelled = stand_in(tmp_path, {"cancelled": True})
    assert [e["event"] for e in run_events(cancelled.start([{"role": "user", "content": "x"}], VisitorLLM()))] == ["plan",
                                                                                                      "cancelled"]
    answered = stand_in(tmp_path, {"message": "fine"})
    assert [e["event"] for e in run_events(answered.start([{"role": "user", "content": "x"}], VisitorLLM()))] == ["plan"]
    assert answered.needs_llm_settings is True
    assert stand_in(tmp_path, None, api_type="openai").needs_llm_settings is False
    assert stand_in(tmp_path, None, api_key="k").needs_llm_settings is False


def test_in_process_cancel_reaches_the_engines_request(tmp_path):
    orchestrator = stand_in(tmp_path, {"message": "late"})
    engine = orchestrator.engine
    engine.hold = threading.Event()
    run = orchestrator.start([{"role": "user", "content": "x"}], VisitorLLM())
    wait_until(lambda: engine.asked, timeout=5)
    # its work on a thread named for its request (a thread dump says whose it is), never holding up the exit
    [worker] = [t for t in threading.enumerate() if t.name == f"gradio-{engine.asked[0][0]}"]
    assert worker.daemon
    run.cancel()  # before the engine has a request state: it is cancelled as soon as it has one
    engine.hold.set()
    assert run_events(run) == [{"event": "cancelled"}]
    wait_until(lambda: engine.admission._value == 2, timeout=5)
    assert engine.states[0].cancelled is True
    engine.hold = None
    done = orchestrator.start([{"role": "user", "content": "x"}], VisitorLLM())
    assert run_events(done) == [{"event": "plan", "tasks": []}]
    assert engine.states[1].cancelled is False  # a run left alone is never cancelled
    held = orchestrator.start([{"role": "user", "content": "x"}], VisitorLLM())
    wait_until(lambda: len(engine.states) == 3, timeout=5)
    held.cancel()  # cancelled while the engine holds its state: the state is told
    assert engine.states[2].cancelled is True


# == orchestrators.py: Remote, over HTTP ===============================================================================

class StandInOrchestrator:
    """A running orchestrator's routes, answering as the test says (for the answers only a broken one gives)."""

    def __init__(self) -> None:
        self.health: Any = {"status": "ok", "llm": {"api_type": "openai", "api_key": "set"}}
        self.health_status = 200
        self.upload_reply: tuple[Any, int] = ({"path": "/uploads/abc.png", "kind": "image"}, 200)
        self.upload_pause = 0.0
        self.answer_pause = 0.0  # before /hugginggpt answers at all
        self.stream: list[str] = []
        self.stream_status = 200
        self.stream_pause = 0.0
        self.stream_break = False
        self.stream_ended = threading.Event()
        self.files: dict[str, Any] = {}
        self.seen: list[dict[str, Any]] = []

    def app(self) -> Flask:
        app = Flask("stand-in-orchestrator")

        def record() -> None:
            self.seen.append({"path": request.path, "auth": request.headers.get("Authorization"),
                              "json": request.get_json(silent=True), "files": {k: (f.filename, f.read())
                                                                               for k, f in request.files.items()}})

        def health():
            record()
            if isinstance(self.health, str):
                return Response(self.health, status=self.health_status)
            return jsonify(self.health), self.health_status

        def upload():
            record()
            time.sleep(self.upload_pause)
            body, status = self.upload_reply
            return (Response(body, status=status) if isinstance(body, str) else (jsonify(body), status))

        def hugginggpt():
            record()
            time.sleep(self.answer_pause)
            if self.stream_status != 200:
                return jsonify({"error": {"message": "scripted refusal"}}), self.stream_status

            ended = self.stream_ended  # this request's: a stream outliving its test never ends the next one's

            def events():
                try:
                    for line in self.stream:
                        yield line + "\n"
                        if self.stream_pause:
                            time.sleep(self.stream_pause)
                    if self.stream_break:
                        raise RuntimeError("the stand-in broke off")
                    while self.stream_pause:  # held open: keep-alive comments until the client leaves
                        yield ": keep-alive\n\n"
                        time.sleep(self.stream_pause)
                finally:
                    ended.set()
            return Response(events(), mimetype="text/event-stream")

        def generated(kind: str, name: str):
            record()
            content = self.files.get(f"/{kind}/{name}")
            if content is None:
                return Response("not found", status=404)
            if callable(content):
                return Response(content(), mimetype="application/octet-stream")
            return Response(content, mimetype="application/octet-stream")

        app.add_url_rule("/health", view_func=health)
        app.add_url_rule("/upload", view_func=upload, methods=["POST"])
        app.add_url_rule("/hugginggpt", view_func=hugginggpt, methods=["POST"])
        app.add_url_rule("/<kind>/<name>", view_func=generated)
        return app


@pytest.fixture(scope="module")
def stand_in_running():
    orchestrator = StandInOrchestrator()
    server = ThreadedServer(orchestrator.app()).start()
    yield orchestrator, server.url
    server.stop()


@pytest.fixture
def stand_in_server(stand_in_running):
    orchestrator, url = stand_in_running
    orchestrator.__init__()  # each test's answers from scratch
    orchestrator.url = url
    return orchestrator


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_remote_check_learns_whether_the_server_has_an_llm(stand_in_server):
    remote = Remote(stand_in_server.url + "//", token="t-1", timeout=5)
    assert remote.url == stand_in_server.url and remote.headers == {"Authorization": "Bearer t-1"}
    assert remote.timeout == 5 and remote.files.is_dir() and remote.files.name.startswith("hugginggpt-gradio-")
    assert Remote("http://x").headers == {} and Remote("http://x").timeout == 30.0
    assert remote.needs_llm_settings is False
    for llm, needs in (({"api_type": "openai", "api_key": "set"}, False), ({"api_type": None, "api_key": "set"}, False),
                       ({"api_type": "local", "api_key": "unset"}, False), ({"api_type": None, "api_key": "unset"}, True),
                       ({}, True), (None, True)):
        stand_in_server.health = {"status": "ok", "llm": llm}
        remote.check()
        assert remote.needs_llm_settings is needs, llm
    stand_in_server.health = {"status": "ok"}
    remote.check()
    assert remote.needs_llm_settings is True


def test_remote_check_says_in_one_line_that_the_server_cannot_be_reached(stand_in_server):
    url = dead_url()
    with pytest.raises(UserError, match=f"^cannot reach the orchestrator at {url} \\(ConnectionError\\)$"):
        Remote(url).check()
    stand_in_server.health_status = 503
    with pytest.raises(UserError, match=r"\(HTTPError\)$"):
        Remote(stand_in_server.url).check()
    stand_in_server.health_status, stand_in_server.health = 200, "<html>not json</html>"
    with pytest.raises(UserError, match=f"^cannot reach the orchestrator at {stand_in_server.url} \\(JSONDecodeError\\)$"):
        Remote(stand_in_server.url).check()


def test_remote_uploads_send_the_file_with_the_token_and_say_why_one_was_refused(stand_in_server):
    remote = Remote(stand_in_server.url, token="t-2")
    assert remote.upload(b"PNGDATA", "mine.png") == ("/uploads/abc.png", "image")
    assert stand_in_server.seen[-1]["files"] == {"file": ("mine.png", b"PNGDATA")}
    assert stand_in_server.seen[-1]["auth"] == "Bearer t-2"
    remote.upload(b"DATA", "")
    assert stand_in_server.seen[-1]["files"] == {"file": ("file", b"DATA")}
    stand_in_server.upload_reply = ({"error": {"message": "the uploaded image is not a readable image"}}, 400)
    with pytest.raises(UserError, match=r"^the uploaded image is not a readable image$"):
        remote.upload(b"x", "x.png")
    stand_in_server.upload_reply = ("<html>proxy error</html>", 502)
    with pytest.raises(UserError, match=r"^the orchestrator answered HTTP 502$"):
        remote.upload(b"x", "x.png")
    stand_in_server.upload_reply = ({"detail": "no error key"}, 413)
    with pytest.raises(UserError, match=r"^the orchestrator answered HTTP 413$"):
        remote.upload(b"x", "x.png")
    stand_in_server.upload_reply = ({"error": "a string"}, 500)
    with pytest.raises(UserError, match=r"^the orchestrator answered HTTP 500$"):
        remote.upload(b"x", "x.png")
    url = dead_url()
    with pytest.raises(UserError, match=f"^cannot reach the orchestrator at {url} \\(ConnectionError\\)$"):
        Remote(url).upload(b"x", "x.png")
    stand_in_server.upload_pause = 3.0  # accepted, never answered in time: the visitor is told, not left waiting
    started = time.monotonic()
    with pytest.raises(UserError, match=r"\(ReadTimeout\)$"):
        Remote(stand_in_server.url, timeout=0.5).upload(b"x", "x.png")
    assert time.monotonic() - started < 2.5


def test_remote_runs_stream_the_servers_events_with_the_visitors_settings(stand_in_server):
    stand_in_server.stream = ["event: plan", 'data: {"event": "plan", "tasks": []}', "", ": keep-alive", "",
                              "event: answer", 'data: {"message": "hi"}', "", "event: done", "data: {}", ""]
    remote = Remote(stand_in_server.url, token="t-3")
    run = remote.start([{"role": "user", "content": "hello"}], VisitorLLM(api_key="k", api_type="local"))
    assert run_events(run) == [{"event": "plan", "tasks": []}, {"event": "answer", "message": "hi"}]
    seen = stand_in_server.seen[-1]
    assert seen["auth"] == "Bearer t-3"
    assert seen["json"] == {"messages": [{"role": "user", "content": "hello"}], "stream": True, "api_key": "k",
                            "api_type": "local"}


def test_remote_runs_end_in_one_line_when_the_server_refuses_breaks_off_or_is_gone(stand_in_server, caplog):
    stand_in_server.stream_status = 429
    remote = Remote(stand_in_server.url)
    assert run_events(remote.start([{"role": "user", "content": "x"}], VisitorLLM())) == [error_event("scripted refusal")]
    stand_in_server.stream_status = 200
    stand_in_server.stream = ["event: plan", 'data: {"tasks": []}', ""]
    stand_in_server.stream_break = True
    caplog.set_level(logging.DEBUG, logger="hugginggpt.gradio_ui.orchestrators")
    events = run_events(remote.start([{"role": "user", "content": "x"}], VisitorLLM()))
    [lost] = [r for r in caplog.records if r.name == "hugginggpt.gradio_ui.orchestrators"]
    assert lost.getMessage() == "the orchestrator's stream ended with an error" and lost.levelname == "DEBUG"
    assert lost.exc_info[0].__name__ == "ChunkedEncodingError"  # the trace, for --verbose
    assert events == [{"tasks": [], "event": "plan"},
                      error_event(f"lost the orchestrator at {stand_in_server.url} (ChunkedEncodingError)")]
    url = dead_url()
    assert run_events(Remote(url).start([{"role": "user", "content": "x"}], VisitorLLM())) == [
        error_event(f"lost the orchestrator at {url} (ConnectionError)")]


def test_remote_runs_give_up_on_a_stream_that_falls_silent(stand_in_server):
    """The server writes a keep-alive every 10 s: a stream silent for longer than `stream_idle` (60 s unless
    set) is an orchestrator that hangs, and the visitor gets a line instead of a page waiting forever."""
    assert Remote("http://x").stream_idle == 60.0

    def run_of(remote: Remote) -> Run:
        return remote.start([{"role": "user", "content": "x"}], VisitorLLM())

    stand_in_server.stream = ["event: plan", 'data: {"tasks": []}', ""]
    stand_in_server.stream_pause = 0.1  # then a keep-alive every 0.1 s: slow, not silent, for longer than 2 s
    assert run_events(run_of(Remote(stand_in_server.url, stream_idle=2.0)), 3, cancel=True) == [
        {"tasks": [], "event": "plan"}, {"event": "cancelled"}]
    stand_in_server.stream_pause = 5.0  # a line every 5 s: silent for longer than 1 s
    started = time.monotonic()
    assert run_events(run_of(Remote(stand_in_server.url, stream_idle=1.0)), 10) == [
        error_event(f"the orchestrator at {stand_in_server.url} sent nothing for 1 s")]
    assert time.monotonic() - started < 4
    stand_in_server.answer_pause = 3.0  # no answer at all, not even its headers
    assert run_events(run_of(Remote(stand_in_server.url, stream_idle=0.5)), 10) == [
        error_event(f"the orchestrator at {stand_in_server.url} sent nothing for 0.5 s")]


def test_remote_cancel_closes_the_stream_so_the_server_stops(stand_in_server):
    stand_in_server.stream = ["event: plan", 'data: {"tasks": []}', ""]
    stand_in_server.stream_pause = 0.05
    run = Remote(stand_in_server.url).start([{"role": "user", "content": "x"}], VisitorLLM())
    events = iter(run)
    assert next(events) == {"tasks": [], "event": "plan"}
    workers = [t for t in threading.enumerate() if t.name == "gradio-remote"]  # named, never holding up the exit
    assert workers and all(t.daemon for t in workers)
    started = time.monotonic()
    run.cancel()
    assert run_events(events, seconds=3) == [{"event": "cancelled"}] and time.monotonic() - started < 3
    assert stand_in_server.stream_ended.wait(3), "the server's stream went on after the cancel"


def test_remote_files_are_fetched_once_with_the_token_into_the_apps_folder(stand_in_server):
    stand_in_server.files["/images/ab12.png"] = b"IMAGE"
    remote = Remote(stand_in_server.url, token="t-4")
    local = remote.local_file("/images/ab12.png")
    assert local == remote.files / "images_ab12.png" and local.read_bytes() == b"IMAGE"
    assert stand_in_server.seen[-1]["auth"] == "Bearer t-4"
    asked = len(stand_in_server.seen)
    stand_in_server.files["/images/ab12.png"] = b"CHANGED"
    assert remote.local_file("/images/ab12.png") == local and local.read_bytes() == b"IMAGE"  # once
    assert len(stand_in_server.seen) == asked
    assert remote.local_file("/images/missing.png") is None
    assert not (remote.files / "images_missing.png").exists()
    assert remote.local_file("/secret.txt") is None and remote.local_file("images/ab12.png") is None
    assert len(stand_in_server.seen) == asked + 1  # a path that is no generated file is never asked for
    assert Remote(dead_url()).local_file("/images/ab12.png") is None


def test_remote_a_file_past_the_download_limit_is_not_kept(stand_in_server):
    chunk = bytes(4 * 1024 * 1024)
    stand_in_server.files["/videos/limit.mp4"] = lambda: (chunk for _ in range(MAX_DOWNLOAD_BYTES // len(chunk)))
    stand_in_server.files["/videos/over.mp4"] = lambda: iter(
        [*(chunk for _ in range(MAX_DOWNLOAD_BYTES // len(chunk))), b"!"])
    remote = Remote(stand_in_server.url)
    try:
        assert MAX_DOWNLOAD_BYTES == 200 * 1024 * 1024
        assert remote.local_file("/videos/over.mp4") is None
        assert not (remote.files / "videos_over.mp4").exists()
        at_limit = remote.local_file("/videos/limit.mp4")
        assert at_limit == remote.files / "videos_limit.mp4" and at_limit.stat().st_size == MAX_DOWNLOAD_BYTES
    finally:
        shutil.rmtree(remote.files)


def test_remote_a_download_without_end_or_gone_silent_is_given_up_and_logged(stand_in_server, caplog, monkeypatch):
    """A file that never ends is read as a stream and cut at the limit (never held whole in memory); one whose
    sender falls silent is given up after the timeout. Each is logged with its path and why, and left nowhere."""
    from hugginggpt.gradio_ui import orchestrators

    monkeypatch.setattr(orchestrators, "MAX_DOWNLOAD_BYTES", 1024 * 1024)

    def endless():
        while True:
            yield bytes(64 * 1024)
            time.sleep(0.002)  # about 30 MB/s: a download read whole would grow without end

    def stalled():
        yield b"start"
        time.sleep(5)
        yield b"end"

    stand_in_server.files["/videos/endless.mp4"] = endless
    stand_in_server.files["/videos/stalled.mp4"] = stalled
    remote = Remote(stand_in_server.url, timeout=0.5)
    got: dict[str, Any] = {}
    try:
        reader = threading.Thread(target=lambda: got.update(
            endless=remote.local_file("/videos/endless.mp4"), stalled=remote.local_file("/videos/stalled.mp4")),
            daemon=True)
        reader.start()
        reader.join(10)
        assert got == {"endless": None, "stalled": None}
        assert list(remote.files.iterdir()) == []
    finally:
        shutil.rmtree(remote.files)
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.gradio_ui.orchestrators"] == [
        "could not fetch /videos/endless.mp4 from the orchestrator (larger than 1.0 MiB)",
        "could not fetch /videos/stalled.mp4 from the orchestrator (ConnectionError)"]


def test_remote_a_refused_download_leaves_nothing_on_disk(stand_in_server):
    stand_in_server.files["/videos/over.mp4"] = lambda: iter([bytes(MAX_DOWNLOAD_BYTES), b"!"])
    remote = Remote(stand_in_server.url)
    try:
        assert remote.local_file("/videos/over.mp4") is None
        assert list(remote.files.iterdir()) == []
    finally:
        shutil.rmtree(remote.files)


def test_remote_on_the_projects_own_server(tmp_path, llm, models, models_server, public_dir):
    """The real orchestrator (create_app on loopback) with a token: check, upload, a run's events, its files."""
    config = engine_config(tmp_path, llm, models_server, public_dir, api_tokens=["real-token-1"])
    server = ThreadedServer(create_app(config, HuggingGPT(config, ranker=KeywordRanker()))).start()
    try:
        remote = Remote(server.url, token="real-token-1")
        remote.check()
        assert remote.needs_llm_settings is False
        picture = png_bytes((30, 20))
        path, kind = remote.upload(picture, "up.png")
        assert kind == "image" and (public_dir / path.lstrip("/")).read_bytes() == picture
        with pytest.raises(UserError, match="token"):
            Remote(server.url, token="wrong").upload(picture, "up.png")
        llm.on("parse_task", DRAW_FOX, contains="draw a remote unit fox")
        events = run_events(remote.start([{"role": "user", "content": "draw a remote unit fox"}], VisitorLLM()))
        assert events[0]["event"] == "plan" and events[-1]["event"] == "answer"
        [made] = files_of(next(e for e in events if e["event"] == "task_finished")["result"])
        local = remote.local_file(made)
        assert local is not None and local.read_bytes() == (public_dir / made.lstrip("/")).read_bytes()
    finally:
        server.stop()


# == app.py: the pieces ================================================================================================

def test_each_sessions_running_request_is_its_own_to_cancel():
    runs = ActiveRuns()
    first, second, other = Run(), Run(), Run()
    runs.put("s1", first)
    runs.put("s2", other)
    runs.put("s1", second)  # a new request in the same session stops the one before
    assert first.cancelled.is_set() and not second.cancelled.is_set() and not other.cancelled.is_set()
    runs.drop("s1", first)  # the old one's end does not forget the new one
    assert runs.cancel("s1") is True and second.cancelled.is_set()
    assert runs.cancel("s1") is False and runs.cancel("nobody") is False
    runs.drop("s2", other)
    assert runs.cancel("s2") is False and not other.cancelled.is_set()


def test_the_examples_are_the_ones_whose_files_exist():
    assert example_inputs() == [
        {"text": "Describe this picture, then read the description aloud.", "files": [str(EXAMPLES_DIR / "chelsea.jpg")]},
        {"text": "Which objects are in this photo? Draw boxes around them.", "files": [str(EXAMPLES_DIR / "coffee.jpg")]},
        {"text": "Classify this image and generate a new picture in the same style.",
         "files": [str(EXAMPLES_DIR / "astronaut.jpg")]},
        {"text": "Transcribe this recording and say what it is about.", "files": [str(EXAMPLES_DIR / "speech.wav")]},
        {"text": "Draw a red rocket flying over a snowy mountain, then describe your drawing.", "files": []}]
    assert EXAMPLES_DIR == ROOT / "public" / "examples"


def test_chat_lines_for_files_and_errors():
    assert file_message(Path("/tmp/x.png"), "/images/x.png from task #1") == {
        "role": "assistant", "content": {"path": "/tmp/x.png", "alt_text": "/images/x.png from task #1"}}
    assert error_line("  the   LLM\nis\tdown ") == {"role": "assistant", "content": "⚠️ the LLM is down"}
    assert error_line("x" * 600)["content"] == "⚠️ " + "x" * 500
    assert error_line(KeyError("k"))["content"] == "⚠️ 'k'"


def test_the_files_a_request_names_are_its_stored_ones_only():
    h = "0123456789abcdef" * 2
    assert named_files(f"see /IMAGES/{h.upper()}.PNG and /audios/{h}.wav, /videos/{h}.mp4 and /images/{h}.png") == [
        f"/images/{h}.png", f"/audios/{h}.wav", f"/videos/{h}.mp4"]
    assert named_files(f"uploads/{h}.abcdefgh") == [f"/uploads/{h}.abcdefgh"]
    assert named_files(f"uploads/{h}.abcdefghi") == [f"/uploads/{h}.abcdefgh"]  # the name as far as it can be one
    assert named_files(f"uploads/{h[:-1]}.png uploads/{h}. examples/{h}.png") == []
    assert named_files(f"C:\\public\\uploads\\{h}.png") == [f"/uploads/{h}.png"]
    assert named_files(f"uploads%2F{h}.png") == [f"/uploads/{h}.png"]


def test_an_upload_over_the_limit_is_refused_before_it_is_read(tmp_path):
    file = tmp_path / "clip.wav"
    file.write_bytes(b"w" * 2048)
    assert read_upload(str(file), 2048) == b"w" * 2048
    with pytest.raises(UserError, match=r"^clip\.wav is larger than 1 KiB$"):
        read_upload(str(file), 1024)
    with pytest.raises(UserError, match=r"^clip\.wav is larger than 2 KiB$"):
        read_upload(str(file), 2047)
    with pytest.raises(OSError):
        read_upload(str(tmp_path / "gone.wav"), 2048)


class Shelf:
    """An orchestrator's generated files as local paths (what `local_file` answers), recording what was asked."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.asked: list[str] = []

    def local_file(self, path: str) -> Path | None:
        self.asked.append(path)
        file = self.folder / path.lstrip("/")
        return file if file.is_file() else None


def test_a_turn_shows_each_tasks_progress_output_and_files_then_the_answer(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.png").write_bytes(b"A")
    shelf = Shelf(tmp_path)
    chat = [{"role": "user", "content": "draw"}]
    turn = Conversation(shelf, chat, show=lambda local: f"shown:{local.name}")
    assert turn.outcome == "running" and turn.history_entry() == ""
    turn.handle({"event": "plan", "tasks": [{"task": "text-to-image", "id": 0, "dep": [-1]},
                                            {"task": "image-to-text", "id": 1, "dep": [0]}]})
    turn.handle({"event": "model_selected", "id": 0, "model": SDXL})
    turn.handle({"event": "task_started", "id": 0, "task": "text-to-image"})
    assert chat[1] == {"role": "assistant", "content": "running…", "metadata": {
        "title": f"#0 text-to-image · {SDXL}", "status": "pending"}}
    turn.handle({"event": "task_progress", "id": 0, "task": "text-to-image", "phase": "running", "step": 2, "steps": 5})
    assert len(chat) == 2 and chat[1]["content"] == "running… step 2 of 5" and chat[1]["metadata"]["status"] == "pending"
    result = {"generated image": "/images/a.png", "again": "/images/a.png", "gone": "/images/b.png",
              "example": "/examples/c.png", "text": "a fox"}
    turn.handle({"event": "task_finished", "id": 0, "task": "text-to-image", "seconds": 2.0, "model_seconds": 1.5,
                 "result": result})
    assert chat[1] == {"role": "assistant", "content": "a fox", "metadata": {
        "title": f"#0 text-to-image · {SDXL}", "status": "done", "duration": 1.5}}
    assert chat[2] == {"role": "assistant", "content": {"path": "shown:a.png", "alt_text": "/images/a.png from task #0"}}
    assert shelf.asked == ["/images/a.png", "/images/b.png"] and turn.files == ["/images/a.png"]
    turn.handle({"event": "task_finished", "id": 0, "task": "text-to-image", "result": {"image": "/images/a.png"}})
    assert len(chat) == 3 and chat[1]["content"] == "done"  # a file already shown is not shown twice
    turn.handle({"event": "task_failed", "id": 1, "task": "image-to-text", "skipped": True})
    assert chat[3] == {"role": "assistant", "content": "skipped: no reason given", "metadata": {
        "title": "#1 image-to-text", "status": "done"}}
    turn.handle({"event": "task_failed", "id": 1, "task": "image-to-text", "error": "model broke", "seconds": 0.25})
    assert chat[3]["content"] == "failed: model broke" and chat[3]["metadata"]["duration"] == 0.25 and len(chat) == 4
    turn.handle({"event": "answer_token", "text": "Here "})
    turn.handle({"event": "answer_token", "text": "it is"})
    turn.handle({"event": "answer_token"})
    assert chat[4] == {"role": "assistant", "content": "Here it is"} and turn.outcome == "running"
    turn.handle({"event": "answer", "message": "Here it is: a fox."})
    assert chat[4] == {"role": "assistant", "content": "Here it is: a fox."} and len(chat) == 5
    assert turn.outcome == "answered" and turn.answer == "Here it is: a fox."
    assert turn.history_entry() == "Here it is: a fox.\nGenerated files: /images/a.png"
    assert turn.progress.table()[0][4] == "done"


def test_a_turn_ends_in_one_line_on_an_error_or_a_cancel(tmp_path):
    chat: list[dict] = []
    turn = Conversation(Shelf(tmp_path), chat)
    turn.handle({"event": "answer"})  # no message: an empty answer, not "None"
    assert chat == [{"role": "assistant", "content": ""}] and turn.answer == "" and turn.outcome == "answered"
    turn.handle({"event": "answer", "message": "only an answer"})
    assert chat == [{"role": "assistant", "content": "only an answer"}] and turn.history_entry() == "only an answer"
    turn.handle({"event": "error", "error": {"message": "the LLM\nis down"}})
    turn.handle({"event": "error"})
    assert chat[1:] == [error_line("the LLM is down"), error_line("the request failed")] and turn.outcome == "error"
    turn.handle({"event": "cancelled"})
    assert chat[-1] == {"role": "assistant", "content": "Cancelled."} and turn.outcome == "cancelled"
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "x.png").write_bytes(b"x")
    plain = Conversation(Shelf(tmp_path), [])  # no `show`: the local path itself
    plain.handle({"event": "task_finished", "id": 2, "result": {"image": "/images/x.png"}})
    assert plain.chat[-1]["content"] == {"path": str(tmp_path / "images" / "x.png"), "alt_text": "/images/x.png from task #2"}
    hidden = Conversation(Shelf(tmp_path), [], show=lambda local: None)  # could not be shown: not named as shown
    hidden.handle({"event": "task_finished", "id": 2, "result": {"image": "/images/x.png"}})
    assert hidden.files == [] and len(hidden.chat) == 1


def test_a_turns_files_are_listed_in_its_history_entry_and_a_task_event_without_an_id_gets_its_own_message(tmp_path):
    (tmp_path / "images").mkdir()
    for name in ("a.png", "b.png"):
        (tmp_path / "images" / name).write_bytes(b"x")
    turn = Conversation(Shelf(tmp_path), [])
    turn.handle({"event": "task_finished", "id": 0, "result": {"image": "/images/a.png", "mask": "/images/b.png"}})
    turn.handle({"event": "answer", "message": "two images"})
    assert turn.history_entry() == "two images\nGenerated files: /images/a.png, /images/b.png"
    # an event from another orchestrator's version, without a task id: shown on its own, never in task #1's place
    turn = Conversation(Shelf(tmp_path), [])
    turn.handle({"event": "task_started", "task": "translation"})
    turn.handle({"event": "task_started", "id": 1, "task": "summarization"})
    assert [m["content"] for m in turn.chat] == ["running…", "running…"]
    assert turn.chat[1]["metadata"]["title"] == "#1 summarization"


# == app.py: the Blocks app's event functions ==========================================================================

class Bar:
    """Gradio's progress bar as the chat event is handed it: records each update."""

    def __init__(self) -> None:
        self.updates: list[tuple[Any, str | None]] = []

    def __call__(self, progress=None, desc=None, *args, **kwargs) -> None:
        self.updates.append((progress, desc))


def fns(demo) -> dict[str, Any]:
    return {f.api_name: f for f in demo.fns.values()}


def visitor_request(visitor: str = ALICE, session: str = "s-1") -> gr.Request:
    return gr.Request(session_hash=session, cookies={COOKIE: visitor})


CLEARED = {"text": "", "files": []}
SKIP = gr.skip()


def chat_turn(demo, message, chat=None, history=None, llm=None, mine=None, request=None, bar=None) -> list[tuple]:
    """Each output of the chat event as Gradio sends it, at the moment it was yielded."""
    return [copy.deepcopy(out) for out in fns(demo)["chat"].fn(message, chat, history, llm, mine,
                                                               request or visitor_request(), progress=bar or Bar())]


@pytest.fixture
def gradio_files(tmp_path) -> VisitorFiles:
    return VisitorFiles([tmp_path / "gradio"])


def upload_of(files: VisitorFiles, tmp_path: Path, name: str, data: bytes, visitor: str = ALICE) -> str:
    path = tmp_path / "gradio" / "up" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    files.own(visitor, path)
    return str(path)


def test_a_turn_with_an_upload_runs_and_keeps_its_files_for_the_next_turn(in_process, gradio_files, llm, models,
                                                                          tmp_path, public_dir):
    demo = build_app(in_process, files=gradio_files, max_upload_bytes=51_200)
    picture = upload_of(gradio_files, tmp_path, "fox.png", png_bytes((24, 16)))
    llm.on("parse_task", DRAW_FOX, contains="draw on my picture")
    bar = Bar()
    outputs = chat_turn(demo, {"text": "  draw on my picture ", "files": [picture]}, chat=[{"role": "user", "content": "old"}],
                        history=[{"role": "user", "content": "before"}], bar=bar)
    prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    upload = re.search(r"/uploads/[0-9a-f]{32}\.png", prompt).group(0)
    assert f"{{ draw on my picture\n(attached image: {upload}) }}" in prompt
    assert (public_dir / upload.lstrip("/")).read_bytes() == Path(picture).read_bytes()
    assert '[{"role": "user", "content": "before"}]' in prompt  # the history went with it
    first, last = outputs[0], outputs[-1]
    assert first[0][:3] == [{"role": "user", "content": "old"}, {"role": "user", "content": "draw on my picture"},
                            {"role": "user", "content": {"path": picture, "alt_text": upload}}]
    assert first[2] == [{"role": "user", "content": "before"}] and first[3] == {"headers": COLUMNS, "data": []}
    assert first[4] == CLEARED and first[5] == {upload.lower()}
    chat, shown, history, plan, box, mine = last
    assert chat is shown and box == CLEARED
    assert plan["headers"] == COLUMNS and [(r[0], r[1], r[2], r[3], r[4]) for r in plan["data"]] == [
        ("text-to-image", 0, "-", SDXL, "done")]
    [made] = [m for m in chat if isinstance(m["content"], dict) and m["content"]["alt_text"].startswith("/images/")]
    generated = made["content"]["alt_text"].split()[0]
    assert made["content"]["alt_text"] == f"{generated} from task #0"
    cached = made["content"]["path"]
    assert Path(cached).read_bytes() == (public_dir / generated.lstrip("/")).read_bytes()
    assert gradio_files.allowed(ALICE, cached) and not gradio_files.allowed(BOB, cached)
    assert mine == {upload.lower(), generated.lower()}
    assert chat[-1]["content"].startswith("ANSWER based on:")
    assert history == [{"role": "user", "content": "before"},
                       {"role": "user", "content": f"draw on my picture\n(attached image: {upload})"},
                       {"role": "assistant", "content": chat[-1]["content"] + f"\nGenerated files: {generated}"}]
    assert all(len(o) == 6 for o in outputs) and len(outputs) > 3
    wait_free(in_process.engine)
    # the next turn may name the file its run made, and its answer is kept
    outputs = chat_turn(demo, {"text": f"describe {generated}", "files": []}, history=history, mine=mine)
    assert outputs[-1][0][-1]["content"].startswith("ANSWER") or outputs[-1][0][-1]["content"].startswith("CHITCHAT")
    assert len(outputs[-1][2]) == 5


def test_a_turn_is_refused_in_one_line_for_what_the_visitor_can_fix(in_process, gradio_files, llm, tmp_path):
    demo = build_app(in_process, files=gradio_files, max_upload_bytes=51_200)
    before = [{"role": "user", "content": "earlier"}]
    assert chat_turn(demo, {"text": "   ", "files": []}, chat=before) == [
        (before + [error_line("Type a request (and attach images or audio if it needs them).")], SKIP, SKIP, SKIP,
         CLEARED, SKIP)]
    assert chat_turn(demo, None)[0][0] == [error_line("Type a request (and attach images or audio if it needs them).")]
    theirs = upload_of(gradio_files, tmp_path, "theirs.png", png_bytes(), visitor=BOB)
    assert chat_turn(demo, {"text": "look", "files": [theirs]}) == [
        ([error_line("Upload refused: theirs.png was not uploaded from this browser; attach the file again.")],
         SKIP, SKIP, SKIP, {"text": "look", "files": []}, SKIP)]
    h = "ab" * 16
    message = {"text": f"describe /images/{h}.png", "files": []}
    assert chat_turn(demo, message, mine={f"/images/{'cd' * 16}.png"}) == [
        ([error_line(f"/images/{h}.png is not a file of this session: attach it again (a session may use only the "
                     "files it uploaded or its requests made).")], SKIP, SKIP, SKIP, message, SKIP)]
    big = upload_of(gradio_files, tmp_path, "big.png", b"x" * 51_201)
    message = {"text": "look", "files": [big]}
    assert chat_turn(demo, message) == [([error_line("Upload refused: big.png is larger than 50 KiB")], SKIP, SKIP,
                                         SKIP, message, SKIP)]
    fake = upload_of(gradio_files, tmp_path, "fake.png", b"x" * 51_200)  # at the limit: read, and refused for what it is
    assert chat_turn(demo, {"text": "look", "files": [fake]})[0][0] == [
        error_line("Upload refused: the uploaded image is not a readable image")]
    gone = upload_of(gradio_files, tmp_path, "gone.png", png_bytes())
    Path(gone).unlink()
    assert chat_turn(demo, {"text": "look", "files": [gone]})[0][0] == [
        error_line(f"Upload refused: [Errno 2] No such file or directory: '{gone}'")]
    assert llm.requests == []


def test_a_turn_without_an_llm_asks_for_the_visitors_settings(tmp_path, gradio_files):
    orchestrator = stand_in(tmp_path, {"message": "fine"})
    orchestrator.engine.events = [{"event": "answer", "message": "fine"}]
    demo = build_app(orchestrator, files=gradio_files)
    ask = ("This app has no LLM of its own: open Settings, enter your API key (and endpoint for a local or Azure "
           "LLM), then Save.")
    message = {"text": "hello", "files": []}
    for llm in (None, VisitorLLM(), VisitorLLM(api_type="openai")):
        assert chat_turn(demo, message, llm=llm) == [([error_line(ask)], SKIP, SKIP, SKIP, message, SKIP)]
    for llm in (VisitorLLM(api_key="k"), VisitorLLM(api_endpoint="http://127.0.0.1:9/v1")):
        assert chat_turn(demo, message, llm=llm)[-1][0][-1] == {"role": "assistant", "content": "fine"}


def test_a_refused_start_keeps_the_box_and_the_sessions_uploads(in_process, gradio_files, llm, models, tmp_path):
    demo = build_app(in_process, files=gradio_files)
    gate = models.gates[SDXL] = threading.Event()
    llm.on("parse_task", DRAW_FOX, contains="hold the slot")
    holder = in_process.start([{"role": "user", "content": "hold the slot"}], VisitorLLM())
    try:
        picture = upload_of(gradio_files, tmp_path, "p.png", png_bytes())
        message = {"text": "while busy", "files": [picture]}
        [(chat, shown, history, plan, box, mine)] = chat_turn(demo, message, mine={"/images/x.png"})
        [upload] = [p for p in mine if p.startswith("/uploads/")]
        assert chat == [{"role": "user", "content": "while busy"},
                        {"role": "user", "content": {"path": picture, "alt_text": upload}},
                        error_line("the server is running 1 requests (max_concurrent_requests); retry shortly")]
        assert (shown, history, plan) == (SKIP, SKIP, SKIP) and box == message and mine == {"/images/x.png", upload}
        [(chat, *_)] = chat_turn(demo, {"text": "bad settings", "files": []},
                                 llm=VisitorLLM(api_type="local", api_endpoint="ftp://x"))
        assert chat[-1] == error_line("api_endpoint must be an http(s) URL")
    finally:
        gate.set()
        list(holder)
    wait_free(in_process.engine)


def test_a_turn_shows_gradios_bar_for_the_task_that_reported_last(tmp_path, gradio_files):
    orchestrator = stand_in(tmp_path, {"message": "x"}, api_key="k")
    orchestrator.engine.events = [
        {"event": "task_progress", "id": 0, "task": "text-to-image", "phase": "running", "fraction": 0.5, "step": 5,
         "steps": 10},
        {"event": "task_progress", "id": 1, "task": "text-to-speech", "phase": "loading"},
        {"event": "task_progress", "id": 1, "task": "text-to-speech", "phase": "downloading", "fraction": 1,
         "bytes": 2_000_000, "total_bytes": 2_000_000},
        {"event": "task_progress", "id": 1, "phase": "running", "fraction": "half"},
        {"event": "error", "error": {"message": "the models server went away"}}]
    bar = Bar()
    outputs = chat_turn(build_app(orchestrator, files=gradio_files), {"text": "go", "files": []},
                        history=[{"role": "user", "content": "h"}], bar=bar)
    assert bar.updates == [(0.5, "#0 text-to-image: step 5 of 10"), (None, "#1 text-to-speech: loading the model"),
                           (1, "#1 text-to-speech: downloading 2.0 of 2.0 MB"), (None, "#1 : running")]
    chat, _, history, plan, _, _ = outputs[-1]
    assert chat[-1] == error_line("the models server went away")
    assert history == [{"role": "user", "content": "h"}]  # a failed turn is not kept for the next one
    assert [r[4] for r in plan["data"]] == ["running 50%", "running"]
    assert len(outputs) == 1 + 1 + 5 + 1  # at once, after each event, and at the end


def test_cancel_stops_the_sessions_own_run_only_and_a_visitor_who_left_stops_theirs(tmp_path, gradio_files):
    orchestrator = stand_in(tmp_path, {"message": "late"}, api_key="k")
    orchestrator.engine.hold = threading.Event()
    demo = build_app(orchestrator, files=gradio_files)
    cancel = fns(demo)["cancel"].fn
    turn = fns(demo)["chat"].fn({"text": "slow", "files": []}, [], [], None, set(), visitor_request(session="mine"),
                                progress=Bar())
    next(turn)  # the run started; the chat shows the request
    assert cancel(gr.Request(session_hash="other")) == ""
    assert cancel(gr.Request(session_hash=None)) == ""
    assert cancel(gr.Request(session_hash="mine")) == "Cancelling…"
    rest = list(turn)
    assert rest[-1][0][-1] == {"role": "assistant", "content": "Cancelled."} and rest[-1][2] == []
    assert cancel(gr.Request(session_hash="mine")) == ""
    orchestrator.engine.hold.set()
    wait_until(lambda: orchestrator.engine.states and orchestrator.engine.states[0].cancelled, timeout=5)
    wait_until(lambda: orchestrator.engine.admission._value == 2, timeout=5)

    orchestrator.engine.pause = threading.Event()
    left = fns(demo)["chat"].fn({"text": "slow", "files": []}, [], [], None, set(), visitor_request(session="gone"),
                                progress=Bar())
    next(left)
    next(left)  # the plan is shown
    left.close()  # the visitor left: Gradio closes the event's generator
    assert cancel(gr.Request(session_hash="gone")) == ""  # no longer this session's running request
    wait_until(lambda: len(orchestrator.engine.states) == 2 and orchestrator.engine.states[1].cancelled, timeout=5)
    orchestrator.engine.pause.set()
    wait_until(lambda: orchestrator.engine.admission._value == 2, timeout=5)


def test_a_visitor_who_leaves_before_the_first_event_stops_their_request(tmp_path, gradio_files):
    orchestrator = stand_in(tmp_path, {"message": "late"}, api_key="k")
    orchestrator.engine.hold = threading.Event()  # planning: no event yet
    demo = build_app(orchestrator, files=gradio_files)
    left = fns(demo)["chat"].fn({"text": "slow", "files": []}, [], [], None, set(), visitor_request(session="gone"),
                                progress=Bar())
    next(left)  # the chat shows the request at once
    left.close()  # the tab closed while the LLM plans
    orchestrator.engine.hold.set()
    try:
        wait_until(lambda: orchestrator.engine.states and orchestrator.engine.states[0].cancelled, timeout=5,
                   what="the request cancelled")
    finally:
        fns(demo)["cancel"].fn(gr.Request(session_hash="gone"))


def test_settings_are_checked_saved_for_the_session_and_forgotten():
    class Keyed:
        needs_llm_settings = False

    demo = build_app(Keyed(), files=VisitorFiles([Path("/nonexistent-gradio-root")]))
    save, forget = fns(demo)["save_settings"].fn, fns(demo)["forget_settings"].fn
    assert save("openai", "  sk-unit-1  ", "", None) == (
        VisitorLLM(api_key="sk-unit-1", api_type="openai"), "", "Saved for this browser session only: openai, key set.")
    assert save("local", "", " http://127.0.0.1:8006/v1 ", None) == (
        VisitorLLM(api_type="local", api_endpoint="http://127.0.0.1:8006/v1"), "",
        "Saved for this browser session only: local at http://127.0.0.1:8006/v1, key none.")
    kept = VisitorLLM(api_key="sk-kept", api_type="openai")
    assert save("azure", "", "http://127.0.0.1:9/", kept) == (
        VisitorLLM(api_key="sk-kept", api_type="azure", api_endpoint="http://127.0.0.1:9/"), "",
        "Saved for this browser session only: azure at http://127.0.0.1:9/, key set.")  # the box was emptied on Save
    assert save("", "k", None, None)[0] == VisitorLLM(api_key="k", api_type=None)
    assert save("openai", "", "", None) == (None, "", "⚠️ Enter an API key (or, for a keyless local LLM, its endpoint).")
    assert save("openai", None, None, kept)[0] == kept
    assert save("local", "", "ftp://x", kept) == (kept, "", "⚠️ api_endpoint must be an http(s) URL")
    assert save("openai", "sk bad key", "", kept) == (kept, "", "⚠️ api_key has characters an HTTP header cannot carry "
                                                              "(curly quotes, spaces, non-ASCII letters?); paste the key "
                                                              "again as plain text")
    assert forget() == (None, "", "Settings cleared for this session.")
    assert fns(demo)["clear"].fn() == ([], [], [], {"headers": COLUMNS, "data": []})


def component_props(demo, kind: str) -> list[dict]:
    return [c["props"] for c in demo.config["components"] if c["type"] == kind]


def test_the_app_says_what_it_is_and_opens_its_settings_when_it_has_no_llm():
    class Keyless:
        needs_llm_settings = True

    class Keyed:
        needs_llm_settings = False

    files = VisitorFiles()
    demo = build_app(Keyless(), title="My GPT", note="**Offline demo**", files=files, concurrency=3)
    markdown = [p["value"] for p in component_props(demo, "markdown")]
    assert markdown[0] == ("## My GPT\nAsk in plain language; attach images or audio. An LLM plans the request as tasks, "
                           "picks a Hugging Face model for each, runs them and writes the answer.\n\n**Offline demo**")
    assert "Kept in this browser session only: never logged, never shown back, never shared." in markdown
    assert [p["open"] for p in component_props(demo, "accordion")] == [True]
    assert demo.title == "My GPT" and fns(demo)["chat"].concurrency_limit == 3
    examples = re.findall(r"'path': '([^']+\.(?:jpg|wav))'", str(demo.config))
    assert len(examples) >= 4 and all(files.guarded(p) and files.allowed(None, p) for p in examples)  # everyone's
    keyed = build_app(Keyed(), files=VisitorFiles([Path("/nonexistent-gradio-root")]))
    markdown = [p["value"] for p in component_props(keyed, "markdown")]
    assert markdown[0].endswith("runs them and writes the answer.") and keyed.title == "HuggingGPT"
    assert "Optional: this app has an LLM. Your own settings apply to your session only." in markdown
    assert [p["open"] for p in component_props(keyed, "accordion")] == [False]
    assert fns(keyed)["chat"].concurrency_limit is None
    names = {f.api_name: (f.queue, f.concurrency_limit) for f in keyed.fns.values()}
    assert names["cancel"] == (False, None) and names["save_settings"][1] is None
    assert {"chat", "cancel", "save_settings", "forget_settings", "clear"} <= set(names)


# == launch.py ==========================================================================================================

def test_the_command_lines_defaults(monkeypatch):
    monkeypatch.delenv("HUGGINGGPT_API_TOKEN", raising=False)
    args = launch.parse_args([])
    assert vars(args) == {"config": "configs/config.gradio.yaml", "port": None, "host": None, "server": None,
                          "token": None, "visitor_keys": False, "verbose": False}
    monkeypatch.setenv("HUGGINGGPT_API_TOKEN", "env-token")
    args = launch.parse_args(["--port", "7001", "--host", "0.0.0.0", "--server", "http://x:8004", "--visitor-keys",
                              "--verbose", "--config", "c.yaml"])
    assert vars(args) == {"config": "c.yaml", "port": 7001, "host": "0.0.0.0", "server": "http://x:8004",
                          "token": "env-token", "visitor_keys": True, "verbose": True}
    assert launch.parse_args(["--token", "t"]).token == "t"
    port = launch.free_port()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    low, high = ephemeral_ports()
    assert low <= port <= high  # one the system chose, not a fixed one (root may bind any)


def test_the_demo_stack_starts_tools_demo_in_the_project_on_a_free_port_in_its_own_session(tmp_path, monkeypatch):
    """DemoStack runs the project's tools/demo.py (here one that says what the real one says when ready), from the
    project folder, in a session of its own (a Ctrl-C at the launcher's terminal reaches the launcher, which stops
    the stack in order), and stop() ends it."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "demo.py").write_text(
        "import sys, time\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "print(f'demo ready: http://127.0.0.1:{port}/  (Ctrl-C stops it)', flush=True)\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(launch, "ROOT", tmp_path)
    stack = launch.DemoStack()
    try:
        url = stack.wait(timeout=30)
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port > 1024
        assert stack.proc.args[0] == sys.executable
    finally:
        stack.stop()
    assert stack.proc.returncode == -signal.SIGTERM


def test_the_demo_stack_reports_where_and_how_its_child_ran(tmp_path, monkeypatch, capsys):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "demo.py").write_text(
        "import os, sys\nprint('cwd', os.getcwd(), 'own session', os.getsid(0) == os.getpid(), flush=True)\n"
        "print('error: port 8004 is taken by another program', file=sys.stderr, flush=True)\n")
    monkeypatch.setattr(launch, "ROOT", tmp_path)
    stack = launch.DemoStack()
    with pytest.raises(launch.StartError) as info:
        stack.wait(timeout=30)
    # its error, written to its stderr, is the reason given; what it said before is shown as it came
    assert str(info.value) == "the offline demo stack did not start: error: port 8004 is taken by another program"
    assert capsys.readouterr().err == f"  cwd {tmp_path} own session True\n  error: port 8004 is taken by another program\n"


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its parent to reap it has ended too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def fake_stack(script: str) -> launch.DemoStack:
    """A DemoStack whose child is a shell script saying what tools/demo.py would (no servers)."""
    stack = launch.DemoStack.__new__(launch.DemoStack)
    stack.proc = subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, start_new_session=True)
    return stack


def test_the_demo_stacks_url_is_the_one_it_says_it_is_ready_on(capsys, tmp_path):
    marker = tmp_path / "wrote its log"
    stack = fake_stack("echo 'building tiny models'; echo 'demo ready: http://127.0.0.1:8123/ (config x)'; "
                       f"head -c 1000000 /dev/zero; touch '{marker}'; sleep 30")
    try:
        assert stack.wait(timeout=10) == "http://127.0.0.1:8123"
        assert capsys.readouterr().err == "  building tiny models\n"
        assert stack.proc.poll() is None  # still serving
        [drain] = [t for t in threading.enumerate() if t.name == "demo-stack-log"]
        assert drain.daemon  # never holds up the launcher's exit
        # what the stack logs while it serves is read and dropped: a full pipe would stall its servers
        wait_until(marker.exists, timeout=10, what="the stack to write past a pipe's 64 KiB")
    finally:
        stack.stop()
    assert stack.proc.returncode == -signal.SIGTERM
    stack.stop()  # stopped already: nothing to do
    assert launch.DEMO_READY.match("demo ready: https://h:1 x").group(1) == "https://h:1"
    assert not launch.DEMO_READY.match("the demo ready: http://h:1 x")


def test_a_demo_stack_that_never_says_ready_is_stopped_with_its_last_line():
    stack = fake_stack("echo 'starting'; echo '  building'; echo 'error: port taken'")
    with pytest.raises(launch.StartError) as info:
        stack.wait(timeout=10)
    assert str(info.value) == "the offline demo stack did not start: error: port taken"  # its last line, as it is
    stack = fake_stack("true")
    with pytest.raises(launch.StartError, match=r"^the offline demo stack did not start: no output$"):
        stack.wait(timeout=10)
    stack = fake_stack("sleep 30")
    started = time.monotonic()
    with pytest.raises(launch.StartError, match=r"^the offline demo stack did not start: no output$"):
        stack.wait(timeout=0)  # out of time: stopped, not waited on
    assert stack.proc.returncode == -signal.SIGTERM and time.monotonic() - started < 5


def test_a_demo_stack_that_ignores_sigterm_is_killed_with_everything_it_started(capsys):
    """Past the grace after SIGTERM, the stack's whole session is killed: a models server it started is not left
    holding its port (or a GPU) after the launcher has gone."""
    stack = fake_stack("trap '' TERM; sleep 60 & echo \"server $!\"; echo 'demo ready: http://127.0.0.1:8124/ x'; wait")
    try:
        assert stack.wait(timeout=10) == "http://127.0.0.1:8124"
        server = int(re.fullmatch(r"  server (\d+)\n", capsys.readouterr().err).group(1))
        stopper = threading.Thread(target=stack.stop, kwargs={"grace": 0.5}, daemon=True)
        stopper.start()
        stopper.join(5)
        assert not stopper.is_alive(), "stop() waits on past its grace"
        assert stack.proc.returncode == -signal.SIGKILL
        wait_until(lambda: gone(server), timeout=5, what="the stack's own child to be killed with it")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stack.proc.pid, signal.SIGKILL)  # whatever failed above, nothing of it outlives the test


def test_a_demo_stack_that_stops_in_order_within_its_grace_is_not_killed_and_leaves_nothing(tmp_path, capsys):
    """SIGTERM first: a stack that takes a second to stop (within the grace) ends by itself, with its own exit
    code. A server it failed to stop (tools/demo.py's own wait on its models server can time out) is killed
    with what is left of its session."""
    stopped = tmp_path / "stopped in order"
    stack = fake_stack(f"trap 'sleep 1; touch \"{stopped}\"; exit 0' TERM; sleep 60 & echo \"server $!\"; "
                       "echo 'demo ready: http://127.0.0.1:8125/ x'; wait")
    try:
        assert stack.wait(timeout=10) == "http://127.0.0.1:8125"
        server = int(re.fullmatch(r"  server (\d+)\n", capsys.readouterr().err).group(1))
        stack.stop(grace=10)
        assert stack.proc.returncode == 0 and stopped.exists()
        wait_until(lambda: gone(server), timeout=5, what="the server the stack left to be killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(stack.proc.pid, signal.SIGKILL)


def test_on_a_running_orchestrator_the_launcher_checks_it_and_cleans_up(stand_in_server):
    import contextlib

    with contextlib.ExitStack() as stack:
        remote, options = launch.orchestrator_for(launch.parse_args(["--server", stand_in_server.url, "--token", "t"]),
                                                  stack)
        assert isinstance(remote, Remote) and remote.url == stand_in_server.url
        assert remote.headers == {"Authorization": "Bearer t"} and stand_in_server.seen[-1]["path"] == "/health"
        assert options == {"allowed_paths": [str(ROOT / "public" / "examples")]}
        assert remote.files.is_dir()
    assert not remote.files.exists()  # the app's download folder goes with it
    url = dead_url()
    with contextlib.ExitStack() as stack:
        with pytest.raises(launch.StartError, match=f"^cannot reach the orchestrator at {url} \\(ConnectionError\\)$"):
            launch.orchestrator_for(launch.parse_args(["--server", url]), stack)


def test_without_an_llm_the_launcher_starts_the_demo_stack_and_checks_it_answers(tmp_path, monkeypatch, capsys,
                                                                                   stand_in_server):
    """No LLM in the config and none in the environment: the offline demo stack (tools/demo.py, here one that
    says it is ready on the URL the test gives) is started, its orchestrator checked, and both stopped and
    removed with the launcher. A stack that says ready and does not answer is a one-line start error."""
    import contextlib

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = tmp_path / "keyless.yaml"
    config.write_text("inference_mode: huggingface\n")
    (tmp_path / "tools").mkdir()
    demo = tmp_path / "tools" / "demo.py"
    monkeypatch.setattr(launch, "ROOT", tmp_path)
    for url, answers in ((stand_in_server.url, True), (dead_url(), False)):
        demo.write_text("import os, time\nopen('demo.pid', 'w').write(str(os.getpid()))\n"
                        f"print('demo ready: {url}/  (Ctrl-C stops it)', flush=True)\ntime.sleep(60)\n")
        with contextlib.ExitStack() as stack:
            if answers:
                remote, options = launch.orchestrator_for(launch.parse_args(["--config", str(config)]), stack)
                assert isinstance(remote, Remote) and remote.url == url and remote.files.is_dir()
                assert stand_in_server.seen[-1]["path"] == "/health"
                assert options["note"].startswith("**Offline demo**: a scripted LLM")
                assert Path(f"/proc/{(tmp_path / 'demo.pid').read_text()}").exists()  # serving until the launcher stops
            else:
                with pytest.raises(launch.StartError, match=f"^cannot reach the orchestrator at {url} \\(ConnectionError\\)$"):
                    launch.orchestrator_for(launch.parse_args(["--config", str(config)]), stack)
        assert not Path(f"/proc/{(tmp_path / 'demo.pid').read_text()}").exists()  # stopped with the launcher
        if answers:
            assert not remote.files.exists()
    err = capsys.readouterr().err
    assert err.count("no LLM configured (the config names no LLM backend and OPENAI_API_KEY is not set); "
                     "starting the offline demo stack") == 2


def test_the_page_answers_only_with_a_200_within_its_time(stand_in_server):
    assert launch.page_answers(stand_in_server.url + "/health", seconds=5) is True
    started = time.monotonic()
    assert launch.page_answers(stand_in_server.url + "/nothing/here", seconds=0.5) is False  # 404: not the page
    assert launch.page_answers(dead_url() + "/", seconds=0.5) is False
    assert 1.0 <= time.monotonic() - started < 5  # each tried until its time is up, then no longer
    stand_in_server.health_status = 503
    assert launch.page_answers(stand_in_server.url + "/health", seconds=0) is False


def test_the_launcher_runs_the_engine_in_process_on_a_config_with_an_llm(tmp_path, llm, models_server, public_dir, capsys):
    import contextlib

    path = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                        max_concurrent_requests=3, max_body_bytes=123_456, unknown_unit_key=1)
    with contextlib.ExitStack() as stack:
        orchestrator, options = launch.orchestrator_for(launch.parse_args(["--config", str(path)]), stack)
    assert isinstance(orchestrator, InProcess) and orchestrator.needs_llm_settings is False
    assert options == {"allowed_paths": [str(ROOT / "public" / "examples")], "max_upload_bytes": 123_456, "slots": 3}
    assert orchestrator.slots == 3 and orchestrator.max_bytes == 123_456
    warned = [line for line in capsys.readouterr().err.splitlines() if "unknown_unit_key" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: "), warned
    keyless = tmp_path / "keyless"
    keyless.mkdir()
    data = write_config(keyless, llm.base_url, models_server[1], public_dir, semantic_ranking=False)
    import yaml

    config = yaml.safe_load(data.read_text())
    del config["local"], config["dev"]
    data.write_text(yaml.safe_dump(config))
    with contextlib.ExitStack() as stack:
        orchestrator, _ = launch.orchestrator_for(launch.parse_args(["--config", str(data), "--visitor-keys"]), stack)
    assert isinstance(orchestrator, InProcess) and orchestrator.needs_llm_settings is True
    with contextlib.ExitStack() as stack:
        with pytest.raises(launch.StartError, match=r"^config error: "):
            launch.orchestrator_for(launch.parse_args(["--config", str(tmp_path / "missing.yaml")]), stack)


@pytest.fixture(autouse=True)
def _root_logging(root_logger):
    """Every test here puts the root logger back (conftest's root_logger): `launch.main` sets up logging."""


@pytest.fixture
def launcher_process_state(monkeypatch):
    """What `launch.main` changes for its whole process, put back after a test that calls it: the environment
    it sets for the libraries (analytics, progress bars, verbosity), its `filterwarnings("ignore")`, and the
    SIGTERM/SIGINT handlers it installs."""
    import warnings

    for name in ("GRADIO_ANALYTICS_ENABLED", "TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY",
                 "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(warnings, "filters", warnings.filters[:])
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGTERM, handlers[0])
    signal.signal(signal.SIGINT, handlers[1])


@pytest.mark.usefixtures("launcher_process_state")
def test_main_says_in_one_line_why_it_cannot_start(capsys, stand_in_server):
    url = dead_url()
    assert launch.main(["--server", url, "--verbose"]) == 2
    assert capsys.readouterr().err == f"error: cannot reach the orchestrator at {url} (ConnectionError)\n"
    assert os.environ["GRADIO_ANALYTICS_ENABLED"] == "False" and "TQDM_DISABLE" not in os.environ
    assert launch.main(["--server", url]) == 2
    assert os.environ["TQDM_DISABLE"] == "1"  # library progress bars off unless --verbose
    capsys.readouterr()
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert launch.main(["--server", stand_in_server.url, "--port", str(port), "--host", "127.0.0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot serve on port {port}: ") and err.count("\n") == 1, err


@pytest.mark.usefixtures("launcher_process_state")
def test_serve_launches_the_app_says_where_it_is_ready_and_stops_on_sigterm(stand_in_server, capsys):
    """What `run_gradio_demo.py --server URL` does between start and stop, in this process: the app answers on
    the port asked for, the ready line names it once the page answers, SIGTERM (systemd, docker stop) ends it
    with 0 and the port is free again. The launch settings are read back from the running app's /config."""
    import requests

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    seen: dict[str, Any] = {}

    def stop_once_up() -> None:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "page" not in seen:
                with contextlib.suppress(requests.RequestException):
                    seen["page"] = requests.get(url + "/", timeout=2).status_code
                time.sleep(0.1)
            with contextlib.suppress(requests.RequestException, ValueError):
                seen["config"] = requests.get(url + "/config", timeout=5).json()
                example = ROOT / "public" / "examples" / "rocket.jpg"
                seen["example"] = requests.get(f"{url}/gradio_api/file={example}", timeout=5).status_code
                seen["elsewhere"] = requests.get(f"{url}/gradio_api/file={ROOT / 'README.md'}", timeout=5).status_code
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # whatever happened: the test never waits forever

    stopper = threading.Thread(target=stop_once_up, daemon=True)
    try:
        stopper.start()
        assert launch.main(["--server", stand_in_server.url, "--port", str(port), "--host", "127.0.0.1"]) == 0
    finally:
        stopper.join(10)
    out = capsys.readouterr().out
    assert re.fullmatch(rf"HuggingGPT Gradio app ready: {url}/  \(started in \d+\.\d s; Ctrl-C stops it\)\n"
                        rf"(Closing server running on port: {port}\n)?app stopped\n", out), out  # Gradio's own line
    assert seen["page"] == 200
    config = seen["config"]
    assert (config["title"], config["theme"], config["css"]) == ("HuggingGPT", "soft", CSS)
    assert config["max_file_size"] == 10 * 1024 * 1024 and config["show_error"] is False  # no tracebacks to visitors
    assert (seen["example"], seen["elsewhere"]) == (200, 403)  # the examples are served, nothing else of the project
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/", timeout=2)  # closed with the process's stop, not left serving


@pytest.mark.usefixtures("launcher_process_state")
def test_ctrl_c_while_the_launcher_waits_for_the_orchestrator_exits_130(capsys):
    """Ctrl-C before the app is up (an orchestrator that accepted the connection and never answered) ends the
    launcher at once with the shell's code for an interrupt, 130, not a traceback."""
    import socket

    signal.signal(signal.SIGINT, signal.default_int_handler)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        try:
            assert launch.main(["--server", f"http://127.0.0.1:{silent.getsockname()[1]}"]) == 130
        finally:
            timer.cancel()
    assert time.monotonic() - started < 10 and capsys.readouterr().err == ""
