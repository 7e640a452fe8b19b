"""Requests per second through the Ray Serve engine for one tiny model, with 1 and then 2 replicas.

Starts `models_server.py --engine ray --replicas N` on a tiny text classifier (random weights, built here),
sends requests from 8 concurrent clients for a fixed time, reports requests per second, and repeats with
the in-process flask engine as the baseline. Needs requirements-ray.txt.

    python bench/ray_replicas.py [--seconds 15]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from tests.conftest import ROOT, free_port, make_public  # noqa: E402
from tests.tiny_models import text_classifier  # noqa: E402

MODEL = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"


def measure(folder: Path, engine: str, replicas: int, seconds: float, clients: int = 8) -> float:
    port = free_port()
    config = folder / f"c-{port}.yaml"
    config.write_text(f"root: {ROOT}\npublic_dir: {folder / 'public'}\nlocal_models_dir: {folder / 'models'}\n"
                      f"local_deployment: standard\nlocal_inference_endpoint: {{host: 127.0.0.1, port: {port}}}\n")
    proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config", str(config), "--engine", engine,
                             "--replicas", str(replicas)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/models/{MODEL}"
    try:
        for _ in range(600):
            try:
                if requests.post(url, json={"text": "warm up"}, timeout=60).ok:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        for _ in range(4 * replicas):  # every replica loads the model before the clock starts
            requests.post(url, json={"text": "warm up"}, timeout=60)
        done = [0]
        lock = threading.Lock()
        stop = time.monotonic() + seconds

        def client() -> None:
            with requests.Session() as http:
                while time.monotonic() < stop:
                    if http.post(url, json={"text": "a great movie"}, timeout=60).ok:
                        with lock:
                            done[0] += 1

        threads = [threading.Thread(target=client) for _ in range(clients)]
        started = time.monotonic()
        [t.start() for t in threads]
        [t.join() for t in threads]
        return done[0] / (time.monotonic() - started)
    finally:
        proc.terminate()
        proc.wait(120)


def main(seconds: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    text_classifier(folder / "models" / MODEL)
    make_public(folder / "public")
    flask = measure(folder, "flask", 1, seconds)
    one = measure(folder, "ray", 1, seconds)
    two = measure(folder, "ray", 2, seconds)
    print(f"tiny text classifier, 8 concurrent clients, {seconds:g} s each on this machine:")
    print(f"  flask engine (one process): {flask:.0f} req/s")
    print(f"  ray engine, 1 replica:      {one:.0f} req/s")
    print(f"  ray engine, 2 replicas:     {two:.0f} req/s ({two / one:.2f}x of 1 replica)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="measuring time per setting (default %(default)s)")
    main(parser.parse_args().seconds)
