"""Time from request to the first `plan` and the first `task_started` event, with a scripted LLM.

Starts the scripted LLM, the fake models server and the orchestrator on loopback, sends N streamed
requests one after another, prints medians and maxima. Usage: python bench/stream_latency.py [N]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from tests.conftest import DEFAULT_MODELS, make_public, start_server, stop_server, write_config  # noqa: E402
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer  # noqa: E402
from tests.fakes.models_server import FakeModels  # noqa: E402

PLAN = json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
                   {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}])


def main(n: int = 20) -> None:
    folder = Path(tempfile.mkdtemp())
    public = make_public(folder / "public")
    llm = ScriptedLLM()
    llm_srv = ThreadedServer(llm.app()).start()
    llm.on("parse_task", PLAN)
    fake = FakeModels(public=public, models=dict(DEFAULT_MODELS))
    models_srv = ThreadedServer(fake.app()).start()
    server = start_server(write_config(folder, llm_srv.url, models_srv.url, public), folder)
    to_plan, to_start = [], []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                                   "stream": True}, stream=True, timeout=30)
            plan_t = start_t = None
            for line in resp.iter_lines(decode_unicode=True):
                if line == "event: plan" and plan_t is None:
                    plan_t = time.perf_counter() - t0
                if line == "event: task_started" and start_t is None:
                    start_t = time.perf_counter() - t0
            to_plan.append(plan_t * 1000)
            to_start.append(start_t * 1000)
    finally:
        stop_server(server)
        llm_srv.stop()
        models_srv.stop()
    print(f"n={n}: first plan event median {statistics.median(to_plan):.1f} ms (max {max(to_plan):.1f}); "
          f"first task_started median {statistics.median(to_start):.1f} ms (max {max(to_start):.1f})")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=20, help="requests to time (default %(default)s)")
    main(parser.parse_args().n)
