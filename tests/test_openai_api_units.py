"""The OpenAI front door (openai_api.py) in-process: request bodies in, completions and chunks out, and its two
routes through the real app's test client with the pipeline scripted (tests/test_server_units.py's Engine).

tests/test_front_doors.py drives the same code through a server it starts, with the official `openai` client;
these pin each message, each refusal, each field and each chunk exactly, fast enough for the mutation audit.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import queue
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from hugginggpt import openai_api
from hugginggpt.config import load_config
from hugginggpt.errors import BadRequest, LLMError, NotFound
from hugginggpt.llm import LLMClient
from hugginggpt.openai_api import (
    AUDIO_FORMATS,
    MODELS,
    _content,
    _usage,
    chat_request,
    chunk,
    completion,
    files_markdown,
    generated_files,
)
from hugginggpt.request import ChatRequest, RequestState
from hugginggpt.uploads import UploadStore
from tests.conftest import make_public, wait_until, write_config


def png_data_uri() -> str:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def wav_b64() -> str:
    out = io.BytesIO()
    sf.write(out, np.zeros(800, dtype="float32"), 8000, format="WAV")
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture
def env(tmp_path):
    public = make_public(tmp_path / "public")
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public))
    return UploadStore(public, 10 * 1024 * 1024, 10**7), config


def test_a_plain_body_becomes_the_pipeline_request_with_its_mode(env):
    uploads, config = env
    req, mode, model = chat_request({"messages": [{"role": "user", "content": "draw a fox"}]}, uploads, config, "r1")
    assert (mode, model) == ("answer", "hugginggpt") and req.request_id == "r1"
    assert req.user_input == "draw a fox"
    req, mode, model = chat_request({"model": "hugginggpt-plan", "stream": False,
                                     "messages": [{"role": "user", "content": "x"}]}, uploads, config, "r2")
    assert (mode, model) == ("decisions", "hugginggpt-plan")
    assert MODELS == {"hugginggpt": "answer", "hugginggpt-plan": "decisions"}


@pytest.mark.parametrize("body, error, message", [
    ([], BadRequest, "the request body must be a JSON object with `model` and `messages`"),
    ({"model": "gpt-4o", "messages": []}, NotFound,
     "the model 'gpt-4o' does not exist; use one of hugginggpt, hugginggpt-plan (GET /v1/models)"),
    ({"model": 7, "messages": []}, NotFound, "the model '7' does not exist"),
    ({"model": "m" * 200, "messages": []}, NotFound, "the model '" + "m" * 80 + "' does not exist"),
    ({"stream": "yes", "messages": []}, BadRequest, "`stream` must be true or false"),
    ({"stream": 1, "messages": []}, BadRequest, "`stream` must be true or false"),
    ({"messages": "hi"}, BadRequest, '`messages` must be a list of {"role", "content"} objects'),
    ({}, BadRequest, "`messages` must be a list"),
])
def test_bad_bodies_are_refused_with_what_to_fix(env, body, error, message):
    uploads, config = env
    with pytest.raises(error) as err:
        chat_request(body, uploads, config, "r")
    assert str(err.value).startswith(message)


def test_a_message_that_is_not_an_object_is_refused_by_the_pipelines_own_check(env):
    uploads, config = env
    with pytest.raises(BadRequest):
        chat_request({"messages": ["hello"]}, uploads, config, "r")


def test_parts_become_the_text_then_each_files_public_path(env):
    uploads, config = env
    body = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is in"},
            {"type": "image_url", "image_url": {"url": png_data_uri()}},
            {"type": "text", "text": "and"},
            {"type": "input_audio", "input_audio": {"data": wav_b64(), "format": "wav"}},
        ]}]}
    req, _, _ = chat_request(body, uploads, config, "r")
    text = req.user_input
    head, image, audio = text.split(" (")
    assert head == "what is in and"
    assert image.startswith("/uploads/") and image.endswith(".png)")
    assert audio.startswith("/uploads/") and audio.endswith(".wav)")
    assert (uploads.public_dir / image[1:-1]).is_file() and (uploads.public_dir / audio[1:-1]).is_file()


def test_an_empty_list_of_parts_is_refused_like_empty_text(env):
    uploads, config = env
    with pytest.raises(BadRequest):
        chat_request({"messages": [{"role": "user", "content": []}]}, uploads, config, "r")


@pytest.mark.parametrize("part, message", [
    ({"type": "video", "video": {}}, "messages[0].content[1] must be a text, image_url or input_audio part"),
    ({"type": "text", "text": 5}, "messages[0].content[1] must be a text, image_url or input_audio part"),
    ("just a string", "messages[0].content[1] must be a text, image_url or input_audio part"),
    ({"type": "image_url", "image_url": "data:x"}, "messages[0].content[1].image_url.url must be a data URI or an "
                                                   "http(s) URL"),
    ({"type": "image_url", "image_url": {"url": ""}}, "messages[0].content[1].image_url.url must be a data URI"),
    ({"type": "image_url", "image_url": {"url": 5}}, "messages[0].content[1].image_url.url must be a data URI"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "must be a data URI or an http(s) URL"),
    ({"type": "image_url", "image_url": {"url": "ftp://a/b.png"}}, "must be a data URI or an http(s) URL"),
    ({"type": "image_url", "image_url": {"url": "data:audio/wav;base64," + wav_b64()}},
     "messages[0].content[1].image_url is not an image"),
    ({"type": "input_audio", "input_audio": {"data": wav_b64(), "format": "aac"}},
     "messages[0].content[1].input_audio needs base64 `data` and a `format` (wav, mp3, flac, ogg)"),
    ({"type": "input_audio", "input_audio": {"data": 5, "format": "wav"}}, "needs base64 `data`"),
    ({"type": "input_audio", "input_audio": "abc"}, "needs base64 `data`"),
    ({"type": "input_audio", "input_audio": {"data": "!!not base64!!", "format": "wav"}},
     "messages[0].content[1].input_audio.data is not base64"),
    ({"type": "input_audio", "input_audio": {"data": wav_b64()[:40] + "!" + wav_b64()[40:], "format": "wav"}},
     "messages[0].content[1].input_audio.data is not base64"),  # strict: a stray character is not skipped
    ({"type": "input_audio", "input_audio": {"data": png_data_uri().split(",")[1], "format": "wav"}},
     "messages[0].content[1].input_audio is not audio"),
])
def test_a_bad_part_is_named_by_its_place(env, part, message):
    uploads, config = env
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    with pytest.raises(BadRequest) as err:
        chat_request(body, uploads, config, "r")
    assert message in str(err.value)


def test_an_http_image_is_fetched_under_the_url_policy(env):
    uploads, config = env
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "HTTP://127.0.0.1:9/red.png"}}]}]}
    with pytest.raises(Exception) as err:  # loopback is refused by the default policy: nothing is fetched
        chat_request(body, uploads, config, "r")
    assert "refusing" in str(err.value)


def test_audio_formats():
    assert AUDIO_FORMATS == ("wav", "mp3", "flac", "ogg")


def test_files_become_markdown_images_and_links_with_absolute_urls():
    paths = ["/images/a.png", "/audios/b.wav", "/videos/c.mp4"]
    assert files_markdown(paths, "http://host:8004/") == (
        "\n\n![generated image](http://host:8004/images/a.png)\n[generated audio](http://host:8004/audios/b.wav)"
        "\n[generated video](http://host:8004/videos/c.mp4)")
    assert files_markdown(paths[:1], "http://h") == "\n\n![generated image](http://h/images/a.png)"
    assert files_markdown([], "http://h/") == ""


def test_content_of_an_answer_and_of_decisions():
    assert _content({"message": "The fox.", "other": 1}, "answer") == "The fox."
    assert _content({"no": "message"}, "answer") == ""
    assert _content("plain", "answer") == "plain"
    decisions = {"plan": [{"task": "x", "args": {"text": "été"}}], "at": time}
    out = _content(decisions, "decisions")
    assert json.loads(out)["plan"] == decisions["plan"] and "été" in out  # readable, any value serialised


def test_completion_and_chunk_have_openais_shape():
    before = int(time.time())
    body = completion("abc", "hugginggpt", "hello", {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3})
    assert body["id"] == "chatcmpl-abc" and body["object"] == "chat.completion" and body["model"] == "hugginggpt"
    assert before <= body["created"] <= int(time.time())
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                                "finish_reason": "stop"}]
    assert body["usage"]["total_tokens"] == 3
    line = chunk("abc", "hugginggpt", {"content": "é"}, "stop")
    assert line.startswith("data: ") and line.endswith("\n\n") and "é" in line
    data = json.loads(line[6:])
    assert data["id"] == "chatcmpl-abc" and data["object"] == "chat.completion.chunk" and data["model"] == "hugginggpt"
    assert before <= data["created"] <= int(time.time())
    assert data["choices"] == [{"index": 0, "delta": {"content": "é"}, "finish_reason": "stop"}]
    assert json.loads(chunk("abc", "m", {})[6:])["choices"][0]["finish_reason"] is None


def test_usage_and_files_of_a_request(tmp_path):
    assert _usage(None) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert generated_files(None) == []
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9",
                                      make_public(tmp_path / "public")))
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "x"}]}),
                         LLMClient(config.llm), None, 30)
    assert _usage(state) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    state.llm.usage.update({"prompt_tokens": 12, "completion_tokens": 5})
    assert _usage(state) == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    state.results[1] = {"inference result": {"generated audio": "/audios/b.wav"}}
    state.results[0] = {"inference result": {"generated image": "/images/a.png"}}
    assert generated_files(state) == ["/images/a.png", "/audios/b.wav"]


def test_mp3_without_a_tag_is_known_by_the_format_the_client_names(env):
    """Raw MPEG frames carry no magic bytes we sniff: the `format` is what tells it is audio."""
    uploads, config = env
    out = io.BytesIO()
    sf.write(out, (0.3 * np.sin(np.arange(16000) / 10)).astype("float32"), 16000, format="MP3")
    data = base64.b64encode(out.getvalue()).decode()
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "transcribe"}, {"type": "input_audio", "input_audio": {"data": data, "format": "mp3"}}]}]}
    req, _, _ = chat_request(body, uploads, config, "r")
    assert req.user_input.startswith("transcribe (/uploads/") and req.user_input.endswith(".mp3)")


class PngSite:
    """A loopback server with one PNG, for image URLs a /v1 client names."""

    def __init__(self, size=(8, 6)):
        from flask import Flask, Response

        from tests.fakes.llm_server import ThreadedServer

        out = io.BytesIO()
        Image.new("RGB", size, (10, 200, 30)).save(out, format="PNG")
        self.png, self.hits = out.getvalue(), []
        app = Flask("png-site")

        @app.get("/green.png")
        def green():
            self.hits.append(1)
            return Response(self.png, mimetype="image/png")

        self.server = ThreadedServer(app).start()
        self.url = self.server.url + "/green.png"


@pytest.fixture
def site():
    s = PngSite()
    yield s
    s.server.stop()


def allowing(tmp_path, **extra):
    public = make_public(tmp_path / "public")
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public,
                                      url_allowlist=["127.0.0.1"], **extra))
    return UploadStore(public, 10 * 1024 * 1024, 10**7), config


def image_body(url):
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is"},
                                                       {"type": "image_url", "image_url": {"url": url}}]}]}


def test_an_image_url_the_policy_allows_is_fetched_and_kept_as_an_upload(tmp_path, site):
    uploads, config = allowing(tmp_path)
    req, _, _ = chat_request(image_body(site.url), uploads, config, "r")
    path = req.user_input.split("(")[1].rstrip(")")
    assert (uploads.public_dir / path.lstrip("/")).read_bytes() == site.png and site.hits == [1]
    req, _, _ = chat_request(image_body(site.url.replace("http://", "HTTP://")), uploads, config, "r")
    assert "/uploads/" in req.user_input  # the scheme in any case


def test_an_image_url_is_fetched_under_the_configured_size_limit_and_proxy(tmp_path, site):
    uploads, config = allowing(tmp_path, max_fetch_bytes=len(site.png) - 1)
    with pytest.raises(Exception, match="larger than"):
        chat_request(image_body(site.url), uploads, config, "r")
    from tests.conftest import free_port

    site.hits.clear()
    uploads, config = allowing(tmp_path, proxy=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(Exception, match="failed"):
        chat_request(image_body(site.url), uploads, config, "r")
    assert site.hits == []  # through the (dead) proxy, never straight to the site


def test_an_https_image_url_is_fetched_too(env):
    uploads, config = env
    for url in ("https://127.0.0.1:9/red.png", "HTTPS://127.0.0.1:9/red.png"):
        with pytest.raises(Exception) as err:  # fetched under the policy, which refuses loopback: nothing is fetched
            chat_request(image_body(url), uploads, config, "r")
        assert "refusing" in str(err.value) and "must be a data URI" not in str(err.value)


# -- the routes, through the app's test client -------------------------------------------------------------------
# The real app of server.create_app with the pipeline scripted (tests/test_server_units.py's Engine): what an
# OpenAI SDK sees of /v1/models and /v1/chat/completions, and what the pipeline was asked.

V1 = "/v1/chat/completions"
ASK_V1 = {"model": "hugginggpt", "messages": [{"role": "user", "content": "draw a fox"}]}
LEFT = "client went away; cancelling"


@pytest.fixture
def app_site(tmp_path):
    from tests.test_server_units import build

    return build(tmp_path)


def v1_error(resp) -> dict:
    return resp.get_json()["error"]


def with_files_and_usage(state, message="A fox."):
    """What a pipeline that made an image and a sound, after two LLM calls, leaves in its request state."""
    state.llm.usage.update({"prompt_tokens": 12, "completion_tokens": 5})
    state.results[1] = {"inference result": {"generated audio": "/audios/b.wav"}}
    state.results[0] = {"inference result": {"generated image": "/images/a.png"}}
    return {"message": message}


FILES_MD = "\n\n![generated image](http://localhost/images/a.png)\n[generated audio](http://localhost/audios/b.wav)"


def test_models_lists_the_two_models_openai_s_way(app_site):
    client, _, _ = app_site
    resp = client.get("/v1/models")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    assert resp.get_json() == {"object": "list", "data": [
        {"id": "hugginggpt", "object": "model", "created": 0, "owned_by": "hugginggpt"},
        {"id": "hugginggpt-plan", "object": "model", "created": 0, "owned_by": "hugginggpt"}]}
    resp = client.post("/v1/models", json={})
    assert resp.status_code == 405
    assert v1_error(resp) == {"message": "The method is not allowed for the requested URL.",
                              "type": "invalid_request_error", "param": None, "code": None}


def test_a_completion_is_the_answer_with_its_files_and_usage(app_site):
    client, engine, _ = app_site
    engine.script = lambda state, mode: with_files_and_usage(state)
    before = int(time.time())
    resp = client.post(V1, json={**ASK_V1, "temperature": 0.2, "n": 1, "api_key": "sk-elsewhere"},
                       headers={"X-Request-ID": "rid-v1"})
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.mimetype == "application/json" and resp.headers["X-Request-ID"] == "rid-v1"
    body = resp.get_json()
    assert before <= body.pop("created") <= int(time.time())
    assert body == {"id": "chatcmpl-rid-v1", "object": "chat.completion", "model": "hugginggpt",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "A fox." + FILES_MD},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}}
    [(req, mode, _)] = engine.calls
    assert mode == "answer" and req.request_id == "rid-v1" and req.user_input == "draw a fox"
    assert (req.api_key, req.api_type, req.api_endpoint) == (None, None, None)  # the body's extras are not overrides


def test_a_completion_without_files_or_usage_is_the_bare_answer(app_site):
    client, engine, _ = app_site
    engine.script = lambda state, mode: {"message": "Just words."}
    body = client.post(V1, json={"messages": ASK_V1["messages"], "stream": False}).get_json()
    assert body["model"] == "hugginggpt"  # the default model
    assert body["choices"][0]["message"]["content"] == "Just words."
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def test_the_plan_model_answers_the_decisions_as_json(app_site):
    client, engine, _ = app_site
    decisions = {"plan": [{"task": "text-to-image", "id": 0}], "message": "not this"}
    engine.script = lambda state, mode: decisions
    body = client.post(V1, json={**ASK_V1, "model": "hugginggpt-plan"}).get_json()
    assert body["model"] == "hugginggpt-plan"
    assert json.loads(body["choices"][0]["message"]["content"]) == decisions
    assert [mode for _, mode, _ in engine.calls] == ["decisions"]


def test_an_image_part_is_stored_in_the_apps_uploads_and_named_to_the_pipeline(app_site):
    client, engine, app = app_site
    engine.script = lambda state, mode: {"message": state.request.user_input}
    resp = client.post(V1, json={**ASK_V1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": png_data_uri()}}]}]})
    said = resp.get_json()["choices"][0]["message"]["content"]
    assert said.startswith("what is this (/uploads/") and said.endswith(".png)")
    public = app.extensions["hugginggpt"].config.public_dir
    assert (public / said.split("(/")[1].rstrip(")")).is_file()


@pytest.mark.parametrize("kwargs, status, message", [
    ({"json": {**ASK_V1, "model": "gpt-4o"}}, 404,
     "the model 'gpt-4o' does not exist; use one of hugginggpt, hugginggpt-plan (GET /v1/models)"),
    ({"json": {**ASK_V1, "stream": "yes"}}, 400, "`stream` must be true or false"),
    ({"json": ["not", "an", "object"]}, 400, "the request body must be a JSON object with `model` and `messages`"),
    ({"json": {"model": "hugginggpt"}}, 400, '`messages` must be a list of {"role", "content"} objects'),
    ({"data": "{not json", "content_type": "application/json"}, 400,
     'the request body must be JSON, e.g. {"messages": [{"role": "user", "content": "..."}]}; this is not valid JSON'),
    ({"data": "draw a fox", "content_type": "text/plain"}, 415,
     "send the body as JSON with `Content-Type: application/json` (got text/plain)"),
])
def test_a_bad_request_is_refused_in_openai_s_shape_before_anything_runs(app_site, kwargs, status, message):
    client, engine, _ = app_site
    resp = client.post(V1, **kwargs)
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert v1_error(resp) == {"message": message, "type": "invalid_request_error", "param": None,
                              "code": "model_not_found" if status == 404 else None}
    assert engine.calls == []


def test_a_pipeline_error_is_an_openai_error_with_its_status(app_site):
    client, engine, _ = app_site

    def fails(state, mode):
        raise LLMError("the LLM said no")

    engine.script = fails
    resp = client.post(V1, json=ASK_V1)
    assert resp.status_code == 502
    assert v1_error(resp) == {"message": "the LLM said no", "type": "llm_backend_error", "param": None,
                              "code": None}


def test_a_client_that_leaves_a_completion_stops_its_work(app_site, caplog):
    """Answered in one piece: waitress's `client_disconnected` is watched and the work cancelled."""
    client, engine, _ = app_site
    engine.script = lambda state, mode: {"message": f"cancelled: {state.cancelled.wait(3)}"}
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        resp = client.post(V1, json=ASK_V1, headers={"X-Request-ID": "rid-gone"},
                           environ_base={"waitress.client_disconnected": lambda: True})
    assert resp.get_json()["choices"][0]["message"]["content"] == "cancelled: True"
    assert time.monotonic() - started < 2
    assert f"[rid-gone] {LEFT}" in caplog.messages


# -- streams -------------------------------------------------------------------------------------------------------


def frames(text: str) -> list[str]:
    """The server-sent events of a stream, each without its blank line."""
    assert text.endswith("\n\n"), text
    return text[:-2].split("\n\n")


def deltas(text: str, request_id: str, model: str = "hugginggpt") -> list[tuple[dict, str | None]]:
    """(delta, finish_reason) of each chunk of a stream that ended with `data: [DONE]`; checks each chunk's fields."""
    *chunks, done = frames(text)
    assert done == "data: [DONE]"
    out = []
    for frame in chunks:
        if frame == ": keep-alive":
            continue
        assert frame.startswith("data: ")
        data = json.loads(frame[len("data: "):])
        assert (data["id"], data["object"], data["model"]) == (f"chatcmpl-{request_id}", "chat.completion.chunk",
                                                                model)
        assert isinstance(data["created"], int) and abs(data["created"] - time.time()) < 60
        [choice] = data["choices"]
        assert choice["index"] == 0
        out.append((choice["delta"], choice["finish_reason"]))
    return out


ROLE = ({"role": "assistant", "content": ""}, None)
STOP = ({}, "stop")


def stream(client, body=None, request_id="rid-s", **kwargs):
    resp = client.post(V1, json={**(body or ASK_V1), "stream": True}, headers={"X-Request-ID": request_id}, **kwargs)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    return resp


def test_a_stream_sends_the_tokens_then_the_rest_then_stop_and_done(app_site, caplog):
    client, engine, _ = app_site

    def answer(state, mode):
        state.emit("plan", {"tasks": []})  # not a token: not sent
        for piece in ("The ", "fox"):
            state.emit("answer_token", {"text": piece})
        state.emit("answer_token", {})  # a token without text is an empty piece
        return with_files_and_usage(state, "The fox.")

    engine.script = answer
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        resp = stream(client)
        text = resp.get_data(as_text=True)
        resp.close()
    assert resp.mimetype == "text/event-stream"
    assert resp.headers["Cache-Control"] == "no-cache" and resp.headers["X-Accel-Buffering"] == "no"
    assert deltas(text, "rid-s") == [ROLE, ({"content": "The "}, None), ({"content": "fox"}, None),
                                     ({"content": ""}, None), ({"content": "." + FILES_MD}, None), STOP]
    [(req, mode, thread)] = engine.calls
    assert (req.request_id, req.user_input, mode, thread) == ("rid-s", "draw a fox", "answer", "v1-rid-s")
    assert not any(LEFT in m for m in caplog.messages)  # read to its end: nothing to cancel


def test_an_answer_that_is_not_what_was_streamed_comes_after_a_blank_line(app_site):
    client, engine, _ = app_site

    def answer(state, mode):
        state.emit("answer_token", {"text": "draft"})
        return {"message": "Final."}

    engine.script = answer
    assert deltas(stream(client).get_data(as_text=True), "rid-s") == [
        ROLE, ({"content": "draft"}, None), ({"content": "\n\nFinal."}, None), STOP]


def test_an_answer_without_tokens_comes_in_one_chunk_and_an_empty_one_in_none(app_site):
    client, engine, _ = app_site
    engine.script = lambda state, mode: {"message": "Whole answer é"}
    text = stream(client).get_data(as_text=True)
    assert deltas(text, "rid-s") == [ROLE, ({"content": "Whole answer é"}, None), STOP]
    engine.script = lambda state, mode: {"message": ""}
    assert deltas(stream(client).get_data(as_text=True), "rid-s") == [ROLE, STOP]


def test_a_stream_of_the_plan_model_sends_the_decisions(app_site):
    client, engine, _ = app_site
    decisions = {"plan": [{"task": "text-to-image", "id": 0}], "message": "not this"}
    engine.script = lambda state, mode: decisions
    got = deltas(stream(client, {**ASK_V1, "model": "hugginggpt-plan"}).get_data(as_text=True), "rid-s",
                 "hugginggpt-plan")
    assert got[0] == ROLE and got[2:] == [STOP]
    assert json.loads(got[1][0]["content"]) == decisions
    assert [mode for _, mode, _ in engine.calls] == ["decisions"]


def test_a_pipeline_error_ends_the_stream_with_an_openai_error(app_site, caplog):
    client, engine, _ = app_site

    def fails(state, mode):
        state.emit("answer_token", {"text": "par"})
        raise LLMError("the LLM said no: été")

    engine.script = fails
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        text = stream(client).get_data(as_text=True)
    assert not any(LEFT in m for m in caplog.messages)  # the work has ended: nothing to cancel
    assert "été" in text  # as UTF-8, not escaped
    *chunks, error_frame, done = frames(text)
    assert deltas("\n\n".join([*chunks, done]) + "\n\n", "rid-s") == [ROLE, ({"content": "par"}, None)]
    assert json.loads(error_frame.removeprefix("data: ")) == {"error": {
        "message": "the LLM said no: été", "type": "llm_backend_error", "param": None, "code": None}}
    assert done == "data: [DONE]"


def test_an_unexpected_failure_ends_the_stream_with_a_server_error_and_a_log(app_site, caplog):
    client, engine, _ = app_site

    def breaks(state, mode):
        raise RuntimeError("secret detail")

    engine.script = breaks
    with caplog.at_level(logging.ERROR, logger="hugginggpt.openai_api"):
        text = stream(client).get_data(as_text=True)
    assert frames(text)[1:] == ['data: {"error": {"message": "internal error (RuntimeError)", "type": "server_error", '
                                '"param": null, "code": null}}', "data: [DONE]"]
    [record] = [r for r in caplog.records if r.name == "hugginggpt.openai_api"]
    assert record.getMessage() == "stream failed" and record.exc_info[0] is RuntimeError


class TimedQueue(queue.Queue):
    """A queue that notes how long the stream would wait for each event, and waits at most 50 ms."""

    waits: list = []

    def get(self, block=True, timeout=None):
        TimedQueue.waits.append(timeout)
        return super().get(block, min(timeout, 0.05))


@pytest.fixture
def timed(monkeypatch):
    TimedQueue.waits = []
    monkeypatch.setattr(openai_api, "queue", SimpleNamespace(Queue=TimedQueue, Empty=queue.Empty))
    return TimedQueue.waits


def answers_after_a_while(state, mode):
    time.sleep(0.3)  # longer than the 50 ms TimedQueue waits: keep-alives come between
    return {"message": "done"}


def test_a_slow_answer_is_kept_alive_by_comments(app_site, timed):
    client, engine, _ = app_site

    engine.script = answers_after_a_while
    text = stream(client).get_data(as_text=True)
    assert ": keep-alive" in frames(text)  # a whole SSE comment, which SDKs skip
    assert deltas(text, "rid-s") == [ROLE, ({"content": "done"}, None), STOP]
    assert set(timed) == {openai_api.HEARTBEAT_SECONDS}  # on a server that cannot tell a client left: every 10 s


def test_a_stream_whose_client_left_is_cancelled_at_the_next_check(app_site, timed, caplog):
    client, engine, _ = app_site
    seen = []

    def waits(state, mode):
        seen.append(state.cancelled.wait(2))
        return {"message": "late"}

    engine.script = waits
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        text = stream(client, request_id="rid-left",
                      environ_base={"waitress.client_disconnected": lambda: True}).get_data(as_text=True)
    assert deltas(text + "data: [DONE]\n\n", "rid-left") == [ROLE]  # nothing after the first check, not even [DONE]
    assert "data: [DONE]" not in text
    assert timed == [0.5]  # on waitress: checked twice a second
    wait_until(lambda: seen, 5, "the work to end")
    assert seen == [True] and f"[rid-left] {LEFT}" in caplog.messages


def test_a_stream_with_a_connected_client_keeps_checking(app_site, timed):
    client, engine, _ = app_site

    engine.script = answers_after_a_while
    text = stream(client, environ_base={"waitress.client_disconnected": lambda: False}).get_data(as_text=True)
    assert deltas(text, "rid-s") == [ROLE, ({"content": "done"}, None), STOP]
    assert ": keep-alive" in frames(text) and set(timed) == {0.5}


def test_a_stream_holds_its_slot_until_its_work_has_ended_even_when_the_client_left(tmp_path, caplog):
    from tests.test_server_units import build

    client, engine, _ = build(tmp_path, admission=threading.BoundedSemaphore(1))
    release = threading.Event()
    seen: list = []

    def slow(state, mode):
        seen.append(state)
        release.wait(10)  # the pipeline does not notice the cancel at once
        return {"message": "late"}

    engine.script = slow
    with caplog.at_level(logging.INFO, logger="hugginggpt.streamwork"):
        resp = client.post(V1, json={**ASK_V1, "stream": True}, headers={"X-Request-ID": "rid-bye"}, buffered=False)
        first = next(iter(resp.response)).decode()
        assert deltas(first + "data: [DONE]\n\n", "rid-bye") == [ROLE]
        resp.close()  # the client leaves
        wait_until(lambda: seen and seen[0].cancelled.is_set(), 5, "the work cancelled")
    assert f"[rid-bye] {LEFT}" in caplog.messages
    engine.script = lambda state, mode: {"message": "ok"}
    with client.post(V1, json=ASK_V1) as busy:
        assert busy.status_code == 429  # the work still runs
    release.set()

    def admitted() -> bool:
        with client.post(V1, json=ASK_V1) as resp:
            return resp.status_code == 200

    wait_until(admitted, 5, "the slot given back")
