"""Many users on one model: requests/s of the real models server with and without dynamic batching.

Builds a BERT-base-shaped text classifier (random weights; 4 layers of width 256 by default: small enough to
build in seconds, large enough that the model, not HTTP, is most of a request), starts models_server.py twice on
loopback (`max_batch_size: 1`, and batching with `max_batch_size` / `batch_wait_ms`), and drives each with 1, 8
and 32 callers in a closed loop (each sends its next request when its last one is answered) over keep-alive
HTTP. Both servers run side by side; at each level the unbatched one is measured first, then the batched one,
except at 1 caller, where the one caller alternates between them (the p50 ratio at 1 caller is the goal that a
shared machine's drift would blur most).

Reports requests/s, p50 / p99 latency, the server's CPU per request (its utime + stime over the window) and the
mean batch size (X-Batch-Size). Goals (issue 28): at 32 callers at least 3x the requests/s of no batching; at
1 caller p50 no worse than 1.1x.

    python bench/models_throughput.py [--seconds 8] [--callers 1 8 32] [--max-batch-size 32] [--wait-ms 5]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from tests.conftest import make_public  # noqa: E402
from tests.test_models_server import start_models_server  # noqa: E402
from tests.tiny_models import WORDS  # noqa: E402

MODEL = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"  # a text-classification id of the catalog


def build_classifier(folder: Path, width: int, layers: int) -> int:
    """BERT's shape (heads of 64, feed-forward 4x), random weights, a tokenizer that knows tiny_models.WORDS.
    Returns the parameter count."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    BertTokenizer(vocab={w: k for k, w in enumerate(WORDS)}, do_lower_case=True).save_pretrained(folder)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(WORDS), hidden_size=width, num_hidden_layers=layers, num_attention_heads=max(1, width // 64),
        intermediate_size=4 * width, max_position_embeddings=512, num_labels=2,
        id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1}))
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def server_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def drive(targets: dict[str, tuple[str, int]], callers: int, seconds: float, texts: list[str]) -> dict[str, dict]:
    """`callers` closed-loop callers for `seconds` after a warm-up second; latencies of the window only.

    With several targets (name -> (url, server pid)) each caller sends its requests to them in turn, so they are
    measured in the same moments (what one caller does: on a shared machine, the load of the moment is the
    same for both); returns the figures per target."""
    names = list(targets)
    latencies: dict[str, list[float]] = {name: [] for name in names}
    sizes: dict[str, list[int]] = {name: [] for name in names}
    errors: list[str] = []
    lock = threading.Lock()
    state = {"measuring": False, "stop": False}
    gate = threading.Barrier(callers + 1)
    bodies = [json.dumps({"text": t}).encode() for t in texts]
    headers = {"Content-Type": "application/json"}

    def connect(name: str) -> http.client.HTTPConnection:
        host, port = targets[name][0].removeprefix("http://").split(":")
        return http.client.HTTPConnection(host, int(port), timeout=120)

    def caller(k: int) -> None:
        # http.client on keep-alive connections: the lightest client, so that on a small machine the callers'
        # own CPU takes as little as it can from the server under test
        conns = {name: connect(name) for name in names}
        n = k
        gate.wait()
        while not state["stop"]:
            name = names[(n // callers) % len(names)]
            body = bodies[n % len(bodies)]
            n += callers
            t0 = time.perf_counter()
            try:
                conns[name].request("POST", f"/models/{MODEL}", body, headers)
                resp = conns[name].getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    errors.append(f"{name}: {str(exc)[:200]}")
                conns[name].close()
                conns[name] = connect(name)
                continue
            took = time.perf_counter() - t0
            if state["measuring"] and not state["stop"]:
                with lock:
                    if resp.status == 200:
                        latencies[name].append(took)
                        sizes[name].append(int(resp.getheader("X-Batch-Size", "1")))
                    else:
                        errors.append(f"{name}: {resp.status} {data[:200]!r}")
        for conn in conns.values():
            conn.close()

    threads = [threading.Thread(target=caller, args=(k,), daemon=True) for k in range(callers)]
    [t.start() for t in threads]
    gate.wait()
    time.sleep(1.0)  # warm-up: every caller in its loop, batches at their steady size
    cpu0 = {name: server_cpu_seconds(pid) for name, (_, pid) in targets.items()}
    t0, own0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    state["measuring"] = True
    time.sleep(seconds)
    state["stop"] = True
    window = time.perf_counter() - t0
    cpu = {name: server_cpu_seconds(pid) - cpu0[name] for name, (_, pid) in targets.items()}
    own1 = resource.getrusage(resource.RUSAGE_SELF)
    client = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
    [t.join(120) for t in threads]
    total = sum(len(v) for v in latencies.values())
    out = {}
    for name in names:
        lat = sorted(latencies[name])
        out[name] = {"rps": len(lat) / window, "p50": statistics.median(lat) * 1000 if lat else float("nan"),
                     "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("nan"),
                     "cpu_ms": cpu[name] / max(1, len(lat)) * 1000, "client_ms": client / max(1, total) * 1000,
                     "batch": statistics.mean(sizes[name]) if sizes[name] else float("nan"), "n": len(lat),
                     "errors": [e for e in errors if e.startswith(name)]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window per level (default 8)")
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-batch-size", type=int, default=32, help="default 32, the shipped config's")
    parser.add_argument("--wait-ms", type=float, default=5.0)
    parser.add_argument("--width", type=int, default=256, help="hidden size of the classifier (default 256)")
    parser.add_argument("--layers", type=int, default=4, help="its layers (default 4)")
    parser.add_argument("--torch-threads", type=int, help="OMP_NUM_THREADS for the servers (default: torch's)")
    parser.add_argument("--words", type=int, default=24, help="words per request's text (default 24)")
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="throughput-"))
    params = build_classifier(folder / "models" / MODEL, args.width, args.layers)
    public = make_public(folder / "public")
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS[5:]) for _ in range(args.words)) for _ in range(512)]
    threads = f"http_threads: {max(args.callers) + 16}"
    modes = {"no batching": ("max_batch_size: 1", threads),
             "batching": (f"max_batch_size: {args.max_batch_size}", f"batch_wait_ms: {args.wait_ms:g}", threads)}
    servers = {}
    try:
        for name, extra in modes.items():
            env = {**os.environ, **({"OMP_NUM_THREADS": str(args.torch_threads)} if args.torch_threads else {})}
            proc, url = start_models_server(folder, folder / "models", public, extra=extra, env=env)
            servers[name] = (proc, url)
            requests.post(f"{url}/models/{MODEL}", json={"text": texts[0]}, timeout=120).raise_for_status()  # load
        import torch
        import transformers

        print(f"models_throughput: {MODEL} as a BERT-shaped classifier, {args.layers} layers of {args.width} "
              f"({params / 1e6:.1f} M parameters), {args.words}-word texts; batching: max_batch_size "
              f"{args.max_batch_size}, batch_wait_ms {args.wait_ms:g}; {args.seconds:g} s per level; "
              f"{os.cpu_count()} cores; torch {torch.__version__}, transformers {transformers.__version__}; "
              f"{time.strftime('%Y-%m-%d')}", flush=True)
        rows = []
        for callers in args.callers:
            targets = {name: (url, proc.pid) for name, (proc, url) in servers.items()}
            if callers == 1:  # one caller: alternate between the two servers, measured in the same moments
                got = drive(targets, 1, 2 * args.seconds, texts)
                for r in got.values():
                    r["rps"] *= 2  # each server had half of the caller's time
            else:
                got = {name: drive({name: target}, callers, args.seconds, texts)[name]
                       for name, target in targets.items()}
            rows.append((callers, got))
            for name, r in got.items():
                if r["errors"]:
                    print(f"  {name}, {callers} callers: {len(r['errors'])} errors, first: {r['errors'][0]}")
            off, on = got["no batching"], got["batching"]
            print(f"  {callers} callers: no batching {off['rps']:.1f} req/s, batching {on['rps']:.1f} req/s "
                  f"(mean batch {on['batch']:.1f}); the callers' own CPU {off['client_ms']:.2f} / "
                  f"{on['client_ms']:.2f} ms per request", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)

    print("\n| callers | no batching: req/s | p50 ms | p99 ms | CPU ms/req | batching: req/s | p50 ms | p99 ms "
          "| CPU ms/req | mean batch | req/s ratio | p50 ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for callers, got in rows:
        off, on = got["no batching"], got["batching"]
        print(f"| {callers} | {off['rps']:.1f} | {off['p50']:.1f} | {off['p99']:.1f} | {off['cpu_ms']:.1f} "
              f"| {on['rps']:.1f} | {on['p50']:.1f} | {on['p99']:.1f} | {on['cpu_ms']:.1f} | {on['batch']:.1f} "
              f"| {on['rps'] / off['rps']:.2f}x | {on['p50'] / off['p50']:.2f}x |")
    failed = False
    by = dict(rows)
    if 32 in by:
        ratio = by[32]["batching"]["rps"] / by[32]["no batching"]["rps"]
        ok = ratio >= 3
        failed |= not ok
        print(f"goal: at 32 callers >= 3x the requests/s of no batching: {ratio:.2f}x {'met' if ok else 'NOT MET'}")
    if 1 in by:
        ratio = by[1]["batching"]["p50"] / by[1]["no batching"]["p50"]
        ok = ratio <= 1.1
        failed |= not ok
        print(f"goal: p50 at 1 caller no worse than 1.1x: {ratio:.2f}x {'met' if ok else 'NOT MET'}")
    errors = sum(len(r["errors"]) for _, got in rows for r in got.values())
    if errors:
        print(f"{errors} requests failed")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
