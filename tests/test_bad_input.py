"""Bad input gets a 4xx JSON error naming the problem; an LLM outage gets a 502; the server survives."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.conftest import start_server, stop_server, write_config


def error_of(resp: requests.Response) -> str:
    body = resp.json()
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str)
    assert "Traceback" not in resp.text
    return body["error"]["message"]


@pytest.mark.parametrize(
    "body, status, words",
    [
        ("not json at all", 400, "must be JSON"),
        ([1, 2], 400, "JSON object"),
        ({}, 400, "`messages` is required"),
        ({"messages": "hi"}, 400, "must be a list"),
        ({"messages": []}, 400, "is empty"),
        ({"messages": [{"role": "user"}]}, 400, "content must be a string"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role must be"),
        ({"messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
        ({"messages": ["hi"]}, 400, "must be an object"),
        ({"messages": [{"role": "user", "content": "   "}]}, 400, "last message is empty"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_type": "bogus"}, 400, "api_type must be one of"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_endpoint": "ftp://x"}, 400, "http(s) URL"),
        ({"messages": [{"role": "user", "content": "hi"}], "api_key": 12}, 400, "`api_key` must be a string"),
        ({"messages": [{"role": "user", "content": "hi"}], "return_decisions": "yes"}, 400, "true or false"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": 1}, 400, "`stream` must be true or false"),
        ({"messages": [{"role": "user", "content": "hi"}] * 201}, 400, "201 items; at most 200"),
        ({"messages": [{"role": "user", "content": "x" * 100_001}]}, 400, "longer than 100000 characters"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": ["gpt"]}, 400, "`model` must be a string"),
    ],
)
@pytest.mark.parametrize("route", ["/hugginggpt", "/tasks", "/results"])
def test_bad_bodies(server, llm, route, body, status, words):
    if isinstance(body, str):
        resp = requests.post(server.url + route, data=body, headers={"Content-Type": "application/json"}, timeout=10)
    else:
        resp = server.post(route, body)
    assert resp.status_code == status
    assert words in error_of(resp)


def test_body_over_the_size_limit(server):
    big = {"messages": [{"role": "user", "content": "x" * 300_000}]}
    resp = server.post("/hugginggpt", big)
    assert resp.status_code == 413 and "larger than" in error_of(resp)


def test_wrong_method_and_unknown_route(server):
    assert requests.get(server.url + "/hugginggpt", timeout=5).status_code == 405
    assert requests.post(server.url + "/nope", json={}, timeout=5).status_code in (404, 405)


def test_path_escape_is_refused(server, llm, models):
    assert requests.get(server.url + "/../secret.txt", timeout=5).status_code == 404
    assert requests.get(server.url + "/%2e%2e/secret.txt", timeout=5).status_code == 404
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "../secret.txt"}}]))
    results = server.post("/results", {"messages": [{"role": "user", "content": "caption ../secret.txt"}]}).json()
    assert "outside public/" in results["0"]["inference result"]["error"]["message"]
    assert models.calls == []


def test_missing_input_file_is_a_task_error_not_a_crash(server, llm, models):
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/nope.png"}}]))
    resp = server.post("/hugginggpt", {"messages": [{"role": "user", "content": "caption /examples/nope.png"}]})
    assert resp.status_code == 200
    assert "file not found" in resp.json()["message"]  # the response stage saw the error in the log


def test_llm_outage_is_a_502_naming_the_backend(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, "http://127.0.0.1:9", models_url, public_dir)
    srv = start_server(config, tmp_path)
    try:
        resp = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 502
        message = error_of(resp)
        assert "the configured LLM (local" in message and "unreachable" in message
        assert "127.0.0.1:9" not in message  # the backend by its kind: a client is not told the configured URL
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200  # still serving
    finally:
        stop_server(srv)


def test_llm_http_error_is_a_502(server, llm):
    llm.fail(500, 500, 500, 500)
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 502 and "HTTP 500" in error_of(resp)


def test_llm_transient_errors_are_retried(server, llm):
    llm.fail(429, 503)
    llm.on("parse_task", '[{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a"}}]')
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "draw a"}]})
    assert resp.status_code == 200 and resp.json()[0]["task"] == "text-to-image"
    assert len([r for r in llm.requests if r["stage"] == "failed"]) == 2


def test_keys_never_reach_the_log_or_the_answer(server, llm):
    secret = "sk-verysecretkey1234567890"
    llm.fail(401, 401, 401, 401)
    resp = server.post("/tasks", {"messages": [{"role": "user", "content": "hi"}], "api_key": secret})
    assert resp.status_code == 502
    assert secret not in resp.text and secret not in server.logs()
    assert llm.requests  # the key was used for the call...
    assert len([r for r in llm.requests if r["stage"] == "failed"]) == 1  # a 401 is final: not retried


def bomb_png(width: int = 30_000, height: int = 30_000) -> bytes:
    """A tiny PNG whose header claims a huge image: decoding it would take gigabytes."""
    import io
    import struct
    import zlib

    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8, 8)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr:ihdr + 17])) & 0xFFFFFFFF
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def test_deeply_nested_json_and_lone_surrogates_are_400(server, llm):
    nested = '{"messages": ' + "[" * 50_000 + "]" * 50_000 + "}"
    resp = requests.post(server.url + "/tasks", data=nested, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "nested too deeply" in error_of(resp)
    deep = '{"messages": ' + "[" * 5000 + "]" * 5000 + "}"
    resp = requests.post(server.url + "/tasks", data=deep, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "nested too deeply" in error_of(resp)
    lone = '{"messages": [{"role": "user", "content": "draw \\ud800 a cat"}]}'
    resp = requests.post(server.url + "/tasks", data=lone, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "lone surrogate" in error_of(resp)
    key = '{"messages": [{"role": "user", "content": "hi"}], "api_key": "\\udfff"}'
    resp = requests.post(server.url + "/tasks", data=key, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "`api_key`" in error_of(resp)
    assert llm.requests == []
    assert requests.get(server.url + "/health", timeout=5).status_code == 200


def test_a_symlink_cannot_lead_out_of_public(server, public_dir):
    link = public_dir / "examples" / "link-out.txt"
    if not link.is_symlink():
        link.symlink_to(public_dir.parent / "secret.txt")
    resp = requests.get(server.url + "/examples/link-out.txt", timeout=5)
    assert resp.status_code == 404 and "do not serve me" not in resp.text
    assert requests.get(server.url + "/examples/red.png", timeout=5).status_code == 200


def test_uploads_are_decoded_before_they_are_kept(server, public_dir):
    import io

    from PIL import Image

    before = set((public_dir / "uploads").glob("*")) if (public_dir / "uploads").is_dir() else set()
    fake = requests.post(server.url + "/upload", files={"file": ("x.png", b"\x89PNG\r\n\x1a\n<script>alert(1)</script>")},
                         timeout=5)
    assert fake.status_code == 400 and "not a readable image" in error_of(fake)
    bomb = requests.post(server.url + "/upload", files={"file": ("bomb.png", bomb_png())}, timeout=5)
    assert bomb.status_code == 400 and "pixels" in error_of(bomb)
    # 48 million pixels: under Pillow's own bomb threshold, over our max_image_pixels (40 million)
    big = requests.post(server.url + "/upload", files={"file": ("big.png", bomb_png(8000, 6000))}, timeout=5)
    assert big.status_code == 400 and "8000x6000 pixels; at most 40,000,000" in error_of(big)
    noise = requests.post(server.url + "/upload", files={"file": ("a.wav", b"RIFF\x00\x00\x00\x00WAVEjunk")}, timeout=5)
    assert noise.status_code == 400 and "audio" in error_of(noise)
    after = set((public_dir / "uploads").glob("*")) if (public_dir / "uploads").is_dir() else set()
    assert after == before  # nothing was kept
    buf = io.BytesIO()
    Image.new("RGB", (10, 10), (1, 2, 3)).save(buf, format="PNG")
    ok = requests.post(server.url + "/upload", files={"file": ("ok.png", buf.getvalue())}, timeout=5)
    assert ok.status_code == 200
    served = requests.get(server.url + ok.json()["path"], timeout=5)
    assert served.headers["X-Content-Type-Options"] == "nosniff" and served.headers["Content-Type"] == "image/png"


def test_the_upload_quota_refuses_without_deleting(tmp_path, llm, models_server):
    import io

    from PIL import Image

    from tests.conftest import make_public

    _, models_url = models_server
    public = make_public(tmp_path / "public")
    config = write_config(tmp_path, llm.base_url, models_url, public, semantic_ranking=False, upload_quota_mb=0.01)
    srv = start_server(config, tmp_path)
    try:
        kept = []
        for seed in range(20):
            buf = io.BytesIO()
            Image.effect_noise((40, 40), 50 + seed).convert("RGB").save(buf, format="PNG")
            resp = requests.post(srv.url + "/upload", files={"file": ("n.png", buf.getvalue())}, timeout=5)
            if resp.status_code != 200:
                break
            kept.append(resp.json()["path"])
        assert resp.status_code == 507 and "upload_quota_mb" in error_of(resp)
        assert kept and all((public / p.lstrip("/")).is_file() for p in kept)
        assert sum((public / p.lstrip("/")).stat().st_size for p in kept) <= 0.01 * 1024 * 1024
    finally:
        stop_server(srv)


def test_a_decompression_bomb_is_a_400_on_the_models_server(tmp_path):
    import base64

    from tests.conftest import make_public
    from tests.test_models_server import start_models_server

    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, tmp_path / "no-models", public, deployment="minimal")
    try:
        uri = "data:image/png;base64," + base64.b64encode(bomb_png()).decode()
        resp = requests.post(url + "/models/canny-control", json={"img_url": uri}, timeout=30)
        assert resp.status_code == 400 and "pixels" in resp.json()["error"]["message"]
        big = "data:image/png;base64," + base64.b64encode(bomb_png(8000, 6000)).decode()
        resp = requests.post(url + "/models/canny-control", json={"img_url": big}, timeout=30)
        assert resp.status_code == 400 and "at most 40,000,000 pixels" in resp.json()["error"]["message"]
        ok = requests.post(url + "/models/canny-control", json={"img_url": "/examples/red.png"}, timeout=30)
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_models_server_refuses_internal_urls(tmp_path):
    from flask import Flask

    from tests.conftest import make_public
    from tests.fakes.llm_server import ThreadedServer
    from tests.test_models_server import start_models_server

    hits: list[str] = []
    inside = Flask("inside")

    @inside.get("/red.png")
    def red():
        hits.append("red")
        return (public / "examples" / "red.png").read_bytes()

    inner = ThreadedServer(inside).start()
    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, tmp_path / "no-models", public, deployment="minimal")
    try:
        for form in ("127.0.0.1", "[::ffff:127.0.0.1]", "127.1"):
            resp = requests.post(url + "/models/canny-control",
                                 json={"img_url": f"http://{form}:{inner.port}/red.png"}, timeout=30)
            assert resp.status_code == 400 and "refusing" in resp.json()["error"]["message"]
        assert hits == []
    finally:
        proc.terminate()
        proc.wait(10)
        inner.stop()


def test_an_unexpected_crash_is_a_json_500_and_the_server_keeps_serving(tmp_path, llm, models_server):
    """A bug inside a stage must give a JSON 500 that names no internals, not an HTML page or a traceback."""
    from hugginggpt.catalog import KeywordRanker
    from hugginggpt.chat import HuggingGPT
    from hugginggpt.config import load_config
    from hugginggpt.server import create_app
    from tests.conftest import make_public
    from tests.fakes.llm_server import ThreadedServer

    class Crashing(HuggingGPT):
        def run(self, request, mode="answer", on_event=None, state_ready=None):
            raise KeyError("internal detail 42")

    _, models_url = models_server
    config = load_config(write_config(tmp_path, llm.base_url, models_url, make_public(tmp_path / "public")))
    srv = ThreadedServer(create_app(config, Crashing(config, ranker=KeywordRanker()))).start()
    try:
        resp = requests.post(srv.url + "/tasks", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert resp.status_code == 500 and resp.headers["Content-Type"].startswith("application/json")
        message = error_of(resp)
        assert "internal error (KeyError)" in message and "internal detail 42" not in resp.text
        assert requests.get(srv.url + "/health", timeout=5).status_code == 200
    finally:
        srv.stop()


def test_a_runaway_plan_is_refused_at_once(server, llm, models):
    chain = [{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}] + [
        {"task": "image-to-text", "id": i, "dep": [i - 1], "args": {"image": f"<GENERATED>-{i - 1}"}}
        for i in range(1, 2000)]
    llm.on("parse_task", json.dumps(chain))
    started = time.monotonic()
    resp = server.post("/hugginggpt", {"messages": [{"role": "user", "content": "caption it 2000 times"}]})
    assert resp.status_code == 200 and "2000 tasks" in resp.json()["message"] and "max_tasks" in resp.json()["message"]
    assert time.monotonic() - started < 10  # refused when the plan was read, not at the deadline
    assert len(models.calls) <= 32  # only what the stream had started (max_tasks), and that was cancelled


@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_from_the_llm_is_not_a_5xx(server, llm, models, stream):
    """JSON from the LLM can carry `\\ud800`; it reaches the models server and the answer as U+FFFD, not a 502."""
    llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 0, "dep": [-1],
                                      "args": {"text": "Anna \ud800 lives in Berlin"}}]))
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "tag it"}],
                                                           "stream": stream}, timeout=30)
    assert resp.status_code == 200
    sent = [c["body"]["text"] for c in models.calls if c["model"] == "dslim/bert-base-NER"]
    assert sent and "\ufffd" in sent[-1] and "\ud800" not in sent[-1]
