"""Overhead of the models server versus calling the same pipeline in-process.

Builds a tiny token-classification model, starts models_server.py on loopback, and times N calls each
way; prints medians in ms and the difference. Usage: python bench/models_server_overhead.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import requests  # noqa: E402

from hugginggpt.modelhost.handlers import Inputs, handle  # noqa: E402
from hugginggpt.modelhost.pool import ModelPool  # noqa: E402
from hugginggpt.modelhost.registry import Registry  # noqa: E402
from tests.conftest import make_public  # noqa: E402
from tests.test_models_server import start_models_server  # noqa: E402
from tests.tiny_models import build_all  # noqa: E402

MODEL = "dslim/bert-base-NER"
BODY = {"text": "anna lives in berlin and the cat sits on the mat"}


def main(n: int = 200) -> None:
    folder = Path(tempfile.mkdtemp())
    models_dir = folder / "models"
    build_all(models_dir)
    public = make_public(folder / "public")
    pool = ModelPool(Registry("standard", models_dir), "cpu")
    spec = pool.registry.get(MODEL)
    direct = []
    with pool.use(spec) as loaded:
        for _ in range(n + 10):
            t0 = time.perf_counter()
            handle(spec.task, loaded, Inputs(BODY, public))
            direct.append(time.perf_counter() - t0)
    proc, url = start_models_server(folder, models_dir, public)
    try:
        http = requests.Session()
        served = []
        for _ in range(n + 10):
            t0 = time.perf_counter()
            http.post(f"{url}/models/{MODEL}", json=BODY, timeout=30).raise_for_status()
            served.append(time.perf_counter() - t0)
    finally:
        proc.terminate()
    d, s = statistics.median(direct[10:]) * 1000, statistics.median(served[10:]) * 1000
    print(f"{MODEL} (tiny), n={n}: in-process median {d:.2f} ms, via models server {s:.2f} ms, "
          f"overhead {s - d:.2f} ms")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("n", nargs="?", type=int, default=200, help="calls to time (default %(default)s)")
    main(parser.parse_args().n)
