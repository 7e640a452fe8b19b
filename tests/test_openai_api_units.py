"""The OpenAI front door's translation (openai_api.py) on its own: request bodies in, completions and chunks out.

tests/test_front_doors.py drives the same code through the server with the official `openai` client; these pin
each message, each refusal and each field exactly, fast enough for the mutation audit.
"""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from hugginggpt.config import load_config
from hugginggpt.errors import BadRequest, NotFound
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
from tests.conftest import make_public, write_config


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
