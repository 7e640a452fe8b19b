"""Progress from hosted providers (issue 48): fal-ai's queue, polled by huggingface_hub itself, seen as the
task's progress. The fake router speaks fal's queue protocol as huggingface_hub 2.4.0 uses it
(tests/fakes/router_server.py); the real InferenceClient polls it."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from hugginggpt import taskprogress
from hugginggpt.backends import TaskInputs
from hugginggpt.resources import resolve
from tests.conftest import sse, start_server, stop_server, write_config
from tests.fakes.router_server import Served
from tests.test_hosted_as_met import TOKEN, backend, fake, servers, urls  # noqa: F401 - fixtures

RESTYLER = "acme/restyler"


def restyle(public_dir) -> TaskInputs:
    return TaskInputs("image-to-image", text="as a watercolour", image=resolve("/examples/red.png", public_dir, 10**7, 5))


@pytest.mark.parametrize("written", ["{router}", "{router}/", "{upper}", "{padded}"])
def test_a_fal_queue_position_and_its_start_are_the_task_s_progress(fake, urls, public_dir, written):  # noqa: F811
    """However the router's URL is written in the config (a trailing slash, an upper-case host)."""
    base, _ = urls
    host, port = base.rsplit(":", 1)
    router = written.format(router=base, upper=base.replace("http://127.0.0.1", "HTTP://127.0.0.1"),
                            padded=f"{host}:0{port}")  # as sent: port 08123 is 8123
    fake.serve(RESTYLER, "image-to-image", Served("fal-ai", "fal-ai/restyler/dev", "image-to-image"))
    fake.fal_queue["fal-ai/restyler/dev"] = [2, 1, 0, "IN_PROGRESS", "IN_PROGRESS"]
    seen: list[dict] = []
    with taskprogress.listening(seen.append):
        result = backend(router, public_dir, providers=("fal-ai",)).infer(RESTYLER, restyle(public_dir))
    assert result["provider"] == "fal-ai"
    image = Image.open(public_dir / result["generated image"].lstrip("/"))
    assert image.getpixel((0, 0)) == (30, 60, 90)
    assert seen == [{"phase": "queued", "waiting": "2 ahead in fal-ai's queue"},
                    {"phase": "queued", "waiting": "1 ahead in fal-ai's queue"},
                    {"phase": "queued", "waiting": "next in fal-ai's queue"},
                    {"phase": "running", "waiting": "at fal-ai"},
                    {"phase": "running", "waiting": "at fal-ai"}], seen
    polls = [c["poll"] for c in fake.calls_to("fal-ai") if "poll" in c]
    assert polls == ["status"] * 6 + ["result"]


def test_the_orchestrator_s_stream_shows_a_hosted_task_s_place_in_fal_s_queue(fake, urls, public_dir, tmp_path, llm):  # noqa: F811
    """What a user of /hugginggpt with `stream: true` sees while fal's queue holds their image-to-image task."""
    router, _ = urls
    fake.serve("timbrooks/instruct-pix2pix", "image-to-image",
               Served("fal-ai", "fal-ai/instruct-pix2pix", "image-to-image"))
    fake.fal_queue["fal-ai/instruct-pix2pix"] = [1, 0, "IN_PROGRESS"]
    config = write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": TOKEN, "router_url": router}, semantic_ranking=False,
                          choose_model="ranking", progress_interval_ms=0)
    srv = start_server(config, tmp_path, env={"HF_ENDPOINT": router, "HF_HUB_DISABLE_TELEMETRY": "1"})
    try:
        llm.on("parse_task", json.dumps([{"task": "image-to-image", "id": 0, "dep": [-1],
                                          "args": {"image": "/examples/red.png", "text": "as a watercolour"}}]))
        resp = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "paint /examples/red.png"}],
                                        "stream": True}, stream=True, timeout=60)
        events = sse(resp)
    finally:
        stop_server(srv)
    progress = [e for name, e in events if name == "task_progress"]
    assert [(e["phase"], e.get("waiting")) for e in progress] == [
        ("queued", "1 ahead in fal-ai's queue"), ("queued", "next in fal-ai's queue"), ("running", "at fal-ai")], events
    assert {(e["id"], e["task"], e["model"], e["hosted_on"]) for e in progress} == \
        {(0, "image-to-image", "timbrooks/instruct-pix2pix", "huggingface")}
    names = [name for name, _ in events]
    assert names.index("task_started") < names.index("task_progress") and \
        max(i for i, n in enumerate(names) if n == "task_progress") < names.index("task_finished")
    assert TOKEN not in json.dumps(events) and "queue.fal.run" not in json.dumps(events)


def test_only_a_queue_s_known_answers_become_progress_and_only_their_numbers_pass():
    from hugginggpt.backends.provider_progress import queue_event

    assert queue_event({"status": "IN_QUEUE", "queue_position": 0}, "fal-ai") == \
        {"phase": "queued", "waiting": "next in fal-ai's queue"}
    assert queue_event({"status": "IN_QUEUE", "queue_position": 7}, "fal-ai")["waiting"] == "7 ahead in fal-ai's queue"
    for odd in (True, -1, 2.5, "3", None, 10**7):  # not a count a person reads: the queue without a number
        assert queue_event({"status": "IN_QUEUE", "queue_position": odd}, "fal-ai") == \
            {"phase": "queued", "waiting": "in fal-ai's queue"}, odd
    assert queue_event({"status": "IN_PROGRESS", "logs": [{"message": "token hf_x at https://internal/"}]},
                       "fal-ai") == {"phase": "running", "waiting": "at fal-ai"}
    for other in ({"status": "COMPLETED"}, {"status": "FAILED"}, {}, [], "IN_QUEUE", None):
        assert queue_event(other, "fal-ai") is None, other


class _Response:
    def __init__(self, method: str, status: int, body: bytes):
        self.request = type("Request", (), {"method": method})()
        self.status_code = status
        self._body = body

    def read(self) -> bytes:
        return self._body

    def json(self):
        return json.loads(self._body)


def test_only_a_queue_status_path_of_the_router_is_read():
    from hugginggpt.backends.provider_progress import on_status

    body = json.dumps({"status": "IN_QUEUE", "queue_position": 3}).encode()
    seen: list[dict] = []
    with taskprogress.listening(seen.append):
        on_status("/fal-ai/fal-ai/flux/requests/abc/status", _Response("GET", 200, body))
        on_status("/fal-ai/fal-ai/flux/requests/abc", _Response("GET", 200, body))  # the result, not a status
        on_status("/fal-ai/fal-ai/flux/requests/abc/status", _Response("POST", 200, body))
        on_status("/fal-ai/fal-ai/flux/requests/abc/status", _Response("GET", 500, body))
        on_status("/Evil Provider/x/requests/abc/status", _Response("GET", 200, body))  # not a provider's name
        on_status("/fal-ai/fal-ai/flux/requests/abc/status", _Response("GET", 200, b"<html>busy</html>"))
    assert seen == [{"phase": "queued", "waiting": "3 ahead in fal-ai's queue"}]
