"""Where the models server runs model work: on its web threads (before) or on its compute threads (now).

torch gives each thread that runs CPU kernels an OpenMP team of its own, kept while the thread lives; when the
teams outnumber the cores, libgomp sleeps between kernels (modelhost/compute.py). The tiny Stable Diffusion
pipeline the tests build, through its handler, n calls after a warm-up, three ways, each in a fresh process
(teams outlive the calls that made them), the three alternating over `rounds` rounds:

  script        the calls made from the main thread, as a user's own script makes them: the floor
  web threads   each call made by the next of 8 threads, each running the pipeline itself (the server before)
  compute       the same 8 threads handing each call to the engine's compute thread (the server now)

Prints each way's median wall time and CPU time a call, and its ratio to the script's.
Usage: python bench/compute_threads.py [N] [ROUNDS] [STEPS]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "stable-diffusion-v1-5/stable-diffusion-v1-5"
WAYS = ("script", "web threads", "compute")


def measure(way: str, folder: Path, n: int, steps: int) -> dict[str, float]:
    """One way, in this process: median wall seconds and mean CPU seconds a call."""
    from hugginggpt.modelhost.compute import Compute, default_threads
    from hugginggpt.modelhost.handlers import Inputs, handle
    from hugginggpt.modelhost.pool import ModelPool
    from hugginggpt.modelhost.registry import Registry

    compute = Compute(default_threads("cpu"))
    pool = ModelPool(Registry("full", folder / "models"), "cpu", compute=compute)
    spec = pool.registry.get(MODEL)
    body = {"text": "a lighthouse at dusk", "steps": steps}

    def call() -> None:
        with pool.use(spec) as loaded:
            if way == "compute":
                compute.run(handle, spec.task, loaded, Inputs(body, folder / "public"))
            else:
                handle(spec.task, loaded, Inputs(body, folder / "public"))

    def timed() -> float:
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0

    if way == "script":
        run = timed
    else:  # the next web thread in turn takes the call, as waitress's threads do (its queue wakes them in turn)
        web = [ThreadPoolExecutor(1) for _ in range(8)]
        turn = iter(range(10**9))

        def run() -> float:
            return web[next(turn) % len(web)].submit(timed).result()
    for _ in range(3 * 8):  # warm: every web thread has run once
        run()
    cpu0 = time.process_time()
    walls = [run() for _ in range(n)]
    return {"wall": statistics.median(walls), "cpu": (time.process_time() - cpu0) / n}


def main(n: int, rounds: int, steps: int) -> None:
    from tests.conftest import make_public
    from tests.tiny_models import tiny_stable_diffusion

    folder = Path(tempfile.mkdtemp())
    tiny_stable_diffusion(folder / "models" / MODEL)
    make_public(folder / "public")
    results: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for _ in range(rounds):
        for way in WAYS:
            out = subprocess.run([sys.executable, __file__, "--way", way, "--folder", str(folder), str(n), "1",
                                  str(steps)], capture_output=True, text=True, check=True)
            results[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
    floor = statistics.median(r["wall"] for r in results["script"])
    print(f"tiny SD, {steps} steps, through its handler, {n} calls x {rounds} rounds each, a fresh process each:")
    for way in WAYS:
        wall = statistics.median(r["wall"] for r in results[way])
        cpu = statistics.median(r["cpu"] for r in results[way])
        print(f"  {way:12s} median {wall * 1000:7.1f} ms  x{wall / floor:.2f}  CPU {cpu * 1000:7.1f} ms a call")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=20)
    parser.add_argument("rounds", nargs="?", type=int, default=3)
    parser.add_argument("steps", nargs="?", type=int, default=25)
    parser.add_argument("--way", choices=WAYS)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    if args.way:
        print(json.dumps(measure(args.way, args.folder, args.n, args.steps)))
    else:
        main(args.n, args.rounds, args.steps)
