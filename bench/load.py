"""Many users at once, at the shipped defaults: CPU per request, latency under load, memory and threads.

The orchestrator runs with configs/config.default.yaml as shipped (semantic ranking on, `choose_model: auto`
and its margin, 64 concurrent requests, 2 worker processes, plan streaming), changed only where this machine needs it: a scripted
LLM (0.2 s per call) instead of OpenAI, a fake local models server (0.2 s per model call) instead of real
models, `inference_mode: local` and `device: cpu`. The two fakes run on waitress with HTTP keep-alive, as OpenAI,
vLLM and our models server do (werkzeug's development server would close every connection and make each call
pay a new TCP connection on both sides). Every request is a 3-task plan (text-to-image ->
image-to-text, plus token-classification; image-to-text has two candidates, so `auto` may ask the LLM) and
every request's text differs, so no cache of query vectors makes the numbers look better than they are. As a
planner does, the tasks' text arguments are copied from the request.

Reported in one run:
- ranking CPU per task, measured in this process on the same kind of queries (cache misses);
- the server's CPU per request: its /proc utime+stime before and after 20 requests in a row, divided by 20;
- p50/p99 latency at 1, 10 and 50 concurrent clients, as ratios to one request alone;
- the server's RSS and thread count after all requests.

    python bench/load.py [--keyword] [--rounds 4]
    python bench/load.py --cpu [--keyword]   # only the server's CPU per request, no delays, 3 x 100 requests
    python bench/load.py --workers 1         # one server process instead of the shipped http_workers

`--keyword` runs the same with `semantic_ranking: false`, and `--workers N` with `http_workers: N`, for
comparison. CPU, RSS and threads are the server's and its worker processes' together. On a shared machine the absolute
figures move with the other load; compare the ratios, and runs made side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402
import yaml  # noqa: E402

from tests.conftest import DEFAULT_MODELS, free_port, make_public, start_server, stop_server  # noqa: E402
from tests.fakes.llm_server import KeepAliveServer, ScriptedLLM  # noqa: E402
from tests.fakes.models_server import FakeModels  # noqa: E402

LATENCY = 0.2
LEVELS = (1, 10, 50)
SEQUENTIAL = 20
CHOICE = json.dumps({"id": "Salesforce/blip-image-captioning-large", "reason": "the LLM's pick"})
SUBJECTS = ("a fox", "an old lighthouse", "a red bicycle", "two cats on a sofa", "a mountain lake", "a robot chef")
NAMES = ("Anna lives in Berlin", "Marco works for Fiat in Turin", "Lena met Tom in Paris", "Ravi studies in Delhi")


def plan_for(n: int) -> str:
    subject, names = SUBJECTS[n % len(SUBJECTS)], NAMES[n % len(NAMES)]
    return json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": subject}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": names}},
    ])


def request_text(n: int) -> str:
    subject, names = SUBJECTS[n % len(SUBJECTS)], NAMES[n % len(NAMES)]
    return (f"Request {n}: draw {subject}, then tell me what the picture shows, and find the people and places "
            f"in this sentence: {names}.")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def proc_status(pid: int) -> tuple[float, int, int]:
    """RSS (MB) and threads of the server and its workers, and how many processes that is."""
    rss, threads, tree = 0, 0, process_tree(pid)
    for p in tree:
        text = Path(f"/proc/{p}/status").read_text()
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        rss, threads = rss + int(fields["VmRSS"].split()[0]), threads + int(fields["Threads"])
    return rss / 1024, threads, len(tree)


def process_tree(pid: int) -> list[int]:
    """The server and its worker processes (`http_workers` > 1), from /proc's children lists."""
    found, queue = [], [pid]
    while queue:
        p = queue.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            queue.extend(int(c) for c in task.read_text().split())
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime of the server and its workers (all their threads), from /proc/<pid>/stat."""
    total = 0
    for p in process_tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except FileNotFoundError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Load:
    """Clients posting distinct 3-task requests; the scripted LLM plans each by the number in its text."""

    def __init__(self, url: str):
        self.url = url
        self.counter = 0
        self.lock = threading.Lock()

    def next_number(self) -> int:
        with self.lock:
            self.counter += 1
            return self.counter

    def run(self, clients: int, rounds: int) -> list[float]:
        times: list[float] = []
        statuses: list[int] = []

        def client() -> None:
            with requests.Session() as http:
                for _ in range(rounds):
                    n = self.next_number()
                    t0 = time.perf_counter()
                    resp = http.post(self.url + "/hugginggpt",
                                     json={"messages": [{"role": "user", "content": request_text(n)}]}, timeout=600)
                    with self.lock:
                        times.append(time.perf_counter() - t0)
                        statuses.append(resp.status_code)

        threads = [threading.Thread(target=client) for _ in range(clients)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        bad = [s for s in statuses if s != 200]
        if bad:
            raise SystemExit(f"{len(bad)} of {len(statuses)} requests failed: {sorted(set(bad))}")
        return times


def shipped_config(folder: Path, llm_url: str, models_url: str, public: Path, keyword: bool,
                   workers: int | None = None) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "config.default.yaml").read_text())
    data.pop("openai", None)
    data.update({
        "local": {"endpoint": llm_url + "/v1"}, "model": "scripted", "root": str(ROOT), "public_dir": str(public),
        "inference_mode": "local", "device": "cpu", "log_file": str(folder / "debug.log"),
        "http_listen": {"host": "127.0.0.1", "port": free_port()},
        "local_inference_endpoint": {"host": "127.0.0.1", "port": int(models_url.rsplit(":", 1)[1])},
        "cache_dir": str(ROOT / ".cache"),
    })
    if keyword:
        data["semantic_ranking"] = False
    if workers is not None:
        data["http_workers"] = workers
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def ranking_cost(keyword: bool, queries: int = 60) -> tuple[float, float, str]:
    """Per task, in this process: the CPU the server's selector spends ranking (query embedding included; the
    request's one embedding shared by its tasks). CPU, not wall time: on a shared machine the wall time of a
    5 ms computation says more about the neighbours than about the ranking."""
    from bench.shipped_ranking import shipped_ranking
    from hugginggpt.plan import Task
    from hugginggpt.select import Selector

    # as the server ranks once warm: from a catalog store holding the curated catalog
    shipped = shipped_ranking(Path(tempfile.mkdtemp(prefix="load-store-")), keyword)
    config, ranker = shipped.config, shipped.ranker
    selector = Selector(catalog=shipped.catalog, ranker=ranker, availability=None, prompts=None,  # type: ignore[arg-type]
                        inference_mode="local", num_candidates=config.num_candidate_models,
                        max_description_length=config.max_description_length, choose=config.choose_model,
                        margin=config.choose_model_margin)
    selector.use_store(shipped.store)
    per_task: list[float] = []
    for n in range(1000, 1000 + queries):
        plan = json.loads(plan_for(n))
        tasks = [Task(task=t["task"], id=t["id"], dep=t["dep"], args=t["args"]) for t in plan]
        t0 = time.thread_time()  # CPU: the ONNX graph runs on this thread (one intra-op thread)
        prepare = getattr(selector, "prepare", None)
        if prepare is not None:
            prepare(request_text(n), tasks)
        for task in tasks:
            selector.rank(request_text(n), task)
        per_task.append((time.thread_time() - t0) / len(tasks))
    return statistics.median(per_task), percentile(per_task, 0.99), type(ranker).__name__


def settle(pid: int, quiet_cpu: float = 0.02, window: float = 0.5, limit: float = 120.0) -> None:
    """Wait until the server and its workers are idle: the workers after the first warm up (load the sentence
    model) after /health first answers, and that CPU is not a request's."""
    deadline = time.monotonic() + limit
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(window)
        now = cpu_seconds(pid)
        if now - before < quiet_cpu:
            return
        before = now


def serve(config: Path, folder: Path, rounds: int) -> dict:
    server = start_server(config, folder)
    try:
        settle(server.proc.pid)
        load = Load(server.url)
        load.run(1, 3)  # warm: first connections, first status checks
        before, harness = cpu_seconds(server.proc.pid), time.process_time()
        alone = load.run(1, SEQUENTIAL)
        out: dict = {"cpu_ms": (cpu_seconds(server.proc.pid) - before) * 1000 / SEQUENTIAL, 1: alone,
                     "harness_ms": (time.process_time() - harness) * 1000 / SEQUENTIAL}
        for clients in LEVELS[1:]:
            out[clients] = load.run(clients, rounds)
        out["rss_mb"], out["threads"], out["processes"] = proc_status(server.proc.pid)
        out["requests"] = load.counter
        return out
    finally:
        stop_server(server)


def cpu_only(config: Path, folder: Path, runs: int = 3, requests_per_run: int = 100) -> list[float]:
    """Server CPU per request with the LLM and the models answering at once: only the orchestrator's own work,
    over enough requests that the clock's 10 ms ticks do not matter."""
    server = start_server(config, folder)
    try:
        settle(server.proc.pid)
        load = Load(server.url)
        load.run(1, 10)
        out = []
        for _ in range(runs):
            before = cpu_seconds(server.proc.pid)
            load.run(1, requests_per_run)
            out.append((cpu_seconds(server.proc.pid) - before) * 1000 / requests_per_run)
        return out
    finally:
        stop_server(server)


def main(rounds: int, keyword: bool, cpu: bool = False, workers: int | None = None) -> None:
    folder = Path(tempfile.mkdtemp(prefix="load-"))
    public = make_public(folder / "public")
    llm = ScriptedLLM(keep_streams_alive=True)  # as OpenAI and vLLM keep a stream's connection
    llm_srv = KeepAliveServer(llm.app()).start()
    latency = 0.0 if cpu else LATENCY

    def plan(body: dict) -> str:
        found = re.findall(r"Request (\d+):", json.dumps(body["messages"][-1]))
        return plan_for(int(found[-1]) if found else 0)

    llm.on("parse_task", plan, delay=latency)
    llm.on("choose_model", CHOICE, delay=latency)
    llm.on("response_results", "done", delay=latency)
    fake = FakeModels(public=public, models=dict(DEFAULT_MODELS))
    fake.delays.update({m: latency for m in DEFAULT_MODELS})
    models_srv = KeepAliveServer(fake.app()).start()
    if cpu:
        try:
            runs = cpu_only(shipped_config(folder, llm_srv.url, models_srv.url, public, keyword, workers), folder)
        finally:
            llm_srv.stop()
            models_srv.stop()
        label = "keyword ranking" if keyword else "shipped defaults (semantic ranking)"
        if workers is not None:
            label += f", http_workers: {workers} (--workers)"
        print(f"{label}; LLM and models answering at once: server CPU per 3-task request over 3 x 100 in a row: "
              + ", ".join(f"{ms:.1f} ms" for ms in runs))
        return
    try:
        rank50, rank99, ranker = ranking_cost(keyword)
        res = serve(shipped_config(folder, llm_srv.url, models_srv.url, public, keyword, workers), folder, rounds)
    finally:
        llm_srv.stop()
        models_srv.stop()
    choose_calls = len(llm.stage_requests("choose_model"))
    base = statistics.median(res[1])
    label = "keyword ranking (--keyword)" if keyword else "shipped defaults (semantic ranking)"
    if workers is not None:
        label += f", http_workers: {workers} (--workers)"
    print(f"{label}; LLM {LATENCY}s per call, model {LATENCY}s per call, 3-task plans")
    print(f"ranking CPU per task ({ranker} over the catalog store, in process, cache misses): p50 {rank50 * 1000:.2f} ms, "
          f"p99 {rank99 * 1000:.2f} ms")
    print(f"server CPU per request ({SEQUENTIAL} in a row): {res['cpu_ms']:.0f} ms; this process (scripted LLM, fake "
          f"models server, clients) {res['harness_ms']:.0f} ms more on the same 2 cores")
    print(f"one request alone: p50 {base:.2f}s")
    print("| concurrent | requests | p50 | p99 |")
    print("|---|---|---|---|")
    for clients in LEVELS:
        times = res[clients]
        p50, p99 = statistics.median(times), percentile(times, 0.99)
        print(f"| {clients} | {len(times)} | {p50:.2f}s ({p50 / base:.2f}x) | {p99:.2f}s ({p99 / base:.2f}x) |")
    print(f"after {res['requests']} requests the server holds {res['rss_mb']:.0f} MB RSS and {res['threads']} "
          f"threads in {res['processes']} processes; the LLM was asked to choose a model {choose_calls} times")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="requests per client at 10 and 50 (default %(default)s)")
    parser.add_argument("--keyword", action="store_true", help="semantic_ranking: false, for comparison")
    parser.add_argument("--cpu", action="store_true", help="only the server's CPU per request, with the LLM and "
                        "the models answering at once (3 x 100 requests in a row)")
    parser.add_argument("--workers", type=int, help="http_workers instead of the shipped config's, for comparison")
    args = parser.parse_args()
    main(args.rounds, args.keyword, args.cpu, args.workers)
