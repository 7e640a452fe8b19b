"""The model pool on tiny real models: LRU order, the memory budget as a ceiling, the device fallback, the device's
free memory (injected, as CUDA would report it): idle models evicted first, models in use never, refusals (503)."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from hugginggpt.modelhost.device import resolve_device
from hugginggpt.modelhost.pool import HEADROOM, ModelPool, NoRoom
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
    assert " on cpu, 1 compute thread\n" in log, log  # the CPU's count, not the configured accelerator's four


# -- memory in device terms: the free-memory reading is injected, as CUDA's mem_get_info would give it ----------


class FakeDevice:
    """A device of `capacity` bytes whose free memory is what the pool's loaded models leave (and `other`, memory
    someone else holds)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.other = 0
        self.pool: ModelPool | None = None

    def free(self) -> int:
        return self.capacity - self.other - sum(e.nbytes for e in self.pool.loaded().values())


def device_pool(models_dir, models_that_fit: float) -> tuple[ModelPool, FakeDevice]:
    reg = registry(models_dir)
    need = reg.expected_bytes(reg.get("tiny/one")) * (1 + HEADROOM)
    fake = FakeDevice(int(need * models_that_fit))
    fake.pool = ModelPool(reg, "cpu", budget_bytes=None, free_memory=fake.free)
    return fake.pool, fake


def held(pool: ModelPool, mid: str):
    """Keep `mid` in use from another thread until the returned event is set."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool.use(pool.registry.get(mid)):
            inside.set()
            release.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert inside.wait(60)
    return release, thread


def test_a_load_that_does_not_fit_the_free_memory_evicts_idle_models_first(models_dir):
    pool, fake = device_pool(models_dir, models_that_fit=2.5)
    use(pool, "tiny/one")
    use(pool, "tiny/two")
    use(pool, "tiny/one")
    use(pool, "tiny/three")  # the device's free memory, not the (absent) budget, makes room: two goes
    assert pool.evictions == ["tiny/two"] and set(pool.loaded()) == {"tiny/one", "tiny/three"}
    fake.other = fake.capacity  # someone else took the whole device: nothing idle can make room
    with pytest.raises(NoRoom, match="tiny/two needs about [0-9]+ kB on cpu .* has -?[0-9]+ kB free"):
        use(pool, "tiny/two")
    assert "tiny/two" not in pool.loaded()


def test_a_model_in_use_is_never_evicted_and_the_load_is_refused(models_dir):
    pool, fake = device_pool(models_dir, models_that_fit=1.5)
    release, thread = held(pool, "tiny/one")
    try:
        with pytest.raises(NoRoom, match="in use now: tiny/one"):
            use(pool, "tiny/two")
        assert set(pool.loaded()) == {"tiny/one"} and pool.evictions == []
    finally:
        release.set()
        thread.join(10)
    use(pool, "tiny/two")  # idle now: evicted for the new one
    assert pool.evictions == ["tiny/one"] and set(pool.loaded()) == {"tiny/two"}


def test_the_budget_refuses_a_model_larger_than_itself(models_dir):
    reg = registry(models_dir)
    pool = ModelPool(reg, "cpu", budget_bytes=reg.expected_bytes(reg.get("tiny/one")) // 2)
    with pytest.raises(NoRoom, match="more than memory_budget_gb allows"):
        use(pool, "tiny/one")
    assert pool.loaded() == {}


def test_out_of_memory_while_loading_evicts_idle_models_and_tries_again(models_dir, monkeypatch):
    import torch

    import hugginggpt.modelhost.pool as pool_module

    pool, fake = device_pool(models_dir, models_that_fit=10)
    use(pool, "tiny/one")
    real_load, calls = pool_module.load, []

    def load(spec, registry, device):  # the driver says no while another model is loaded
        calls.append(spec.id)
        if len(pool.loaded()) > 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return real_load(spec, registry, device)

    monkeypatch.setattr(pool_module, "load", load)
    use(pool, "tiny/two")
    assert calls == ["tiny/two", "tiny/two"] and pool.evictions == ["tiny/one"]
    release, thread = held(pool, "tiny/two")  # in use: the retry has nothing to evict
    try:
        with pytest.raises(NoRoom, match="out of memory while loading.*in use now: tiny/two"):
            use(pool, "tiny/three")
    finally:
        release.set()
        thread.join(10)


def test_out_of_memory_while_running_is_a_refusal_and_the_model_stays(models_dir):
    import torch

    pool, _ = device_pool(models_dir, models_that_fit=10)
    with pytest.raises(NoRoom, match="ran out of memory on cpu while running"):
        with pool.use(pool.registry.get("tiny/one")):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    use(pool, "tiny/one")
    assert pool.loads == 1


def test_the_models_server_answers_503_when_a_model_in_use_holds_the_memory(models_dir, tmp_path):
    """Over HTTP: the refusal is a 503 with Retry-After that names the model in use; the server keeps serving."""
    from hugginggpt.modelhost.app import create_app
    from hugginggpt.modelhost.engine import LocalEngine
    from tests.fakes.llm_server import KeepAliveServer

    pool, _ = device_pool(models_dir, models_that_fit=1.5)
    server = KeepAliveServer(create_app(LocalEngine(pool), make_public(tmp_path / "public")), threads=8).start()
    try:
        release, thread = held(pool, "tiny/one")
        try:
            resp = requests.post(f"{server.url}/models/tiny/two", json={"text": "a fine day"}, timeout=60)
            assert resp.status_code == 503, resp.text
            assert resp.headers["Retry-After"] == "5"
            error = resp.json()["error"]
            assert error["type"] == "no_room" and "in use now: tiny/one" in error["message"]
        finally:
            release.set()
            thread.join(10)
        resp = requests.post(f"{server.url}/models/tiny/two", json={"text": "a fine day"}, timeout=60)
        assert resp.status_code == 200 and resp.json()[0]["label"] in ("NEGATIVE", "POSITIVE")
        memory = requests.get(server.url + "/models", timeout=10).json()["memory"]
        assert memory["models_bytes"] == pool.loaded()["tiny/two"].nbytes and memory["rss_bytes"] > 0
    finally:
        server.stop()


def test_what_a_load_takes_and_an_eviction_gives_back_is_measured(models_dir, monkeypatch):
    """On CUDA the pool reads torch.cuda.memory_allocated around each load and eviction. Here a fake device stands
    in: a loaded pipeline holds its parameters' bytes until Python frees the object, so an eviction that left a
    reference behind would give nothing back."""
    import weakref

    import hugginggpt.modelhost.pool as pool_module

    pool, _ = device_pool(models_dir, models_that_fit=1.5)
    held = {"bytes": 0}
    real_load = pool_module.load

    def load(spec, registry, device):
        obj = real_load(spec, registry, device)
        size = pool_module.memory_of(obj)
        held["bytes"] += size
        weakref.finalize(obj, lambda: held.__setitem__("bytes", held["bytes"] - size))
        return obj

    monkeypatch.setattr(pool_module, "load", load)
    monkeypatch.setattr(pool, "_allocated", lambda: held["bytes"])
    use(pool, "tiny/one")
    took = pool.loaded()["tiny/one"].device_bytes
    assert took == pool.loaded()["tiny/one"].nbytes > 0
    use(pool, "tiny/two")  # one is evicted to make room
    assert pool.freed == {"tiny/one": took}
    assert pool.memory()["freed_on_eviction_bytes"] == {"tiny/one": took}


def test_the_models_server_never_evicts_a_model_another_request_is_using(tmp_path):
    """Two requests to the real models_server.py under a memory budget that holds one of two models: while the
    first request is inside its model (a diffusion run, its steps heard as they come), the second model does not
    fit, and the second request gets a 503 naming the model in use instead of evicting it from under the first."""
    from tests.test_models_server import start_models_server
    from tests.tiny_models import audio_classifier, tiny_stable_diffusion

    sd, clf = "stable-diffusion-v1-5/stable-diffusion-v1-5", "MIT/ast-finetuned-audioset-10-10-0.4593"
    models_dir = tmp_path / "models"
    tiny_stable_diffusion(models_dir / sd)
    audio_classifier(models_dir / clf)
    reg = Registry("full", models_dir)
    budget = reg.expected_bytes(reg.get(sd))  # either fits; the pipeline's loaded bytes and the classifier's do not
    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, models_dir, public, budget_gb=budget / 1e9, deployment="full")
    try:
        first = requests.post(f"{url}/models/{sd}", json={"text": "a long one", "steps": 150},
                              headers={"Accept": "text/event-stream"}, stream=True, timeout=120)
        lines = first.iter_lines(decode_unicode=True)
        for line in lines:
            if line.startswith("data: ") and '"step":1,' in line:
                break  # the first is in its model
        else:
            raise AssertionError("the diffusion run never reached its first step")
        second = requests.post(f"{url}/models/{clf}", json={"audio_url": "/examples/hello.wav"}, timeout=60)
        assert second.status_code == 503, second.text
        assert f"in use now: {sd}" in second.json()["error"]["message"]
        rows = {r["id"]: r for r in requests.get(f"{url}/models", timeout=10).json()["models"]}
        assert rows[sd]["loaded"] and not rows[clf]["loaded"]
        rest = [line for line in lines if line.startswith(("event: ", "data: "))]
        assert rest[-2] == "event: result" and '"path":"/images/' in rest[-1].replace(" ", "")  # ran to its end
        again = requests.post(f"{url}/models/{clf}", json={"audio_url": "/examples/hello.wav"}, timeout=60)
        assert again.status_code == 200, again.text  # idle now: the first model makes room
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_slow_audio_url_holds_neither_its_model_nor_the_cpu(tmp_path):
    """A request whose `audio_url` is a peer that sends four bytes and stalls waits for them on its own thread
    (up to fetch_timeout): another request of the same model, and one of another model, are answered meanwhile
    (the model's turn and the CPU's one compute thread are taken only once the inputs are in); the stalled one
    is cut at the models server's own `fetch_timeout` and told so, and its `max_fetch_bytes` bounds a file."""
    from tests.fakes.raw_peer import RawPeer
    from tests.test_models_server import start_models_server
    from tests.tiny_models import speech_recognizer, text_classifier

    asr, text = "facebook/wav2vec2-base-960h", "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
    models_dir = tmp_path / "models"
    speech_recognizer(models_dir / asr)
    text_classifier(models_dir / text)
    public = make_public(tmp_path / "public")
    peer = RawPeer()
    proc, url = start_models_server(tmp_path, models_dir, public,
                                    extra=("url_allowlist: ['127.0.0.1']", "fetch_timeout: 6",
                                           f"max_fetch_bytes: {2 * 1024 * 1024}"))
    stalled: dict[str, requests.Response] = {}
    try:
        for model, body in ((asr, {"audio_url": "/examples/hello.wav"}), (text, {"text": "a fine day"})):
            assert requests.post(f"{url}/models/{model}", json=body, timeout=120).status_code == 200  # loaded
        reader = threading.Thread(target=lambda: stalled.setdefault("resp", requests.post(
            f"{url}/models/{asr}", json={"audio_url": f"http://127.0.0.1:{peer.port}/stall"}, timeout=60)))
        reader.start()
        deadline = time.monotonic() + 60
        while "stall" not in peer.sent and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "stall" in peer.sent
        for model, body in ((asr, {"audio_url": "/examples/hello.wav"}), (text, {"text": "a fine day"})):
            resp = requests.post(f"{url}/models/{model}", json=body, timeout=60)
            assert resp.status_code == 200, resp.text
            assert reader.is_alive(), f"{model} was answered only after the stalled request ended"
        reader.join(60)  # the peer stalls for 10 s: the fetch ends at 6
        assert stalled["resp"].status_code == 400, stalled["resp"].text
        assert stalled["resp"].json()["error"]["message"] == (
            f"fetching 'http://127.0.0.1:{peer.port}/stall' took longer than 6s")
        (public / "examples" / "big.wav").write_bytes(b"\0" * (3 * 1024 * 1024))
        big = requests.post(f"{url}/models/{asr}", json={"audio_url": "/examples/big.wav"}, timeout=60)
        assert big.status_code == 400 and big.json()["error"]["message"] == (
            "'/examples/big.wav' is larger than the 2 MiB limit")
    finally:
        peer.stop.set()
        peer.sock.close()
        proc.terminate()
        proc.wait(10)
