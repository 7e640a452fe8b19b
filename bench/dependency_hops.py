"""Dependency-hop latency of the scheduler: finish of a task -> start of its dependent.

Runs chains and a diamond-heavy DAG of short sleeping tasks and reports median and max hop in ms,
next to what a 0.5 s polling loop (JARVIS) would give on average. Usage: python bench/dependency_hops.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hugginggpt.scheduler import Scheduler  # noqa: E402


def hops(graph: dict[int, list[int]], work: float = 0.005) -> list[float]:
    began: dict[int, float] = {}
    ended: dict[int, float] = {}

    def body(tid: int) -> None:
        began[tid] = time.perf_counter()  # when the task's own code starts running
        time.sleep(work)
        ended[tid] = time.perf_counter()  # when it returns to the scheduler

    Scheduler.of_graph(graph, body, max_workers=8).run(timeout=60)
    return [began[tid] - max(ended[d] for d in deps) for tid, deps in graph.items() if deps]


def main() -> None:
    samples: list[float] = []
    for _ in range(20):
        samples += hops({i: ([i - 1] if i else []) for i in range(20)})  # a chain of 20
        samples += hops({0: [], 1: [0], 2: [0], 3: [0], 4: [1, 2, 3], 5: [4], 6: [4], 7: [5, 6]})  # fan-out/in
    ms = sorted(s * 1000 for s in samples)
    print(f"dependency hops: n={len(ms)} median={statistics.median(ms):.3f} ms "
          f"p95={ms[int(len(ms) * 0.95)]:.3f} ms max={ms[-1]:.3f} ms (a 0.5 s polling loop averages ~250 ms)")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
