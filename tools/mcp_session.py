"""An MCP client session against HuggingGPT with the official SDK's client, over stdio and streamable HTTP.

    python tools/mcp_session.py                                   # self-contained: both transports, offline
    python tools/mcp_session.py --config configs/config.default.yaml "draw a fox"      # stdio, your config
    python tools/mcp_session.py --url http://127.0.0.1:8004/mcp --token T "draw a fox" # a running server

Without --config or --url it starts a scripted LLM and a fake models server on loopback (tests/fakes), then
`python -m hugginggpt.mcp` over stdio and an orchestrator with an api token over HTTP, and runs the same
session on each: list the tools, search the catalog, plan, run one model, a whole request, and a bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def show(result: Any) -> str:
    """A tool result in a few lines: text (shortened), images with their decoded size, audio with its bytes."""
    from PIL import Image

    lines = []
    if result.is_error:
        lines.append("  ERROR " + " ".join(c.text for c in result.content if c.type == "text"))
        return "\n".join(lines)
    for c in result.content:
        if c.type == "text":
            text = c.text if len(c.text) <= 300 else c.text[:300] + f"... ({len(c.text)} chars)"
            lines.append(f"  text:  {text}")
        elif c.type == "image":
            raw = base64.b64decode(c.data)
            with Image.open(io.BytesIO(raw)) as img:
                lines.append(f"  image: {c.mime_type}, {len(raw)} bytes, decoded {img.format} {img.size[0]}x{img.size[1]}")
        elif c.type == "audio":
            lines.append(f"  audio: {c.mime_type}, {len(base64.b64decode(c.data))} bytes")
    for tid, record in ((result.structured_content or {}).get("results") or {}).items():
        chosen = record.get("choose model result") or {}
        outcome = ", ".join(f"{k}: {str(v)[:60]}" for k, v in (record.get("inference result") or {}).items())
        lines.append(f"  task #{tid} {record['task']['task']} on {chosen.get('id')}: {outcome}")
    return "\n".join(lines)


CALLS = [
    ("search_models", {"task": "image-classification", "q": "classify a photo of an animal", "limit": 3}),
    ("plan", {"text": "{request}"}),
    ("run_model", {"task": "image-classification", "model": "google/vit-base-patch16-224",
                   "image": "/examples/red.png"}),
    ("hugginggpt", {"text": "{request}"}),
    ("run_model", {"task": "image-classification", "model": "../secrets", "image": "/examples/red.png"}),
]


async def run_session(client: Any, request: str, out=sys.stdout) -> None:
    async with client:
        tools = (await client.list_tools()).tools
        print(f"> list_tools\n  {', '.join(t.name for t in tools)}", file=out)
        for name, args in CALLS:
            args = {k: (v.format(request=request) if isinstance(v, str) else v) for k, v in args.items()}
            print(f"> call_tool {name} {json.dumps(args)}", file=out)
            print(show(await client.call_tool(name, args)), file=out, flush=True)


def stdio_client(config: Path) -> Any:
    from mcp import Client, StdioServerParameters

    return Client(StdioServerParameters(command=sys.executable, args=["-m", "hugginggpt.mcp", "--config", str(config)],
                                        cwd=str(ROOT)))


def http_client(url: str, token: str | None) -> Any:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=600)))


def offline(request: str) -> int:
    """Scripted LLM + fake models server, then the same session over stdio and over HTTP."""
    from tests.conftest import DEFAULT_MODELS, make_public, start_server, stop_server, write_config
    from tests.fakes.llm_server import ScriptedLLM, ThreadedServer
    from tests.fakes.models_server import FakeModels

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # the fakes' access lines
    folder = Path(tempfile.mkdtemp(prefix="hugginggpt-mcp-"))
    public = make_public(folder / "public")
    llm = ScriptedLLM()
    llm.on("parse_task", json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox in the snow"}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    ]))
    llm_http = ThreadedServer(llm.app()).start()
    llm.base_url = llm_http.url
    models = FakeModels(public=public, models=dict(DEFAULT_MODELS))
    models_http = ThreadedServer(models.app()).start()
    token = "demo-token-123"
    config = write_config(folder, llm.base_url, models_http.url, public, semantic_ranking=False, api_tokens=[token])
    print(f"# scripted LLM {llm.base_url}, fake models server {models_http.url}, config {config}\n")
    try:
        print("## stdio: python -m hugginggpt.mcp --config", config)
        asyncio.run(run_session(stdio_client(config), request))
        server = start_server(config, folder)
        try:
            print(f"\n## streamable HTTP: {server.url}/mcp with Authorization: Bearer {token}")
            asyncio.run(run_session(http_client(server.url + "/mcp", token), request))
            print("\n## streamable HTTP with a wrong token")
            try:
                asyncio.run(run_session(http_client(server.url + "/mcp", "wrong-token"), request))
            except BaseException as exc:  # noqa: BLE001 - the SDK wraps the HTTP refusal in an exception group
                print(f"  refused: {refusal(exc)}")
        finally:
            stop_server(server)
    finally:
        llm_http.stop()
        models_http.stop()
    return 0


def refusal(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{exc.__class__.__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("request", nargs="?", default="draw a fox in the snow and tell me what you see")
    parser.add_argument("--config", help="run `python -m hugginggpt.mcp --config CONFIG` over stdio")
    parser.add_argument("--url", help="a running orchestrator's MCP endpoint, e.g. http://127.0.0.1:8004/mcp")
    parser.add_argument("--token", help="its bearer token (one of api_tokens)")
    args = parser.parse_args(argv)
    if args.config:
        asyncio.run(run_session(stdio_client(Path(args.config).resolve()), args.request))
        return 0
    if args.url:
        asyncio.run(run_session(http_client(args.url, args.token), args.request))
        return 0
    return offline(args.request)


if __name__ == "__main__":
    sys.exit(main())
