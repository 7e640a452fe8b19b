"""The MCP tools (hugginggpt/mcp/tools.py) in-process: the official SDK's client on the server object, no
transport, against the scripted LLM and the fake models server on loopback. tests/test_mcp.py drives the same
tools over stdio and HTTP; these pin each schema, each refusal and each result field, fast enough for the
mutation audit (docs/TESTING.md)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import threading
import time
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from mcp import Client
from PIL import Image

from hugginggpt import __version__
from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.config import load_config
from hugginggpt.errors import BackendError
from hugginggpt.mcp.tools import INSTRUCTIONS, HuggingGPTServer, Tools, build_server
from tests.conftest import make_public, wait_until, write_config

VIT = "google/vit-base-patch16-224"
FOX_AND_NAMES = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
    {"task": "token-classification", "id": 1, "dep": [-1], "args": {"text": "Zoë lives in Paris"}},
])


def png(size: tuple[int, int], color: tuple[int, int, int] = (0, 0, 255)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def mp3() -> bytes:
    """An MP3 with no ID3 tag: no magic bytes say what it is, only a file name ending in .mp3 does."""
    out = io.BytesIO()
    sf.write(out, np.zeros(8000, dtype="float32"), 16000, format="MP3")
    return out.getvalue()


def data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


class Work:
    """Stands in for the StreamWork of an MCP call over HTTP: records the request states it is handed."""

    def __init__(self):
        self.states: list[Any] = []

    def state_ready(self, state) -> None:
        self.states.append(state)


def calls_of(work: Work):
    def calls(ctx):
        ctx.request_context  # noqa: B018 - as mount.py: only the Context of a real request has one (else it raises)
        return work

    return calls


def call(server, name: str, args: dict[str, Any]):
    """One tool call, as an MCP client makes it (the SDK's Client on the server object, in-process)."""

    async def go():
        async with Client(server) as client:
            return await client.call_tool(name, args)

    return asyncio.run(asyncio.wait_for(go(), 30))


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def error_of(result) -> str:
    """The tool error a client shows: one line, no traceback."""
    assert result.is_error, text_of(result)
    [block] = result.content
    assert block.type == "text" and "\n" not in block.text and "Traceback" not in block.text
    return block.text


def said(result, tool: str) -> str:
    """What the server said in a tool error, after the SDK's `Error executing tool <name>: `."""
    message = error_of(result)
    assert message.startswith(f"Error executing tool {tool}: "), message
    return message.removeprefix(f"Error executing tool {tool}: ")


def make_engine(folder: Path, llm_url: str, models_url: str, public: Path, backends=None, **extra) -> HuggingGPT:
    config = load_config(write_config(folder, llm_url, models_url, public, semantic_ranking=False, **extra))
    return HuggingGPT(config, ranker=KeywordRanker(), backends=backends)


@pytest.fixture
def engine(tmp_path, llm, models, models_server, public_dir) -> HuggingGPT:
    """The fake models server's public/ (so generated files are there), facebook/* denied, loopback URLs allowed."""
    return make_engine(tmp_path, llm.base_url, models_server[1], public_dir, denied_models=["facebook/*"],
                       url_allowlist=["127.0.0.1"])


@pytest.fixture
def site(tmp_path) -> Path:
    return make_public(tmp_path / "public")


def site_engine(tmp_path: Path, site: Path, **extra) -> HuggingGPT:
    """An engine over a public/ of this test's own (nothing runs a model on it)."""
    return make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, **extra)


def uploads(public: Path) -> list[Path]:
    return sorted((public / "uploads").glob("*")) if (public / "uploads").is_dir() else []


def planner_prompt(llm) -> str:
    [asked] = llm.stage_requests("parse_task")
    return asked["body"]["messages"][-1]["content"]


def request_count(engine: HuggingGPT, mode: str) -> str:
    """The /metrics line that counts this engine's finished requests of `mode`."""
    text = engine.metrics.exposition().decode()
    return next((line for line in text.splitlines()
                 if line.startswith(f'hugginggpt_request_seconds_count{{mode="{mode}"')), "")


# -- what a client sees before it calls anything ---------------------------------------------------------------


def test_the_server_names_itself_and_says_what_its_tools_are_for(engine):
    async def go():
        async with Client(build_server(engine)) as client:
            return client.server_info, client.instructions

    info, instructions = asyncio.run(go())
    assert (info.name, info.title, info.version) == ("hugginggpt", "HuggingGPT", __version__)
    assert instructions == INSTRUCTIONS
    assert "`run_model` to run one task on a model you name" in instructions


def test_the_four_tools_their_arguments_and_which_of_them_only_read(engine):
    async def go():
        async with Client(build_server(engine)) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = asyncio.run(go())
    assert {name: t.title for name, t in tools.items()} == {
        "hugginggpt": "Ask HuggingGPT", "plan": "Plan without running", "run_model": "Run one model",
        "search_models": "Search the model catalog"}
    schemas = {name: t.input_schema for name, t in tools.items()}
    assert {name: s.get("required", []) for name, s in schemas.items()} == {
        "hugginggpt": ["text"], "plan": ["text"], "run_model": ["task", "model"], "search_models": []}
    assert {name: list(s["properties"]) for name, s in schemas.items()} == {
        "hugginggpt": ["text", "image", "audio"], "plan": ["text", "image", "audio"],
        "run_model": ["task", "model", "text", "image", "audio"], "search_models": ["task", "q", "limit"]}
    assert schemas["hugginggpt"]["properties"]["text"]["type"] == "string"
    assert schemas["plan"]["properties"]["image"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    limit = schemas["search_models"]["properties"]["limit"]
    assert (limit["type"], limit["default"], limit["description"]) == ("integer", 10, "how many models, 1 to 100")
    assert "data: URI" in schemas["run_model"]["properties"]["audio"]["description"]
    for name in ("plan", "search_models"):  # a client may run these without asking its user
        hints = tools[name].annotations
        assert (hints.read_only_hint, hints.open_world_hint) == (True, False)
    assert tools["hugginggpt"].annotations is None and tools["run_model"].annotations is None


# -- hugginggpt ------------------------------------------------------------------------------------------------


def test_hugginggpt_answers_with_the_drawn_image_and_every_task_result(engine, llm, models, public_dir):
    llm.on("parse_task", FOX_AND_NAMES)
    work = Work()
    result = call(build_server(engine, calls=calls_of(work)), "hugginggpt", {"text": "draw a fox; who is in it?"})
    assert not result.is_error, text_of(result)
    found = result.structured_content
    assert list(found) == ["message", "files", "results", "request_id"]
    assert found["message"].startswith("ANSWER based on:")
    assert list(found["results"]) == ["0", "1"]
    drawn = found["results"]["0"]["inference result"]["generated image"]
    assert found["files"] == [drawn]
    assert found["results"]["1"]["inference result"]["predicted"][0]["word"] == "Zoë"
    answer, image, results = result.content
    assert answer.type == "text" and answer.text == found["message"]
    assert (image.type, image.mime_type) == ("image", "image/png")
    assert base64.b64decode(image.data) == (public_dir / drawn.lstrip("/")).read_bytes()
    assert results.type == "text"
    assert results.text == "Task results: " + json.dumps(found["results"], ensure_ascii=False)
    assert '"word": "Zoë"' in results.text  # as written, not \u00eb
    [state] = work.states  # the call's work was handed the request, so a client leaving cancels it
    assert found["request_id"] == state.request.request_id
    assert sorted(c["model"] for c in models.calls) == ["dslim/bert-base-NER", "stabilityai/stable-diffusion-xl-base-1.0"]
    assert request_count(engine, "answer") == 'hugginggpt_request_seconds_count{mode="answer",outcome="ok"} 1.0'


def test_a_request_that_needs_no_task_is_answered_in_words_alone(engine, llm, models):
    llm.on("parse_task", "Hello! Nothing to run for that.")
    result = call(build_server(engine), "hugginggpt", {"text": "hi there"})
    assert not result.is_error, text_of(result)
    assert [(c.type, c.text) for c in result.content] == [("text", result.structured_content["message"])]
    assert result.structured_content["files"] == [] and result.structured_content["results"] == {}
    assert models.calls == []


@pytest.mark.parametrize("tool", ["hugginggpt", "plan"])
def test_the_inputs_are_named_to_the_planner_after_the_words(tool, engine, llm, models):
    result = call(build_server(engine), tool, {"text": "describe both", "image": "/examples/red.png",
                                               "audio": "/examples/hello.wav"})
    assert not result.is_error, text_of(result)
    assert "describe both\nImage: /examples/red.png\nAudio: /examples/hello.wav" in planner_prompt(llm)


# -- plan ------------------------------------------------------------------------------------------------------


def test_plan_decides_the_models_and_runs_nothing(engine, llm, models):
    llm.on("parse_task", FOX_AND_NAMES)
    work = Work()
    result = call(build_server(engine, calls=calls_of(work)), "plan", {"text": "dessine un renard, légende"})
    assert not result.is_error, text_of(result)
    decisions = result.structured_content["decisions"]
    assert decisions["input"] == "dessine un renard, légende"
    assert {k: s["selected_model"] for k, s in decisions["model_selections"].items()} == {
        "0": "stabilityai/stable-diffusion-xl-base-1.0", "1": "dslim/bert-base-NER"}
    [block] = result.content
    assert block.type == "text" and block.text == json.dumps(result.structured_content, ensure_ascii=False)
    assert "légende" in block.text
    assert models.calls == []
    [state] = work.states
    assert state.request.user_input == "dessine un renard, légende"
    assert request_count(engine, "decisions") == 'hugginggpt_request_seconds_count{mode="decisions",outcome="ok"} 1.0'


# -- inputs: public/ paths, data URIs, URLs --------------------------------------------------------------------


def test_an_image_sent_as_a_data_uri_is_kept_under_uploads_and_named_to_the_planner(tmp_path, site, llm):
    engine = make_engine(tmp_path, llm.base_url, "http://127.0.0.1:9", site)
    sent = png((30, 20))
    result = call(build_server(engine), "plan", {"text": "what is this?", "image": data_uri("image/png", sent)})
    assert not result.is_error, text_of(result)
    [kept] = uploads(site)
    assert kept.read_bytes() == sent and kept.suffix == ".png"
    assert f"what is this?\nImage: /uploads/{kept.name}" in planner_prompt(llm)


@pytest.mark.parametrize(("args", "message"), [
    ({"audio": "/examples/red.png"}, "`audio` must be audio; got image/png"),
    ({"image": "/examples/hello.wav"}, "`image` must be an image; got audio/wav"),
    ({"audio": data_uri("image/png", png((4, 4)))}, "`audio` must be audio; got image/png"),
    ({"image": "data:image/png;base64,bm90IGFuIGltYWdl"},
     "unsupported file type application/octet-stream; upload an image (png, jpeg, gif, webp) or audio (wav, flac, "
     "ogg, mp3)"),
])
def test_an_input_of_the_wrong_kind_is_refused_before_anything_is_planned(args, message, tmp_path, site, llm):
    result = call(build_server(site_engine(tmp_path, site)), "plan", {"text": "look", **args})
    assert said(result, "plan") == message
    assert llm.requests == []


def test_a_request_without_words_stores_none_of_its_inputs(tmp_path, site):
    result = call(build_server(site_engine(tmp_path, site)), "hugginggpt",
                  {"text": "  ", "image": data_uri("image/png", png((5, 5)))})
    assert said(result, "hugginggpt") == "the last message is empty: it must hold the request"
    assert uploads(site) == []


@pytest.mark.parametrize(("limits", "message"), [
    ({"max_fetch_bytes": 1000}, "data URI is larger than the 0 MiB limit"),
    ({"upload_quota_mb": 0.0001}, "the upload quota (0 MiB for public/uploads) is used up; remove old uploads or "
                                  "raise upload_quota_mb"),
    ({"max_image_pixels": 100}, "the uploaded image is 40x30 pixels; at most 100 pixels are accepted"),
])
def test_an_upload_is_held_to_the_servers_limits(limits, message, tmp_path, site):
    image = data_uri("image/png", png((40, 30), (255, 0, 0)) + b"\0" * 2000)  # over 1000 bytes either way
    result = call(build_server(site_engine(tmp_path, site, **limits)), "plan", {"text": "look", "image": image})
    assert said(result, "plan") == message
    assert uploads(site) == []


@pytest.mark.parametrize("space", ["", " \n"])
def test_a_data_uri_is_judged_by_its_bytes_never_by_a_file_name_written_into_it(space, tmp_path, site):
    """A data URI has no file name: an MP3 without magic bytes is refused even when its text ends in `/x.mp3`
    (base64 decoding skips the stray `.`, so the rest only adds a few bytes the MP3 reader ignores)."""
    sound = mp3()
    sound += b"\0" * (-len(sound) % 3)  # no `=` padding before the tail
    uri = space + data_uri("audio/mpeg", sound) + "AAA/voice.mp3"
    result = call(build_server(site_engine(tmp_path, site)), "plan", {"text": "transcribe", "audio": uri})
    assert said(result, "plan").startswith("unsupported file type application/octet-stream; ")
    assert uploads(site) == []


class Web(BaseHTTPRequestHandler):
    """Files on a loopback web server; as a proxy (an absolute URL asked), it serves its own picture instead."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append(self.path)
        if self.path.startswith("http://"):
            self.send(png((7, 7)), "image/png")
        elif self.path.startswith("/clips/voice.mp3"):
            self.send(mp3(), "application/octet-stream")
        elif self.path == "/slow.png":
            time.sleep(3)
            self.send(png((2, 2)), "image/png")
        else:
            self.send(png((5, 5)), "image/png")

    def send(self, body: bytes, mime: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", mime)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Web)
    server.daemon_threads = True
    server.seen = []
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server
    server.shutdown()


@pytest.mark.parametrize(("path", "space"), [("/clips/voice.mp3?sig=a?b", ""), ("/clips/voice.mp3", " \n")])
def test_a_url_is_fetched_under_the_url_policy_and_kept_by_its_file_name(path, space, tmp_path, site, llm, web):
    """The name in the URL's path (its query string and the spaces around the URL left out) tells an MP3
    without magic bytes."""
    engine = make_engine(tmp_path, llm.base_url, "http://127.0.0.1:9", site, url_allowlist=["127.0.0.1"])
    url = f"{space}http://127.0.0.1:{web.server_port}{path}{space}"
    result = call(build_server(engine), "plan", {"text": "transcribe", "audio": url})
    assert not result.is_error, text_of(result)
    [kept] = uploads(site)
    assert kept.read_bytes() == mp3() and kept.suffix == ".mp3"
    assert f"transcribe\nAudio: /uploads/{kept.name}" in planner_prompt(llm)
    assert web.seen == [path]


def test_a_url_the_policy_refuses_is_never_fetched(tmp_path, site, llm, web):
    engine = make_engine(tmp_path, llm.base_url, "http://127.0.0.1:9", site)  # no url_allowlist: loopback is private
    result = call(build_server(engine), "plan", {"text": "look", "image": f"http://127.0.0.1:{web.server_port}/a.png"})
    assert said(result, "plan").startswith(f"refusing to fetch 'http://127.0.0.1:{web.server_port}/a.png'")
    assert web.seen == [] and uploads(site) == []


def test_a_url_is_fetched_through_the_configured_proxy(tmp_path, site, web):
    tools = Tools(site_engine(tmp_path, site, url_allowlist=["127.0.0.1"], proxy=f"http://127.0.0.1:{web.server_port}"))
    url = "http://127.0.0.1:9/pics/cat.png"  # nothing listens there: only the proxy can answer
    request = tools.request("look", url, None)  # the request as the planner gets it (the LLM is behind the proxy too)
    assert web.seen == [url]
    [kept] = uploads(site)
    assert request.user_input == f"look\nImage: /uploads/{kept.name}"
    with Image.open(kept) as image:
        assert image.size == (7, 7)  # the proxy's picture


def test_a_url_that_answers_too_slowly_is_given_up_at_fetch_timeout(tmp_path, site, llm, web):
    engine = make_engine(tmp_path, llm.base_url, "http://127.0.0.1:9", site, url_allowlist=["127.0.0.1"],
                         fetch_timeout=1.0)
    url = f"http://127.0.0.1:{web.server_port}/slow.png"
    started = time.monotonic()
    result = call(build_server(engine), "plan", {"text": "look", "image": url})
    assert said(result, "plan").startswith(f"fetching '{url}' ")
    assert time.monotonic() - started < 2.5  # the server takes 3 s
    assert uploads(site) == []


# -- generated files as MCP content ----------------------------------------------------------------------------


def test_generated_images_and_audio_become_content_in_order_and_nothing_else_does(tmp_path, site):
    (site / "examples" / "voice.mp3").write_bytes(mp3())
    (site / "examples" / "notes.txt").write_text("not media")
    tools = Tools(site_engine(tmp_path, site))
    blocks = tools.media(["/nope.png", "/../secret.txt", "/examples/notes.txt", "/examples/red.png",
                          "/examples/voice.mp3", "/examples/green.jpg", "/examples/hello.wav"])
    assert [(b.type, b.mime_type) for b in blocks] == [
        ("image", "image/png"), ("audio", "audio/mpeg"), ("image", "image/jpeg"), ("audio", "audio/wav")]
    names = ["red.png", "voice.mp3", "green.jpg", "hello.wav"]
    assert [base64.b64decode(b.data) for b in blocks] == [(site / "examples" / n).read_bytes() for n in names]


def test_a_generated_file_over_max_output_bytes_stays_a_path(tmp_path, site):
    size = (site / "examples" / "red.png").stat().st_size
    assert (site / "examples" / "hello.wav").stat().st_size > size
    tools = Tools(site_engine(tmp_path, site))
    tools.config = tools.config.with_overrides(max_output_bytes=size)
    assert [b.mime_type for b in tools.media(["/examples/hello.wav", "/examples/red.png"])] == ["image/png"]
    tools.config = tools.config.with_overrides(max_output_bytes=size - 1)
    assert tools.media(["/examples/red.png"]) == []


# -- run_model -------------------------------------------------------------------------------------------------


def test_run_model_runs_the_named_model_on_an_image(engine, llm, models):
    work = Work()
    result = call(build_server(engine, calls=calls_of(work)), "run_model",
                  {"task": "image-classification", "model": f"  {VIT} ", "image": "/examples/red.png"})
    assert not result.is_error, text_of(result)
    inference = {"predicted": [{"label": "tabby cat", "score": 0.9}, {"label": "dog", "score": 0.1}]}
    assert result.structured_content == {
        "task": {"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
        "inference result": inference,
        "choose model result": {"id": VIT, "reason": "named by the caller"},
        "hosted_on": "local", "files": []}
    assert [(c.type, c.text) for c in result.content] == [("text", json.dumps(inference))]
    assert [c["model"] for c in models.calls] == [VIT]
    assert llm.requests == []  # one named model: nothing planned, chosen or answered
    [state] = work.states  # the call's work was handed the run, so a client leaving cancels it
    assert state.selections[0].result().model_id == VIT


def test_run_model_passes_text_as_it_is_and_shows_it_unescaped(engine, models):
    result = call(build_server(engine), "run_model",
                  {"task": "token-classification", "model": "dslim/bert-base-NER", "text": "Zoë lives in Paris"})
    assert not result.is_error, text_of(result)
    assert result.structured_content["task"]["args"] == {"text": "Zoë lives in Paris"}
    [block] = result.content
    assert block.text == json.dumps(result.structured_content["inference result"], ensure_ascii=False)
    assert '"word": "Zoë"' in block.text


def test_run_model_hears_audio_and_hands_back_spoken_audio(engine, models, public_dir):
    heard = call(build_server(engine), "run_model",
                 {"task": "automatic-speech-recognition", "model": "openai/whisper-base", "audio": "/examples/hello.wav"})
    assert not heard.is_error, text_of(heard)
    assert heard.structured_content["task"]["args"] == {"audio": "/examples/hello.wav"}
    assert heard.structured_content["inference result"]["text"].startswith("transcript of ")
    spoken = call(build_server(engine), "run_model",
                  {"task": "text-to-speech", "model": "microsoft/speecht5_tts", "text": "hello"})
    assert not spoken.is_error, text_of(spoken)
    [path] = spoken.structured_content["files"]
    assert path == spoken.structured_content["inference result"]["generated audio"]
    words, audio = spoken.content
    assert words.type == "text" and path in words.text
    assert (audio.type, audio.mime_type) == ("audio", "audio/wav")
    assert base64.b64decode(audio.data) == (public_dir / path.lstrip("/")).read_bytes()


@pytest.mark.parametrize(("args", "message"), [
    ({"task": "image-classification", "model": VIT}, "give the model its input: `text`, `image` or `audio`"),
    ({"task": "image-to-text", "model": VIT, "image": "<GENERATED>-0"},
     "run_model takes its inputs as they are; `<GENERATED>-N` names the output of a planned task, which a single "
     "model run has none of"),
    ({"task": "summarization", "model": VIT, "text": "sum up <generated>-1 please"},
     "run_model takes its inputs as they are; `<GENERATED>-N` names the output of a planned task, which a single "
     "model run has none of"),
    ({"task": "summarization", "model": VIT, "text": "< generated >-1"},
     "an argument refers to task 1, which is not in the plan"),
    ({"task": "no-such-task", "model": VIT, "text": "hi"},
     "unknown task type 'no-such-task'; supported types are listed in the planner prompt"),
    ({"task": "image-classification", "model": "bad model!", "image": "/examples/red.png"},
     "`model` must be a model id such as google/vit-base-patch16-224, got 'bad model!'"),
    ({"task": "image-classification", "model": "org/a..b", "image": "/examples/red.png"},
     "`model` must be a model id such as google/vit-base-patch16-224, got 'org/a..b'"),
    ({"task": "image-classification", "model": "m" * 150 + "!", "image": "/examples/red.png"},
     f"`model` must be a model id such as google/vit-base-patch16-224, got '{'m' * 100}'"),
    ({"task": "object-detection", "model": "facebook/detr-resnet-50", "image": "/examples/red.png"},
     "facebook/detr-resnet-50 is not permitted here (allowed_models / denied_models)"),
    # denied_models holds for every spelling that would reach the models server as the same id
    *[({"task": "object-detection", "model": spelled, "image": "/examples/red.png"},
       "facebook/detr-resnet-50 is not permitted here (allowed_models / denied_models)")
      for spelled in (" facebook/detr-resnet-50", "facebook/detr-resnet-50 ", "\tfacebook/detr-resnet-50\n")],
    ({"task": "image-classification", "model": "nobody/unknown-model", "image": "/examples/red.png"},
     "nobody/unknown-model is not available on the local models server"),
])
def test_run_model_refuses_with_a_reason_and_runs_nothing(args, message, engine, llm, models):
    assert said(call(build_server(engine), "run_model", args), "run_model") == message
    assert models.calls == [] and llm.requests == []


def test_a_model_that_fails_is_a_tool_error_naming_it_and_where_it_ran(engine, models):
    models.broken.add(VIT)
    result = call(build_server(engine), "run_model",
                  {"task": "image-classification", "model": VIT, "image": "/examples/red.png"})
    message = error_of(result)
    assert message.startswith(f"Error executing tool run_model: {VIT} (local) failed: every candidate failed: ")
    assert f"{VIT} crashed (scripted)" in message


class Backend:
    """An in-process model backend: `models` it serves, each answering `reply` (or raising BackendError)."""

    def __init__(self, name: str, *models: str, reply: Any = None):
        self.name, self.models, self.reply = name, set(models), reply
        self.calls: list[tuple[str, Any]] = []

    def is_available(self, model_id: str) -> bool:
        return model_id in self.models

    def infer(self, model_id: str, inputs) -> dict[str, Any]:
        self.calls.append((model_id, inputs))
        if isinstance(self.reply, Exception):
            raise self.reply
        return {"generated text": f"{self.name} read {inputs.text}"} if self.reply is None else self.reply


def hybrid(tmp_path, site, local: Backend, hosted: Backend, mode: str = "hybrid") -> HuggingGPT:
    return make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, inference_mode=mode,
                       backends={"local": local, "huggingface": hosted})


def test_run_model_uses_the_first_backend_in_order_that_has_the_model(tmp_path, site):
    local, hosted = Backend("local", "org/both"), Backend("huggingface", "org/both", "org/hosted-only")
    server = build_server(hybrid(tmp_path, site, local, hosted))
    on_both = call(server, "run_model", {"task": "summarization", "model": "org/both", "text": "x"})
    hosted_only = call(server, "run_model", {"task": "summarization", "model": "org/hosted-only", "text": "y"})
    assert on_both.structured_content["hosted_on"] == "local"
    assert on_both.structured_content["inference result"] == {"generated text": "local read x"}
    assert hosted_only.structured_content["hosted_on"] == "huggingface"
    assert hosted_only.structured_content["choose model result"] == {"id": "org/hosted-only",
                                                                     "reason": "named by the caller"}
    assert [m for m, _ in local.calls] == ["org/both"] and [m for m, _ in hosted.calls] == ["org/hosted-only"]


@pytest.mark.parametrize(("mode", "where"), [
    ("hybrid", "the local models server or hosted inference"),
    ("huggingface", "hosted inference"),
])
def test_a_model_no_backend_has_is_refused_naming_where_it_was_looked_for(mode, where, tmp_path, site):
    server = build_server(hybrid(tmp_path, site, Backend("local", "a/b"), Backend("huggingface", "c/d"), mode))
    result = call(server, "run_model", {"task": "summarization", "model": "x/y", "text": "t"})
    assert error_of(result) == f"Error executing tool run_model: x/y is not available on {where}"


def test_a_failure_spread_over_lines_reaches_the_client_as_one_line(tmp_path, site):
    hosted = Backend("huggingface", "c/d", reply=BackendError("the provider said:\n  quota\texceeded  "))
    server = build_server(hybrid(tmp_path, site, Backend("local"), hosted, "huggingface"))
    result = call(server, "run_model", {"task": "summarization", "model": "c/d", "text": "t"})
    assert error_of(result) == ("Error executing tool run_model: c/d (huggingface) failed: every candidate failed: "
                                "c/d (huggingface): the provider said: quota exceeded")


def test_an_output_json_cannot_hold_reaches_the_client_as_text(tmp_path, site):
    odd = Backend("huggingface", "c/d", reply={"score": Decimal("0.25"), "label": "été"})
    server = build_server(hybrid(tmp_path, site, Backend("local"), odd, "huggingface"))
    result = call(server, "run_model", {"task": "text-classification", "model": "c/d", "text": "t"})
    assert not result.is_error, text_of(result)
    assert result.structured_content["inference result"] == {"score": "0.25", "label": "été"}
    assert result.content[0].text == '{"score": "0.25", "label": "été"}'


def test_a_client_that_leaves_stops_the_model_call_in_flight(engine, models):
    models.gates[VIT] = threading.Event()  # the model answers only when the gate opens
    work = Work()
    server = build_server(engine, calls=calls_of(work))
    done: list[Any] = []
    caller = threading.Thread(target=lambda: done.append(call(server, "run_model", {
        "task": "image-classification", "model": VIT, "image": "/examples/red.png"})), daemon=True)
    caller.start()
    try:
        wait_until(lambda: VIT in models.arrivals, 10, "the model call")
        [state] = work.states
        state.cancel_token.cancel()  # what StreamWork does when the HTTP client goes away
        caller.join(5)
        assert not caller.is_alive(), "the model call went on after the client left"
    finally:
        models.gates[VIT].set()
        caller.join(10)
    assert error_of(done[0]).startswith(f"Error executing tool run_model: {VIT} (local) failed: ")
    assert models.calls == []  # the fake never got to answer


# -- search_models ---------------------------------------------------------------------------------------------


def test_search_models_ranks_the_catalog_for_the_words_given(engine):
    server = build_server(engine)
    plain = call(server, "search_models", {"task": "image-to-text", "limit": 3})
    asked = call(server, "search_models", {"task": "image-to-text", "q": "gpt2 captions", "limit": 2})
    assert not plain.is_error and not asked.is_error, text_of(plain) + text_of(asked)
    cards = asked.structured_content["models"]
    assert cards == engine.selector.search("image-to-text", "gpt2 captions", 2)
    assert [c["id"] for c in cards] != [c["id"] for c in plain.structured_content["models"]][:2]
    assert len(plain.structured_content["models"]) == 3
    assert {c["task"] for c in cards + plain.structured_content["models"]} == {"image-to-text"}
    assert [(c.type, c.text) for c in asked.content] == [("text", json.dumps(cards, ensure_ascii=False))]


def test_search_models_without_a_task_looks_through_every_task(engine):
    result = call(build_server(engine), "search_models", {"q": "speech", "limit": 20})
    assert len({c["task"] for c in result.structured_content["models"]}) > 1


@pytest.mark.parametrize(("args", "message"), [
    ({"task": "image-to-text", "limit": 1000}, "`limit` must be a whole number from 1 to 100, got 1000"),
    ({"limit": 0}, "`limit` must be a whole number from 1 to 100, got 0"),
    ({"task": "no-such-task"}, "unknown task 'no-such-task'; the catalog has: "),
    ({"limit": True}, "Error executing tool search_models: `limit`: Input should be a valid integer"),
])
def test_search_models_refuses_a_bad_query_with_the_reason(args, message, engine):
    assert message in error_of(call(build_server(engine), "search_models", args))


# -- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tool", "args", "message"), [
    ("hugginggpt", {}, "Error executing tool hugginggpt: `text`: Field required"),
    ("plan", {"text": "x", "image": 5}, "Error executing tool plan: `image`: Input should be a valid string"),
    ("run_model", {}, "Error executing tool run_model: `task`: Field required; `model`: Field required"),
    ("no_such_tool", {}, "Unknown tool: no_such_tool"),
])
def test_arguments_a_tool_cannot_take_are_refused_in_one_line_naming_each(tool, args, message, engine, llm):
    assert error_of(call(build_server(engine), tool, args)) == message
    assert llm.requests == []


def test_an_error_inside_an_argument_names_its_place_in_it():
    """For a tool whose argument holds more than one value (none of the four does yet)."""
    server = HuggingGPTServer("t")

    @server.tool(name="resize")
    def resize(size: list[int]) -> str:
        return f"{size}"

    assert error_of(call(server, "resize", {"size": [64, "wide"]})) == (
        "Error executing tool resize: `size.1`: Input should be a valid integer, unable to parse string as an integer")
    assert not call(server, "resize", {"size": [64, 48]}).is_error


@pytest.mark.parametrize(("tool", "args", "breaks"), [
    ("hugginggpt", {"text": "go"}, "run"),
    ("plan", {"text": "go"}, "run"),
    ("run_model", {"task": "image-classification", "model": VIT, "image": "/examples/red.png"}, "executor.run_task"),
    ("search_models", {}, "selector.search"),
])
def test_an_unexpected_failure_is_logged_and_the_client_told_only_its_type(tool, args, breaks, engine, models,
                                                                            monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("boom at /srv/secret/path")

    owner = engine
    *parents, name = breaks.split(".")
    for part in parents:
        owner = getattr(owner, part)
    monkeypatch.setattr(owner, name, broken)
    with caplog.at_level(logging.ERROR, logger="hugginggpt.mcp.tools"):
        result = call(build_server(engine), tool, args)
    assert error_of(result) == f"Error executing tool {tool}: internal error (RuntimeError); see the server log"
    [record] = [r for r in caplog.records if r.name == "hugginggpt.mcp.tools"]
    assert record.getMessage() == f"MCP tool {tool} failed"
    assert record.exc_info[0] is RuntimeError  # the traceback is in the server's log, not the client's


def test_past_max_concurrent_requests_every_working_tool_is_refused_at_once(tmp_path, llm, models, models_server,
                                                                             public_dir):
    engine = make_engine(tmp_path, llm.base_url, models_server[1], public_dir, max_concurrent_requests=1)
    server = build_server(engine)
    busy = "the server is running 1 requests (max_concurrent_requests); retry shortly"
    assert engine.admission.acquire(blocking=False)  # another door's request holds the one slot
    try:
        for tool, args in (("hugginggpt", {"text": "hi"}), ("plan", {"text": "hi"}),
                           ("run_model", {"task": "image-classification", "model": VIT, "image": "/examples/red.png"})):
            assert error_of(call(server, tool, args)) == f"Error executing tool {tool}: {busy}"
        assert not call(server, "search_models", {"limit": 1}).is_error  # browsing is not a request
    finally:
        engine.admission.release()
    assert llm.requests == [] and models.calls == []
    for _ in range(2):  # each call gives its slot back
        ran = call(server, "run_model", {"task": "image-classification", "model": VIT, "image": "/examples/red.png"})
        assert not ran.is_error, text_of(ran)
    for _ in range(2):  # a call that fails inside its slot gives it back too
        failed = call(server, "run_model", {"task": "image-classification", "model": "nobody/absent",
                                            "image": "/examples/red.png"})
        assert error_of(failed) == "Error executing tool run_model: nobody/absent is not available on the local models server"
    ran = call(server, "run_model", {"task": "image-classification", "model": VIT, "image": "/examples/red.png"})
    assert not ran.is_error, text_of(ran)
