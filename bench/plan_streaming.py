"""A 3-task chain, end to end, with the plan read whole vs. read as it streams (same run, same fakes).

Scripted LLM: 0.3 s before its first token, then the plan at about 50 tokens/s (one whitespace-separated
piece every 20 ms); 0.3 s for the answer. Fake models server: 0.5 s per call. Plan: text-to-image ->
image-to-text -> token-classification. Reports the median wall time of /hugginggpt over N requests for
stream_plan off and on, and their ratio.

    python bench/plan_streaming.py [-n 5]
"""

from __future__ import annotations

import argparse
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

PLAN = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox standing in fresh snow at dawn"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [1], "args": {"text": "<GENERATED>-1"}},
])


def timed(url: str, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        resp = requests.post(url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}]}, timeout=60)
        resp.raise_for_status()
        times.append(time.perf_counter() - t0)
    return times


def main(n: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="plan-stream-"))
    public = make_public(folder / "public")
    llm = ScriptedLLM()
    llm_srv = ThreadedServer(llm.app()).start()
    llm.on("parse_task", PLAN, delay=0.3)
    llm.on("response_results", "done", delay=0.3)
    fake = FakeModels(public=public, models=dict(DEFAULT_MODELS))
    fake.delays.update({m: 0.5 for m in DEFAULT_MODELS})
    models_srv = ThreadedServer(fake.app()).start()
    pieces = len(PLAN.split())
    results = {}
    try:
        for label, stream in (("whole plan first (stream_plan: false)", False), ("read while streaming", True)):
            sub = folder / label.split()[0]
            sub.mkdir()
            server = start_server(write_config(sub, llm_srv.url, models_srv.url, public, semantic_ranking=False,
                                               status_cache_seconds=30.0, stream_plan=stream), sub)
            try:
                llm.stream_delay = 0.02
                timed(server.url, 1)  # warm up
                results[label] = statistics.median(timed(server.url, n))
            finally:
                stop_server(server)
    finally:
        llm_srv.stop()
        models_srv.stop()
    print(f"3-task chain, LLM 0.3 s + plan of {pieces} pieces at 50/s ({pieces * 0.02:.2f} s), model 0.5 s per call, "
          f"median of {n}:")
    before, after = results.values()
    for label, seconds in results.items():
        print(f"  {label}: {seconds:.2f} s")
    print(f"  ratio: {after / before:.2f} (streaming / whole plan)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=5, help="requests per setting (default %(default)s)")
    main(parser.parse_args().n)
