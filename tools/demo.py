"""A self-contained offline demo: scripted LLM + the real models server on tiny models + the orchestrator.

    python tools/demo.py                 # then open the URL it prints (http://127.0.0.1:8004/ by default)
    python tools/demo.py --port 9000 --keep

The scripted LLM always plans: draw the request (tiny Stable Diffusion), edge map of the drawing (canny),
classify the drawing (tiny ViT), and read the request aloud (tiny VITS). Outputs are random-weight
pictures and noise, but every byte goes through the real loading, serving and scheduling code.
Ctrl-C or SIGTERM stops all three servers and removes the demo's temporary folder (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def plan_for(body: dict) -> str:
    request = body["messages"][-1]["content"].split("Now my request is {", 1)[-1].split("}", 1)[0].strip()
    return json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": request[:60] or "a fox"}},
        {"task": "canny-control", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "image-classification", "id": 2, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "text-to-speech", "id": 3, "dep": [-1], "args": {"text": "hello world"}},
    ])


def answer_for(body: dict) -> str:
    """A short, readable answer in place of a real LLM's (the raw results stay one click away in the page)."""
    log = next((m["content"] for m in body.get("messages", []) if m["role"] == "assistant"), "")
    files = sorted(set(__import__("re").findall(r"/(?:images|audios|videos)/[\w.-]+", log)))
    lines = ["This is the **offline demo**: a scripted LLM planned four tasks and tiny random-weight models ran "
             "them on the real models server.", ""]
    lines += [f"- {path}" for path in files] or ["- (no files were generated)"]
    lines += ["", "Add an LLM (see the README's Quick start) to get real plans and answers."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8004, help="port of the web app (default %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (models, outputs, logs)")
    args = parser.parse_args(argv)

    from hugginggpt.cli import quiet_libraries

    quiet_libraries()
    from tests.conftest import ROOT, make_public, start_server, stop_server, write_config
    from tests.fakes.llm_server import ScriptedLLM, ThreadedServer
    from tests.test_models_server import start_models_server
    from tests.tiny_models import build_all, tiny_stable_diffusion

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    folder = Path(tempfile.mkdtemp(prefix="hugginggpt-demo-"))
    llm_srv = models_proc = server = None
    try:
        print("building tiny models and starting the servers (about 20 s)...", flush=True)
        models_dir = folder / "models"
        build_all(models_dir)
        tiny_stable_diffusion(models_dir / "stable-diffusion-v1-5/stable-diffusion-v1-5")
        public = make_public(folder / "public")
        for example in (ROOT / "public" / "examples").iterdir():
            (public / "examples" / example.name).write_bytes(example.read_bytes())
        llm = ScriptedLLM()
        llm_srv = ThreadedServer(llm.app()).start()
        llm.on("parse_task", plan_for)
        llm.on("response_results", answer_for)
        models_proc, models_url = start_models_server(folder, models_dir, public, deployment="full")
        config = write_config(folder, llm_srv.url, models_url, public, local_deployment="full")
        server = start_server(config, folder, port=args.port)
        print(f"demo ready: {server.url}/  (Ctrl-C stops it)", flush=True)
        stop.wait()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a server did not start: the port is taken, most likely
        print(f"error: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            stop_server(server)
        if models_proc is not None:
            models_proc.terminate()
            models_proc.wait(10)
        if llm_srv is not None:
            llm_srv.stop()
        if args.keep:
            print(f"kept {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    print("demo stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
