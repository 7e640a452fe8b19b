"""Many users at once: latency of 1, 10 and 50 concurrent requests, before and after admission control.

A scripted LLM (0.2 s per call) and a fake models server (0.2 s per model call) serve 3-task plans
(text-to-image -> image-to-text, plus token-classification). The orchestrator runs twice in this one run:
"before" as main was (16 waitress threads, no admission limit: requests queue), "after" with the
defaults (threads follow max_concurrent_requests=64). Reports p50/p99 as ratios to one request alone,
and the orchestrator's RSS and thread count after all requests.

    python bench/load.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from tests.conftest import DEFAULT_MODELS, make_public, start_server, stop_server, write_config  # noqa: E402
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer  # noqa: E402
from tests.fakes.models_server import FakeModels  # noqa: E402

PLAN = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
])
LATENCY = 0.2
LEVELS = (1, 10, 50)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def proc_status(pid: int) -> tuple[float, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def load(url: str, clients: int, rounds: int) -> list[float]:
    times: list[float] = []
    lock = threading.Lock()
    statuses: list[int] = []

    def client() -> None:
        with requests.Session() as http:
            for _ in range(rounds):
                t0 = time.perf_counter()
                resp = http.post(url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}]},
                                 timeout=300)
                with lock:
                    times.append(time.perf_counter() - t0)
                    statuses.append(resp.status_code)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    bad = [s for s in statuses if s != 200]
    if bad:
        raise SystemExit(f"{len(bad)} of {len(statuses)} requests failed: {sorted(set(bad))}")
    return times


def run(label: str, extra: dict, llm_url: str, models_url: str, public: Path, rounds: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"load-{label}-"))
    server = start_server(write_config(folder, llm_url, models_url, public, semantic_ranking=False,
                                       request_timeout=300, status_cache_seconds=30.0, **extra), folder)
    try:
        out = {}
        total = 0
        for clients in LEVELS:
            times = load(server.url, clients, rounds if clients > 1 else rounds * 3)
            total += len(times)
            out[clients] = (statistics.median(times), percentile(times, 0.99))
        while total < 200:  # RSS and threads are read after at least 200 requests
            total += len(load(server.url, 10, 2))
        out["rss_mb"], out["threads"] = proc_status(server.proc.pid)
        out["requests"] = total
        return out
    finally:
        stop_server(server)


def main(rounds: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="load-"))
    public = make_public(folder / "public")
    llm = ScriptedLLM()
    llm_srv = ThreadedServer(llm.app()).start()
    for stage in ("parse_task", "choose_model", "response_results"):
        llm.on(stage, PLAN if stage == "parse_task" else (lambda body: "done"), delay=LATENCY)
    fake = FakeModels(public=public, models=dict(DEFAULT_MODELS))
    fake.delays.update({m: LATENCY for m in DEFAULT_MODELS})
    models_srv = ThreadedServer(fake.app()).start()
    try:
        before = run("before", {"http_threads": 16, "max_concurrent_requests": 100000}, llm_srv.url, models_srv.url,
                     public, rounds)
        after = run("after", {}, llm_srv.url, models_srv.url, public, rounds)
    finally:
        llm_srv.stop()
        models_srv.stop()
    base_b, base_a = before[1][0], after[1][0]
    print(f"LLM {LATENCY}s per call, model {LATENCY}s per call, 3-task plans; one request alone: "
          f"before {base_b:.2f}s, after {base_a:.2f}s")
    print("| concurrent | before p50 | before p99 | after p50 | after p99 |")
    print("|---|---|---|---|---|")
    for clients in LEVELS:
        (b50, b99), (a50, a99) = before[clients], after[clients]
        print(f"| {clients} | {b50:.2f}s ({b50 / base_b:.1f}x) | {b99:.2f}s ({b99 / base_b:.1f}x) | "
              f"{a50:.2f}s ({a50 / base_a:.1f}x) | {a99:.2f}s ({a99 / base_a:.1f}x) |")
    for label, res in (("before", before), ("after", after)):
        print(f"{label}: after {res['requests']} requests the orchestrator holds {res['rss_mb']:.0f} MB RSS "
              f"and {res['threads']} threads")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="requests per client at each level (default %(default)s)")
    main(parser.parse_args().rounds)
