"""A self-contained offline demo: scripted LLM + the real models server on tiny models + the orchestrator.

    python tools/demo.py            # then open http://127.0.0.1:8004/ and ask anything

The scripted LLM always plans: draw the request (tiny Stable Diffusion), edge map of the drawing (canny),
classify the drawing (tiny ViT), and read the request aloud (tiny VITS). Outputs are random-weight
pictures and noise, but every byte goes through the real loading, serving and scheduling code.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import ROOT, make_public, start_server, write_config  # noqa: E402
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer  # noqa: E402
from tests.test_models_server import start_models_server  # noqa: E402
from tests.tiny_models import build_all, tiny_stable_diffusion  # noqa: E402


def plan_for(body: dict) -> str:
    request = body["messages"][-1]["content"].split("Now my request is {", 1)[-1].split("}", 1)[0].strip()
    return json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": request[:60] or "a fox"}},
        {"task": "canny-control", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "image-classification", "id": 2, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "text-to-speech", "id": 3, "dep": [-1], "args": {"text": "hello world"}},
    ])


def main(port: int = 8004) -> None:
    folder = Path(tempfile.mkdtemp(prefix="hugginggpt-demo-"))
    models_dir = folder / "models"
    build_all(models_dir)
    tiny_stable_diffusion(models_dir / "stable-diffusion-v1-5/stable-diffusion-v1-5")
    public = make_public(folder / "public")
    for example in (ROOT / "public" / "examples").iterdir():
        (public / "examples" / example.name).write_bytes(example.read_bytes())
    llm = ScriptedLLM()
    llm_srv = ThreadedServer(llm.app()).start()
    llm.on("parse_task", plan_for)
    models_proc, models_url = start_models_server(folder, models_dir, public, deployment="full")
    config = write_config(folder, llm_srv.url, models_url, public, local_deployment="full")
    server = start_server(config, folder)
    print(f"demo ready: {server.url}/  (files in {folder}; Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.proc.terminate()
        models_proc.terminate()
        llm_srv.stop()


if __name__ == "__main__":
    main()
