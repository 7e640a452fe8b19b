"""JARVIS's seven Gradio example requests, end to end through `/hugginggpt` on a real LLM and the real models
server (tiny random-weight models, so the files are noise but every step runs), with what each planned and
answered, and how long it took.

    python tools/local_llm.py &                     # the LLM (or any OpenAI-compatible server)
    python bench/jarvis_examples.py --config configs/config.llama.yaml [--out bench-results]

The orchestrator takes the config's LLM and planning settings; the models server, the public folder and the
photos the requests name (/examples/a.jpg ... f.jpg, copies of scikit-image's photos) are set up in a temporary
folder. Writes `jarvis_examples.json` (plans, answers, seconds) into --out and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# From JARVIS's run_gradio_demo.py (microsoft/JARVIS, hugginggpt/server), as its page offers them.
REQUESTS = [
    "Given a collection of image A: /examples/a.jpg, B: /examples/b.jpg, C: /examples/c.jpg, please tell me how "
    "many zebras in these picture?",
    "Please generate a canny image based on /examples/f.jpg",
    "show me a joke and an image of cat",
    "what is in the /examples/a.jpg",
    "generate a video and audio about a dog is running on the grass",
    "based on the /examples/a.jpg, please generate a video and audio",
    "based on pose of /examples/d.jpg and content of /examples/e.jpg, please show me a new image",
]
PHOTOS = {"a": "coffee.jpg", "b": "chelsea.jpg", "c": "rocket.jpg", "d": "astronaut.jpg", "e": "chelsea.jpg",
          "f": "rocket.jpg"}
KEEP = ("model", "use_completion", "structured_output", "planner_demos", "planner_demo_pool", "max_replans",
        "max_tasks", "stream_plan", "choose_model", "max_context_tokens", "llm_timeout", "planner_max_tokens",
        "tprompt", "prompt", "demos_or_presteps")


def events_of(url: str, text: str, timeout: float = 600) -> tuple[list[tuple[str, dict]], float]:
    import requests

    started = time.perf_counter()
    events, name = [], None
    with requests.post(url + "/hugginggpt", json={"messages": [{"role": "user", "content": text}], "stream": True},
                       stream=True, timeout=timeout) as reply:
        for line in reply.iter_lines(decode_unicode=True):
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and name:
                events.append((name, json.loads(line.split(":", 1)[1])))
    return events, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/config.llama.yaml", help="the LLM and its planning settings")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)

    from tests.conftest import make_public, start_server, stop_server, write_config
    from tests.test_models_server import start_models_server
    from tests.tiny_models import build_all, tiny_stable_diffusion

    source = yaml.safe_load(Path(args.config).read_text())
    folder = Path(tempfile.mkdtemp(prefix="jarvis-examples-"))
    models_proc = server = None
    rows = []
    try:
        models_dir = folder / "models"
        build_all(models_dir)
        tiny_stable_diffusion(models_dir / "stable-diffusion-v1-5/stable-diffusion-v1-5")
        public = make_public(folder / "public")
        for name, photo in PHOTOS.items():
            shutil.copy(ROOT / "public" / "examples" / photo, public / "examples" / f"{name}.jpg")
        models_proc, models_url = start_models_server(folder, models_dir, public, deployment="full")
        extra = {k: source[k] for k in KEEP if k in source}
        for key in ("planner_demo_pool",):
            if key in extra:
                extra[key] = str((ROOT / extra[key]).resolve())
        if "demos_or_presteps" in extra:
            extra["demos_or_presteps"] = {k: str((ROOT / v).resolve()) for k, v in extra["demos_or_presteps"].items()}
        config = write_config(folder, source["local"]["endpoint"].removesuffix("/v1"), models_url, public,
                              local_deployment="full", request_timeout=600, **extra)
        server = start_server(config, folder)
        for text in REQUESTS:
            events, seconds = events_of(server.url, text)
            plan = next((e["tasks"] for n, e in events if n == "plan"), [])
            answer = next((e.get("message") for n, e in events if n == "answer"), None)
            failed = [e for n, e in events if n == "task_failed"]
            rows.append({"request": text, "plan": plan, "answer": answer, "seconds": round(seconds, 1),
                         "failed": failed, "events": [n for n, _ in events]})
            print(f"{seconds:6.1f} s  {text[:60]}\n         plan: "
                  + ", ".join(f"{t['id']}:{t['task']}{t.get('args')}" for t in plan), flush=True)
    finally:
        if server is not None:
            stop_server(server)
        if models_proc is not None:
            models_proc.terminate()
            models_proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jarvis_examples.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False))
    print("\n| request | plan | seconds |\n|---|---|---|")
    for row in rows:
        plan = "; ".join(f"{t['task']}({', '.join(f'{k}={v}' for k, v in t.get('args', {}).items())})"
                         for t in row["plan"]) or "(none: answered as chat)"
        print(f"| {row['request'][:70]} | {plan} | {row['seconds']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
