"""The MCP server, driven by the official SDK's own client: over stdio (`python -m hugginggpt.mcp`, a real
subprocess) and over streamable HTTP (`/mcp` on a real orchestrator, with a bearer token). The LLM is the
scripted one and the models are the fake models server, both on loopback."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest
import requests
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from PIL import Image

from tests.conftest import ROOT, start_server, stop_server, write_config

TOKEN = "mcp-token-5150"
TOOLS = {"hugginggpt", "plan", "run_model", "search_models"}
DRAW_FOX = json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}])
CAPTION_TTS = json.dumps([
    {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
    {"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
])


def png_data_uri(size: tuple[int, int], color: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def mcp_config(tmp_path_factory, llm_server, models_server, public_dir) -> Path:
    folder = tmp_path_factory.mktemp("mcp")
    _, models_url = models_server
    return write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                        api_tokens=[TOKEN], denied_models=["facebook/*"])


@pytest.fixture(scope="module")
def orchestrator(mcp_config):
    running = start_server(mcp_config, mcp_config.parent)
    yield running
    stop_server(running)


@pytest.fixture(params=["stdio", "http"])
def connect(request, mcp_config):
    """A function that opens an SDK client session on one transport (HTTP starts the orchestrator once)."""
    if request.param == "stdio":
        params = StdioServerParameters(command=sys.executable, args=["-m", "hugginggpt.mcp", "--config",
                                                                     str(mcp_config)], cwd=str(ROOT))
        return lambda: Client(params)
    url = request.getfixturevalue("orchestrator").url + "/mcp"
    return lambda token=TOKEN: http_client(url, token)


def http_client(url: str, token: str | None) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60)))


def session(connect, *calls: tuple[str, dict[str, Any]]) -> tuple[set[str], list[Any]]:
    """Open one client session, list the tools, make the calls in order; (tool names, results)."""

    async def go() -> tuple[set[str], list[Any]]:
        async with connect() as client:
            names = {t.name for t in (await client.list_tools()).tools}
            return names, [await client.call_tool(name, args) for name, args in calls]

    return asyncio.run(asyncio.wait_for(go(), 90))


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


def one_error_line(result: Any) -> str:
    assert result.is_error, text_of(result)
    message = text_of(result)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_hugginggpt_answers_with_the_generated_image(connect, llm, models):
    llm.on("parse_task", DRAW_FOX)
    names, [result] = session(connect, ("hugginggpt", {"text": "draw a fox"}))
    assert names == TOOLS
    assert not result.is_error, text_of(result)
    assert result.content[0].type == "text" and result.content[0].text.startswith("ANSWER based on:")
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    raw = base64.b64decode(images[0].data)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(io.BytesIO(raw)) as picture:
        assert picture.format == "PNG" and picture.size == (64, 48)  # what the fake text-to-image model drew
    results = result.structured_content["results"]
    assert results["0"]["choose model result"]["id"] == "stabilityai/stable-diffusion-xl-base-1.0"
    assert result.structured_content["files"] == [results["0"]["inference result"]["generated image"]]
    assert "Task results:" in result.content[-1].text
    assert [c["model"] for c in models.calls] == ["stabilityai/stable-diffusion-xl-base-1.0"]


def test_hugginggpt_takes_an_image_as_a_data_uri_and_returns_audio(connect, llm, models, public_dir):
    """The data URI is checked and kept under public/uploads/; the plan names it; the caption reaches TTS."""

    def plan(body: dict) -> str:
        path = re.search(r"Image: (/uploads/[\w.-]+)", json.dumps(body)).group(1)
        return CAPTION_TTS.replace("/examples/red.png", path)

    llm.on("parse_task", plan)
    _, [result] = session(connect, ("hugginggpt", {"text": "caption this and read it aloud",
                                                   "image": png_data_uri((30, 20), (0, 0, 255))}))
    assert not result.is_error, text_of(result)
    results = result.structured_content["results"]
    assert results["0"]["inference result"]["generated text"] == "a picture of 30x20 pixels"
    assert results["1"]["task"]["args"]["text"] == "a picture of 30x20 pixels"
    audio = [c for c in result.content if c.type == "audio"]
    assert len(audio) == 1 and audio[0].mime_type.startswith("audio/")
    assert base64.b64decode(audio[0].data)[:4] == b"RIFF"
    uploaded = results["0"]["task"]["args"]["image"]
    with Image.open(public_dir / uploaded.lstrip("/")) as kept:
        assert kept.size == (30, 20)


def test_plan_chooses_models_without_running_them(connect, llm, models):
    llm.on("parse_task", CAPTION_TTS)
    _, [result] = session(connect, ("plan", {"text": "caption /examples/red.png and read it aloud"}))
    assert not result.is_error, text_of(result)
    decisions = result.structured_content["decisions"]
    selections = decisions["model_selections"]
    assert selections["1"]["selected_model"] == "microsoft/speecht5_tts"
    assert selections["0"]["selected_model"] in ("Salesforce/blip-image-captioning-large",
                                                 "nlpconnect/vit-gpt2-image-captioning")
    assert {s["status"] for s in selections.values()} == {"selected_not_executed"}
    assert json.loads(text_of(result))["decisions"]["summary"]["total_tasks"] == 2
    assert models.calls == []  # the models server saw no inference call


def test_run_model_runs_the_named_model(connect, llm, models):
    _, [result] = session(connect, ("run_model", {"task": "image-classification", "model":
                                                  "google/vit-base-patch16-224", "image": "/examples/red.png"}))
    assert not result.is_error, text_of(result)
    assert result.structured_content["inference result"]["predicted"][0]["label"] == "tabby cat"
    assert result.structured_content["choose model result"]["id"] == "google/vit-base-patch16-224"
    assert result.structured_content["hosted_on"] == "local"
    assert [c["model"] for c in models.calls] == ["google/vit-base-patch16-224"]
    assert llm.requests == []  # one named model: no planning, no choosing, no answer


def test_run_model_keeps_the_rules_of_a_planned_task(connect, llm, models):
    """denied_models, the URL policy and the model id check hold for a model the caller names."""
    _, results = session(
        connect,
        ("run_model", {"task": "object-detection", "model": "facebook/detr-resnet-50", "image": "/examples/red.png"}),
        ("run_model", {"task": "image-classification", "model": "google/vit-base-patch16-224",
                       "image": "http://169.254.169.254/latest/meta-data/x.png"}),
        ("run_model", {"task": "image-classification", "model": "../../running", "image": "/examples/red.png"}),
        ("run_model", {"task": "no-such-task", "model": "google/vit-base-patch16-224", "text": "hi"}),
        ("run_model", {"task": "image-classification", "model": "nobody/unknown-model", "image": "/examples/red.png"}),
    )
    denied, internal_url, bad_id, bad_task, unknown = (one_error_line(r) for r in results)
    assert "facebook/detr-resnet-50 is not permitted here" in denied
    assert "refusing to fetch 'http://169.254.169.254/latest/meta-data/x.png'" in internal_url
    assert "link-local address" in internal_url
    assert "`model` must be a model id" in bad_id
    assert "unknown task type 'no-such-task'" in bad_task
    assert "nobody/unknown-model is not available on the local models server" in unknown
    assert models.calls == []


def test_search_models_reads_the_catalog(connect):
    _, [found, bad_limit, bad_task, bool_limit] = session(
        connect,
        ("search_models", {"task": "image-classification", "q": "classify a photo", "limit": 3}),
        ("search_models", {"task": "image-classification", "limit": 1000}),
        ("search_models", {"task": "no-such-task"}),
        ("search_models", {"limit": True}),
    )
    assert not found.is_error, text_of(found)
    cards = found.structured_content["models"]
    assert 1 <= len(cards) <= 3 and {c["task"] for c in cards} == {"image-classification"}
    assert [c["score"] for c in cards] == sorted((c["score"] for c in cards), reverse=True)
    assert json.loads(text_of(found)) == cards
    assert "`limit` must be a whole number from 1 to 100, got 1000" in one_error_line(bad_limit)
    assert "unknown task 'no-such-task'" in one_error_line(bad_task)
    assert "`limit`: Input should be a valid integer" in one_error_line(bool_limit)


def test_bad_input_is_a_tool_error_and_the_server_goes_on(connect, llm, models):
    llm.on("parse_task", DRAW_FOX)
    _, results = session(
        connect,
        ("hugginggpt", {}),
        ("hugginggpt", {"text": "   "}),
        ("plan", {"text": "look at this", "image": "data:image/png;base64,bm90IGFuIGltYWdl"}),
        ("hugginggpt", {"text": "read this", "audio": "/examples/red.png"}),
        ("plan", {"text": "x" * 100_001}),
        ("no_such_tool", {}),
        ("hugginggpt", {"text": "draw a fox"}),
    )
    *errors, fine = results
    missing, empty, not_image, not_audio, too_long, unknown_tool = (one_error_line(r) for r in errors)
    assert "`text`: Field required" in missing
    assert "the last message is empty" in empty
    assert "unsupported file type application/octet-stream; upload an image" in not_image
    assert "`audio` must be audio; got image/png" in not_audio
    assert "longer than 100000 characters" in too_long
    assert "no_such_tool" in unknown_tool
    assert not fine.is_error and [c.type for c in fine.content].count("image") == 1
    assert llm.stage_requests("parse_task") and len(llm.stage_requests("parse_task")) == 1  # errors never planned


def test_http_needs_the_token_and_an_allowed_origin(orchestrator, llm):
    url = orchestrator.url + "/mcp"

    async def attempt(token: str | None) -> None:
        async with http_client(url, token) as client:
            await client.list_tools()

    for token, why in (("wrong-token", "not one of this server's api_tokens"), (None, "Bearer <token>")):
        try:
            asyncio.run(asyncio.wait_for(attempt(token), 30))
        except BaseException as exc:  # noqa: BLE001 - the SDK raises inside (nested) exception groups
            while isinstance(exc, BaseExceptionGroup):
                exc = exc.exceptions[0]
            refused = exc
        else:
            pytest.fail(f"the token {token!r} was accepted")
        assert isinstance(refused, MCPError) and why in str(refused)  # the server's reason, as a JSON-RPC error
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    wrong = requests.post(url, json=body, headers={**accept, "Authorization": "Bearer wrong-token"}, timeout=10)
    assert wrong.status_code == 403 and "api_tokens" in wrong.json()["error"]["message"]
    assert wrong.json()["jsonrpc"] == "2.0" and wrong.json()["error"]["data"]["type"] == "permission_error"
    missing = requests.post(url, json=body, headers=accept, timeout=10)
    assert missing.status_code == 401 and "Bearer" in missing.json()["error"]["message"]
    foreign = requests.post(url, json=body, timeout=10, headers={**accept, "Authorization": f"Bearer {TOKEN}",
                                                                 "Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "cors_origins" in foreign.json()["error"]["message"]
    stream = requests.get(url, headers={"Accept": "text/event-stream", "Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert stream.status_code == 405 and stream.headers["Allow"] == "POST"  # stateless: no stream to hold open
    assert TOKEN not in orchestrator.logs()
