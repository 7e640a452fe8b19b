"""What watching a diffusion call's progress costs (issue 48): on the tiny Stable Diffusion pipeline the tests build.

In-process, interleaved in one run: the pipeline called as the handler called it before progress existed
(then its image saved), through its handler with nobody watching, and
through its handler with a watch (each step's event built and handed to a sink). Then over HTTP on the real
models_server.py: the one-shot answer against the event stream (`Accept: text/event-stream`), alternating, with
the server's CPU time per call. Prints medians and the ratios. Usage: python bench/progress_cost.py [N] [STEPS]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from hugginggpt.modelhost import progress  # noqa: E402
from hugginggpt.modelhost.handlers import Inputs, handle  # noqa: E402
from hugginggpt.modelhost.pool import ModelPool  # noqa: E402
from hugginggpt.modelhost.registry import Registry  # noqa: E402
from tests.conftest import make_public  # noqa: E402
from tests.test_models_server import start_models_server  # noqa: E402
from tests.tiny_models import tiny_stable_diffusion  # noqa: E402

MODEL = "stable-diffusion-v1-5/stable-diffusion-v1-5"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(n: int = 30, steps: int = 25) -> None:
    folder = Path(tempfile.mkdtemp())
    models_dir = folder / "models"
    tiny_stable_diffusion(models_dir / MODEL)
    public = make_public(folder / "public")
    body = {"text": "a lighthouse at dusk", "steps": steps}

    pool = ModelPool(Registry("full", models_dir), "cpu")
    spec = pool.registry.get(MODEL)
    times: dict[str, list[float]] = {"as before (pipeline + save)": [], "handler, nobody watching": [],
                                     "handler, watched": []}
    events = [0]
    watch = progress.Watch(lambda e: events.__setitem__(0, events[0] + 1))
    with pool.use(spec) as loaded:
        for k in range(n + 3):
            for name in times:
                t0 = time.perf_counter()
                if name == "as before (pipeline + save)":  # the handler as it was before progress existed
                    Inputs(body, public).save_image(loaded.obj(body["text"], num_inference_steps=steps).images[0])
                elif name == "handler, nobody watching":
                    handle(spec.task, loaded, Inputs(body, public))
                else:
                    with progress.watching(watch):
                        handle(spec.task, loaded, Inputs(body, public))
                if k >= 3:
                    times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["as before (pipeline + save)"])
    print(f"tiny SD, {steps} steps, n={n} each, interleaved, in-process:")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:28s} median {med * 1000:8.2f} ms  x{med / base:.3f}")
    print(f"  events made while watched: {events[0]} ({events[0] / (n + 3):.0f} a call)")

    proc, url = start_models_server(folder, models_dir, public, deployment="full")
    try:
        http = requests.Session()
        http.post(f"{url}/models/{MODEL}", json=body, timeout=120).raise_for_status()  # loaded before timing
        served: dict[str, list[float]] = {"one-shot JSON": [], "event stream": []}
        cpu: dict[str, float] = {name: 0.0 for name in served}
        for _ in range(n):
            for name in served:
                before = cpu_seconds(proc.pid)
                t0 = time.perf_counter()
                if name == "one-shot JSON":
                    http.post(f"{url}/models/{MODEL}", json=body, timeout=120).raise_for_status()
                else:
                    resp = http.post(f"{url}/models/{MODEL}", json=body, timeout=120, stream=True,
                                     headers={"Accept": "text/event-stream"})
                    last = [line for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")][-1]
                    assert "path" in json.loads(last[len("data: "):])
                served[name].append(time.perf_counter() - t0)
                cpu[name] += cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(10)
    one = statistics.median(served["one-shot JSON"])
    print(f"over HTTP (models_server.py), n={n} each, alternating:")
    for name, values in served.items():
        med = statistics.median(values)
        print(f"  {name:28s} median {med * 1000:8.2f} ms  x{med / one:.3f}  server CPU {cpu[name] / n * 1000:.1f} ms a call")
    print(f"  the one-shot call through the server against the pipeline in-process: x{one / base:.3f}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=30)
    parser.add_argument("steps", nargs="?", type=int, default=25)
    args = parser.parse_args()
    main(args.n, args.steps)
