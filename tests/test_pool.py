"""The model pool on tiny real models: LRU order, the memory budget as a ceiling, the device fallback."""

from __future__ import annotations

import pytest
import requests

from hugginggpt.modelhost.device import resolve_device
from hugginggpt.modelhost.pool import ModelPool
from hugginggpt.modelhost.registry import ModelSpec, Registry
from tests.conftest import make_public
from tests.tiny_models import text_classifier

IDS = ("tiny/one", "tiny/two", "tiny/three")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pool-models")
    for mid in IDS:
        text_classifier(folder / mid)
    return folder


def registry(models_dir) -> Registry:
    specs = tuple(ModelSpec(mid, "text-classification", "pipeline", "minimal", "text-classification") for mid in IDS)
    return Registry("minimal", models_dir, specs)


def use(pool: ModelPool, mid: str) -> None:
    with pool.use(pool.registry.get(mid)) as loaded:
        assert loaded.obj("a fine day")[0]["label"]


def test_the_least_recently_used_model_is_evicted(models_dir):
    reg = registry(models_dir)
    size = reg.expected_bytes(reg.get("tiny/one"))
    pool = ModelPool(reg, "cpu", budget_bytes=int(size * 2.5))
    use(pool, "tiny/one")
    use(pool, "tiny/two")
    use(pool, "tiny/one")  # one is now the most recently used
    use(pool, "tiny/three")
    assert pool.evictions == ["tiny/two"]
    assert set(pool.loaded()) == {"tiny/one", "tiny/three"}


def test_the_budget_is_a_ceiling_not_a_target(models_dir):
    """With the size known from the weight files, the old model goes before the new one loads."""
    reg = registry(models_dir)
    size = reg.expected_bytes(reg.get("tiny/one"))
    pool = ModelPool(reg, "cpu", budget_bytes=int(size * 1.5))
    use(pool, "tiny/one")
    loaded_size = pool.loaded()["tiny/one"].nbytes
    assert 0.8 * size <= loaded_size <= 1.2 * size  # the file size predicts the memory it takes
    use(pool, "tiny/two")
    assert pool.evictions == ["tiny/one"]
    assert pool.peak_bytes <= pool.budget, (pool.peak_bytes, pool.budget)


def test_without_a_budget_nothing_is_evicted(models_dir):
    pool = ModelPool(registry(models_dir), "cpu", budget_bytes=None)
    for mid in IDS:
        use(pool, mid)
    assert pool.evictions == [] and len(pool.loaded()) == 3


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA: no fallback to test")
def test_cuda_on_a_machine_without_it_falls_back_to_the_cpu(tmp_path):
    device, warning = resolve_device("cuda:0")
    assert device == "cpu" and "cuda:0" in warning
    assert resolve_device("cpu") == ("cpu", None)
    from tests.test_models_server import start_models_server

    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, tmp_path / "none", public, deployment="minimal", device="cuda:0")
    try:
        resp = requests.post(url + "/models/canny-control", json={"img_url": "/examples/red.png"}, timeout=60)
        assert resp.status_code == 200, resp.text
        rows = requests.get(url + "/models", timeout=5).json()["models"]
        assert {r["device"] for r in rows} == {"cpu"}
    finally:
        proc.terminate()
        proc.wait(10)
    log = next(tmp_path.glob("models-*.log")).read_text()
    assert sum(line.startswith("warning:") for line in log.splitlines()) == 1, log
