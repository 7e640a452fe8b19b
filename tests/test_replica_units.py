"""What a Ray replica does, without Ray (`ray_engine.Replica`): it loads only what it can serve, runs a request
alone under its model's lock or a batchable task's requests as one batch, and answers in the plain data that
travels back to the front: {"result", "files"} or {"error": {"kind", "message"}}. Tiny real models, built once
per version of tests/tiny_models.py; Serve's multiplexing and gathering come in as plain async functions (the
real ones run in tests/test_models_engines.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import tempfile
import threading
import time
from io import BytesIO
from pathlib import Path

import pytest

from hugginggpt.modelhost.compute import Compute
from hugginggpt.modelhost.handlers import Inputs, handle
from hugginggpt.modelhost.pool import InferenceFailed, Loaded, ModelUnavailable
from hugginggpt.modelhost.progress import Watch, watching
from hugginggpt.modelhost.ray_engine import Replica
from hugginggpt.modelhost.registry import ModelSpec, Registry
from tests import tiny_models
from tests.conftest import make_public, wait_until
from tests.tiny_models import close

CLF = "tiny/clf"
CLF2 = "tiny/clf-three"
SD = "tiny/sd"
IMG = "tiny/vit"
MISSING = "tiny/not-on-disk"
SPECS = (ModelSpec(CLF, "text-classification", "pipeline", "minimal", "text-classification"),
         ModelSpec(CLF2, "text-classification", "pipeline", "minimal", "text-classification"),
         ModelSpec(SD, "text-to-image", "diffusers", "minimal"),
         ModelSpec(IMG, "image-classification", "pipeline", "minimal", "image-classification"),
         ModelSpec(MISSING, "text-classification", "pipeline", "minimal", "text-classification"))
LONG = " ".join(["cat"] * 400)  # past the tiny BERT's 128 positions: the model itself fails on it
FAILS = "RuntimeError: The size of tensor a (402) must match the size of tensor b (128)"


def classifier(folder: Path, labels: list[str], seed: int) -> None:
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    tiny_models.bert_tokenizer(folder)
    tiny_models.words_tokenizer(folder)
    BertForSequenceClassification(tiny_models.bert_config(
        num_labels=len(labels), initializer_range=0.5, id2label=dict(enumerate(labels)),
        label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def build_models(folder: Path) -> None:
    classifier(folder / CLF, ["NEGATIVE", "POSITIVE"], seed=0)
    classifier(folder / CLF2, ["negative", "neutral", "positive"], seed=1)
    tiny_models.tiny_stable_diffusion(folder / SD)
    tiny_models.image_classifier(folder / IMG)


@pytest.fixture(scope="module")
def models_dir() -> Path:
    return tiny_models.built_once("replica-units", build_models, classifier)


class Held:
    """The models a replica of the module holds, each loaded by `Replica.load` on first use (as Serve's
    multiplexing keeps them): a test pays only for the models it uses."""

    def __init__(self, models_dir: Path) -> None:
        self.replica = Replica(Registry("minimal", models_dir, SPECS), "cpu", 1_000_000, Compute(1))
        self.models: dict[str, Loaded] = {}

    def __contains__(self, model_id: str) -> bool:
        return model_id in (CLF, CLF2, SD, IMG)

    def __getitem__(self, model_id: str) -> Loaded:
        if model_id not in self.models:
            self.models[model_id] = asyncio.run(self.replica.load(model_id))
        return self.models[model_id]

    async def get(self, model_id: str) -> Loaded:
        if model_id not in self.models:
            self.models[model_id] = await self.replica.load(model_id)
        return self.models[model_id]


@pytest.fixture(scope="module")
def loaded(models_dir) -> Held:
    return Held(models_dir)


def replica_of(models_dir: Path, max_batch_size: int = 1, compute: Compute | None = None,
               max_pixels: int = 1_000_000) -> Replica:
    return Replica(Registry("minimal", models_dir, SPECS), "cpu", max_pixels, compute or Compute(1), max_batch_size)


def held(loaded: Held):
    """Serve's `get_model` for a replica that holds `loaded`: any other id is one it cannot serve."""
    asked: list[str] = []

    async def get_model(model_id: str) -> Loaded:
        asked.append(model_id)
        if model_id not in loaded:
            raise ModelUnavailable(f"this replica cannot serve {model_id}")
        return await loaded.get(model_id)
    return get_model, asked


async def never_batched(request):
    raise AssertionError(f"a request run alone was sent to a batch: {request}")


def alone(loaded: Loaded, body: dict) -> object:
    """What the model's handler answers for `body`, straight (the answer a replica must pass on)."""
    with tempfile.TemporaryDirectory() as tmp:
        return handle(loaded.spec.task, loaded, Inputs(body=body, public_dir=Path(tmp), max_pixels=1_000_000))


# -- loading ------------------------------------------------------------------------------------------------------


def test_a_replica_loads_what_it_can_serve_and_a_waiting_call_hears_loading(models_dir):
    replica = replica_of(models_dir)
    heard: list[dict] = []
    with watching(Watch(heard.append)):
        got = asyncio.run(replica.load(CLF))
    assert heard == [{"phase": "loading"}]
    assert got.spec is replica.registry.get(CLF) and got.device == "cpu"
    assert got.nbytes > 10_000 and 0 < got.load_seconds < 60
    assert alone(got, {"text": "a great movie"})  # a working pipeline, not a placeholder
    for model_id in (MISSING, "nobody/unknown"):  # not on disk; not in the catalog
        heard.clear()
        with watching(Watch(heard.append)), pytest.raises(ModelUnavailable) as err:
            asyncio.run(replica.load(model_id))
        assert str(err.value) == f"this replica cannot serve {model_id}"
        assert heard == []  # nothing loads: the call never hears `loading`


def test_a_load_runs_on_the_replica_s_compute_thread(models_dir):
    threads: list[int] = []

    class Recording(Compute):
        def submit(self, fn, *args, **kwargs):
            def recorded(*a, **k):
                threads.append(threading.get_ident())
                return fn(*a, **k)
            return super().submit(recorded, *args, **kwargs)

    replica = replica_of(models_dir, compute=Recording(1))
    asyncio.run(replica.load(CLF))
    assert len(threads) == 1 and threads[0] != threading.get_ident()


# -- one request at a time -----------------------------------------------------------------------------------------


def test_a_request_run_alone_answers_what_its_model_says_under_its_model_s_lock(models_dir, loaded):
    replica = replica_of(models_dir)
    get_model, asked = held(loaded)
    body = {"text": "anna lives in berlin"}
    answer = asyncio.run(replica.dispatch(CLF2, body, get_model, never_batched))
    assert answer == {"result": alone(loaded[CLF2], body), "files": {}}
    assert asked == [CLF2] and list(replica.locks) == [CLF2] and not replica.locks[CLF2].locked()


def test_batching_off_runs_a_batchable_task_alone_and_on_sends_it_to_serve_s_gathering(models_dir, loaded):
    get_model, _ = held(loaded)
    sent: list[tuple[str, dict]] = []

    async def batched(request):
        sent.append(request)
        return {"result": "from the batch", "files": {}, "batch": 2}

    heard: list[dict] = []
    loaded[CLF]  # held already: the call hears only why it waits
    with watching(Watch(heard.append)):
        answer = asyncio.run(replica_of(models_dir, 2).dispatch(CLF, {"text": "bad"}, get_model, batched))
    assert answer == {"result": "from the batch", "files": {}, "batch": 2}
    assert sent == [(CLF, {"text": "bad"})]
    assert heard == [{"phase": "queued", "waiting": "in a batch with other requests for this model"}]
    sent.clear()
    alone_answer = asyncio.run(replica_of(models_dir, 1).dispatch(CLF, {"text": "bad"}, get_model, batched))
    assert sent == [] and alone_answer == {"result": alone(loaded[CLF], {"text": "bad"}), "files": {}}


def test_a_model_the_replica_cannot_serve_is_answered_unavailable(models_dir, loaded):
    get_model, _ = held(loaded)
    answer = asyncio.run(replica_of(models_dir).dispatch("nobody/x", {"text": "hi"}, get_model, never_batched))
    assert answer == {"error": {"kind": "unavailable", "message": "this replica cannot serve nobody/x"}}


@pytest.mark.parametrize("max_batch_size", [1, 4])
def test_a_generated_file_travels_back_as_its_bytes_and_diffusion_never_batches(models_dir, loaded, max_batch_size):
    from PIL import Image

    get_model, _ = held(loaded)
    answer = asyncio.run(replica_of(models_dir, max_batch_size).dispatch(SD, {"text": "a red fox", "steps": 2}, get_model,
                                                         never_batched))
    path = answer["result"]["path"]
    assert path.startswith("/images/") and path.endswith(".png")
    assert list(answer["files"]) == [path]
    image = Image.open(BytesIO(answer["files"][path]))
    assert image.format == "PNG" and image.size[0] > 0


def test_a_replica_s_errors_say_their_kind(models_dir, loaded):
    replica = replica_of(models_dir)
    assert replica.run(loaded[CLF], {"text": "  "}) == {
        "error": {"kind": "bad_request", "message": "`text` is required and must be a non-empty string"}}
    failed = replica.run(loaded[CLF], {"text": LONG})
    assert failed["error"]["kind"] == "failed"
    assert failed["error"]["message"].startswith(FAILS)
    stopped = Watch(lambda event: None)
    stopped.stop()
    with watching(stopped):  # the client left: the diffusion run ends at its first step
        answer = replica.run(loaded[SD], {"text": "a red fox", "steps": 3})
    assert answer == {"error": {"kind": "cancelled", "message": f"{SD} was stopped: its client left"}}


def test_a_model_s_long_failure_is_cut_to_300_characters_after_its_kind(models_dir, loaded):
    class Failing:  # a pipeline that fails with a long message (a CUDA error's dump, say)
        def __call__(self, *args, **kwargs):
            raise RuntimeError("x" * 299 + "yz" + "w" * 100)

    broken = Loaded(loaded[CLF].spec, Failing(), "cpu", 0, 0.0)
    message = replica_of(models_dir).run(broken, {"text": "hello"})["error"]["message"]
    assert message == "RuntimeError: " + "x" * 299 + "y"


# -- batches ------------------------------------------------------------------------------------------------------


def test_a_batch_answers_each_request_in_its_place_and_a_bad_one_fails_alone(models_dir, loaded):
    """Serve's gathering of five requests: two models, one the replica cannot serve, a bad input and an input the
    model fails on; each gets its own answer, in its place."""
    replica = replica_of(models_dir, 8)
    get_model, asked = held(loaded)
    texts = ["a great movie", "the cat sits on the mat", "hello world !"]
    requests = [(CLF, {"text": texts[0]}), ("nobody/x", {"text": "hi"}), (CLF2, {"text": texts[1]}),
                (CLF, {"text": ""}), (CLF, {"text": texts[2]}), (CLF2, {"text": LONG})]
    answers = asyncio.run(replica.gather(requests, get_model))
    assert len(answers) == 6
    # batch: how many requests of its model came in this batch (the bad ones included)
    assert close(answers[0], {"result": alone(loaded[CLF], {"text": texts[0]}), "files": {}, "batch": 3}, 1e-5)
    assert answers[1] == {"error": {"kind": "unavailable", "message": "this replica cannot serve nobody/x"}}
    assert close(answers[2], {"result": alone(loaded[CLF2], {"text": texts[1]}), "files": {}, "batch": 2}, 1e-5)
    assert answers[3] == {"error": {"kind": "bad_request",
                                    "message": "`text` is required and must be a non-empty string"}}
    assert close(answers[4], {"result": alone(loaded[CLF], {"text": texts[2]}), "files": {}, "batch": 3}, 1e-5)
    assert answers[5]["error"]["kind"] == "failed"
    assert answers[5]["error"]["message"].startswith(FAILS)
    assert asked == [CLF, "nobody/x", CLF2]  # each model asked for once, in the order it first came
    assert sorted(replica.locks) == [CLF, CLF2] and not any(lock.locked() for lock in replica.locks.values())


def test_a_batch_waits_for_its_model_s_running_request(models_dir, loaded):
    """A batch and a request run alone share the model's lock: the batch starts after the request ends."""
    replica = replica_of(models_dir, 8, compute=Compute(2))
    get_model, _ = held(loaded)
    order: list[str] = []

    async def scenario():
        lock = replica.locks.setdefault(CLF, asyncio.Lock())
        await lock.acquire()
        batch = asyncio.ensure_future(replica.gather([(CLF, {"text": "bad"})], get_model))
        await asyncio.sleep(0.2)
        order.append("released" if not batch.done() else "batch ran beside the request")
        lock.release()
        answers = await batch
        order.append("batch")
        return answers

    answers = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert order == ["released", "batch"]
    assert answers == [{"result": alone(loaded[CLF], {"text": "bad"}), "files": {}, "batch": 1}]


def test_a_batch_whose_batch_run_fails_is_run_one_by_one(models_dir, loaded):
    replica = replica_of(models_dir, 8)
    bodies = [{"text": "good dog"}, {"text": LONG}, {"text": "bad movie"}]
    answers = replica.run_batch(loaded[CLF], bodies)
    assert close(answers[0], {"result": alone(loaded[CLF], bodies[0]), "files": {}, "batch": 3}, 1e-5)
    assert answers[1]["error"]["kind"] == "failed"
    assert close(answers[2], {"result": alone(loaded[CLF], bodies[2]), "files": {}, "batch": 3}, 1e-5)


# -- a watched call -----------------------------------------------------------------------------------------------


def test_a_watched_call_streams_its_steps_then_its_answer(models_dir, loaded):
    replica = replica_of(models_dir)
    get_model, _ = held(loaded)

    async def collect():
        return [item async for item in replica.watched(
            lambda: replica.dispatch(SD, {"text": "a red fox", "steps": 3}, get_model, never_batched))]

    items = asyncio.run(asyncio.wait_for(collect(), 60))
    steps = [item["progress"]["step"] for item in items[:-1] if "step" in item["progress"]]
    assert steps == [1, 2, 3]
    assert all("progress" in item for item in items[:-1])
    assert items[-1]["answer"]["result"]["path"].startswith("/images/")
    assert replica.running == set()


def test_a_front_that_leaves_a_watched_call_stops_its_run_which_the_replica_holds_until_it_ends(models_dir, loaded):
    replica = replica_of(models_dir)
    get_model, _ = held(loaded)
    answers: list[dict] = []

    async def dispatch():
        answer = await replica.dispatch(SD, {"text": "a red fox", "steps": 40}, get_model, never_batched)
        answers.append(answer)
        return answer

    async def leave_after_first_step():
        stream = replica.watched(dispatch)
        async for item in stream:
            if "step" in item.get("progress", {}):
                break
        await stream.aclose()  # Serve closes the generator when the front cancels
        held_while_running = len(replica.running)
        for _ in range(600):
            if not replica.running:
                break
            await asyncio.sleep(0.05)
        return held_while_running

    held_while_running = asyncio.run(asyncio.wait_for(leave_after_first_step(), 60))
    assert held_while_running == 1
    assert replica.running == set()
    assert answers == [{"error": {"kind": "cancelled", "message": f"{SD} was stopped: its client left"}}]


# -- the Ray shell ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray[serve] is not installed (an extra)")
@pytest.mark.parametrize(("max_batch_size", "gathers"), [(4, 4), (1, 1), (0, 1)])
def test_serve_gathers_a_batch_as_large_and_for_as_long_as_configured(max_batch_size, gathers):
    """`batch_wait_ms: 200` reaches the shell as 0.2 s (RayEngine divides once): Serve then waits 0.2 s for a batch
    to fill, not 0.2 ms; and a batch is never larger than `max_batch_size` (at least 1)."""
    from hugginggpt.modelhost.ray_engine import replica_class

    cls = replica_class(models_per_replica=2, max_batch_size=max_batch_size, batch_wait_s=0.2, compute_threads=None)
    assert cls.batched._get_batch_wait_timeout_s() == 0.2
    assert cls.batched._get_max_batch_size() == gathers


# -- the engine and its replica shell, on a stand-in of Ray and Serve (tests/fakes/ray_serve.py) ------------------


def catalog(folder: Path) -> Path:
    """A catalog naming the module's models (what `models_server.py` passes the engine and each replica)."""
    rows = [{"id": CLF, "task": "text-classification",
             "local": {"loader": "pipeline", "level": "minimal", "pipeline_task": "text-classification", "gpu": 0.25}},
            {"id": CLF2, "task": "text-classification",
             "local": {"loader": "pipeline", "level": "minimal", "pipeline_task": "text-classification", "gpu": 0.25}},
            {"id": SD, "task": "text-to-image", "local": {"loader": "diffusers", "level": "minimal"}},
            {"id": MISSING, "task": "text-classification",
             "local": {"loader": "pipeline", "level": "minimal", "pipeline_task": "text-classification"}}]
    path = folder / "catalog.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def engine_of(models_dir: Path, tmp_path: Path, device: str = "cpu", **options):
    from hugginggpt.modelhost.ray_engine import RayEngine
    from tests.fakes.ray_serve import Ray, Serve

    cat = catalog(tmp_path)
    ray, serve = Ray(), Serve(fail_delete=options.pop("fail_delete", False))
    engine = RayEngine(Registry("minimal", models_dir, catalog_path=cat), device, cat, make_public(tmp_path / "public"),
                       ray=ray, serve=serve, **options)
    return engine, ray, serve, cat


@pytest.mark.parametrize(("max_batch_size", "ongoing"), [(1, 5), (2, 5), (3, 6), (4, 8)])
def test_the_engine_starts_ray_and_a_deployment_per_gpu_share_with_what_the_config_says(
        models_dir, tmp_path, max_batch_size, ongoing):
    engine, ray, serve, cat = engine_of(models_dir, tmp_path, "cuda:0", replicas=2, models_per_replica=3,
                                        max_pixels=123_456, max_batch_size=max_batch_size, batch_wait_ms=200)
    assert ray.calls == [("init", {"address": None, "include_dashboard": False, "log_to_driver": False,
                                   "ignore_reinit_error": True})]
    assert serve.calls[0] == ("start", {"http_options": {"location": "NoServer"}})
    kind, made = serve.calls[1]
    assert kind == "deployment" and made["max_ongoing_requests"] == ongoing  # room for a batch to gather
    cls = made["cls"]
    assert cls.batched._get_batch_wait_timeout_s() == 0.2 and cls.batched._get_max_batch_size() == max_batch_size
    assert cls.get_model.max_num_models_per_replica == 3
    runs = [call for kind, call in serve.calls if kind == "run"]
    args = ("minimal", str(models_dir), str(cat), "cuda:0", 123_456)
    assert runs == [{"options": {"max_ongoing_requests": ongoing, "name": f"models-gpu{share}", "num_replicas": 2,
                                 "ray_actor_options": {"num_cpus": 0, "num_gpus": share}},
                     "args": args, "name": f"hugginggpt-models-models-gpu{share}", "route_prefix": None}
                    for share in (0.25, 0.5)]  # one per share the catalog gives (SD 0.5, the classifiers 0.25)
    assert sorted(engine.handles) == [0.25, 0.5] and engine.device == "ray (cuda:0)"
    assert engine.app_names == ["hugginggpt-models-models-gpu0.25", "hugginggpt-models-models-gpu0.5"]
    assert engine.loaded() == {}
    serve.close()


def test_on_the_cpu_every_model_shares_one_deployment_with_no_gpu_and_a_joined_cluster_is_named(models_dir, tmp_path):
    engine, ray, serve, _ = engine_of(models_dir, tmp_path, address="ray://head:10001")
    assert ray.calls[0] == ("init", {"address": "ray://head:10001", "include_dashboard": False,
                                     "log_to_driver": False, "ignore_reinit_error": True})
    [run] = [call for kind, call in serve.calls if kind == "run"]
    assert run["options"] == {"max_ongoing_requests": 5, "name": "models-gpu0", "num_replicas": 1,
                              "ray_actor_options": {"num_cpus": 0, "num_gpus": 0.0}}
    assert list(engine.handles) == [0.0] and engine.device == "ray (cpu)"
    serve.close()


def test_an_inference_goes_from_the_front_through_the_replica_shell_to_its_model(models_dir, tmp_path):
    from hugginggpt.modelhost.batching import batch_size_var

    engine, _, serve, _ = engine_of(models_dir, tmp_path, timeout=60.0)
    try:
        model = engine.registry.get(CLF)
        body = {"text": "anna lives in berlin"}
        replica = serve_replica(engine)
        expected = alone(asyncio.run_coroutine_threadsafe(replica.work.load(CLF), serve.loop).result(60), body)
        assert engine.infer(model, Inputs(body=body, public_dir=engine.public_dir)) == expected
        with pytest.raises(ModelUnavailable, match=f"^this replica cannot serve {MISSING}$"):
            engine.infer(engine.registry.specs[MISSING], Inputs(body=body, public_dir=engine.public_dir))
        heard: list[dict] = []
        with watching(Watch(heard.append)):
            out = engine.infer(engine.registry.get(SD), Inputs(body={"text": "a red fox", "steps": 2},
                                                                 public_dir=engine.public_dir))
        assert (engine.public_dir / out["path"].lstrip("/")).is_file()  # the replica's file, written by the front
        assert heard[0] == {"phase": "loading"}
        assert [e["step"] for e in heard if "step" in e] == [1, 2]
        assert batch_size_var.get() == 1
    finally:
        serve.close()


def test_a_batching_engine_sends_a_batchable_task_through_serve_s_gathering(models_dir, tmp_path):
    from hugginggpt.modelhost.batching import batch_size_var

    engine, _, serve, _ = engine_of(models_dir, tmp_path, max_batch_size=4)
    try:
        body = {"text": "a great movie"}
        got = engine.infer(engine.registry.get(CLF2), Inputs(body=body, public_dir=engine.public_dir))
        assert close(got, alone(loaded_in(engine, serve, CLF2), body), 1e-5)
        assert batch_size_var.get() == 1  # Serve's batch, of one here: the answer says its size
        replica = serve_replica(engine)
        assert replica.work.max_batch_size == 4 and replica.work.max_pixels == 40_000_000
    finally:
        serve.close()


def serve_replica(engine):
    """The replica Serve started for the engine's (only) deployment."""
    [handle] = engine.handles.values()
    return handle.replicas[0]


def loaded_in(engine, serve, model_id: str) -> Loaded:
    return asyncio.run_coroutine_threadsafe(serve_replica(engine).get_model(model_id), serve.loop).result(60)


@pytest.mark.parametrize("joined", [False, True])
def test_closing_removes_its_applications_from_a_joined_cluster_and_always_stops_ray(models_dir, tmp_path, joined):
    engine, ray, serve, _ = engine_of(models_dir, tmp_path, "cuda:0", address="ray://head:10001" if joined else None)
    engine.close()
    deleted = [call["name"] for kind, call in serve.calls if kind == "delete"]
    assert deleted == (["hugginggpt-models-models-gpu0.25", "hugginggpt-models-models-gpu0.5"] if joined else [])
    assert ray.calls[-1] == ("shutdown", {})
    serve.close()


def test_ray_is_stopped_even_when_removing_an_application_fails(models_dir, tmp_path):
    engine, ray, serve, _ = engine_of(models_dir, tmp_path, address="ray://head:10001", fail_delete=True)
    with pytest.raises(RuntimeError, match="did not answer"):
        engine.close()
    assert ray.calls[-1] == ("shutdown", {})
    serve.close()


# -- what a user meets at the edges: pixel limits, failures in the log, a model's turn, the engine's timeout --------


def data_uri(width: int, height: int) -> str:
    import base64

    from PIL import Image

    out = BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_an_image_past_the_replica_s_pixel_limit_is_refused_alone_and_in_a_batch(models_dir, loaded):
    replica = replica_of(models_dir, 8, max_pixels=2_000)
    big, small = {"img_url": data_uri(50, 50)}, {"img_url": data_uri(40, 40)}  # 2,500 and 1,600 pixels
    refused = {"error": {"kind": "bad_request",
                         "message": "`img_url` is 50x50 pixels; at most 2,000 pixels are accepted"}}
    assert replica.run(loaded[IMG], big) == refused
    assert replica.run(loaded[IMG], small) == {"result": alone(loaded[IMG], small), "files": {}}
    answers = replica.run_batch(loaded[IMG], [big, small, {"img_url": "/examples/red.png"}])
    assert answers[0] == refused
    assert close(answers[1], {"result": alone(loaded[IMG], small), "files": {}, "batch": 3}, 1e-5)
    # a path (the front sends data URIs) names no file a replica serves: that request alone is refused
    assert answers[2] == {"error": {"kind": "bad_request", "message": "file not found: '/examples/red.png' (paths are "
                                                                      "relative to public/, e.g. /examples/a.jpg)"}}


def test_a_model_s_failure_is_in_the_replica_s_log_with_its_model(models_dir, loaded, caplog):
    replica = replica_of(models_dir, 8)
    with caplog.at_level(logging.ERROR, logger="hugginggpt.modelhost.ray_engine"):
        replica.run(loaded[CLF], {"text": LONG})
        replica.run_batch(loaded[CLF2], [{"text": LONG}])
    alone_record, batch_record = caplog.records
    assert alone_record.getMessage() == f"inference with {CLF} failed" and alone_record.exc_info
    assert batch_record.getMessage().startswith(f"inference with {CLF2} failed: The size of tensor a (402)")


def test_a_model_s_long_failure_in_a_batch_is_cut_to_300_characters(models_dir, loaded):
    class Failing:
        def __call__(self, *args, **kwargs):
            raise RuntimeError("x" * 299 + "yz" + "w" * 100)

    broken = Loaded(loaded[CLF].spec, Failing(), "cpu", 0, 0.0)
    [answer] = replica_of(models_dir, 8).run_batch(broken, [{"text": "hello"}])
    assert answer == {"error": {"kind": "failed", "message": "RuntimeError: " + "x" * 299 + "y"}}


def test_a_second_request_of_a_running_model_hears_that_it_waits_for_that_model(models_dir, loaded):
    replica = replica_of(models_dir, compute=Compute(2))
    get_model, _ = held(loaded)
    loaded[SD]
    heard: list[dict] = []

    async def scenario():
        first = asyncio.ensure_future(replica.dispatch(SD, {"text": "a red fox", "steps": 8}, get_model,
                                                       never_batched))
        for _ in range(200):
            if replica.locks.get(SD) is not None and replica.locks[SD].locked():
                break
            await asyncio.sleep(0.01)
        with watching(Watch(heard.append)):
            second = await replica.dispatch(SD, {"text": "a cat", "steps": 1}, get_model, never_batched)
        return await first, second

    first, second = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert "path" in first["result"] and "path" in second["result"]
    assert heard[0] == {"phase": "queued", "waiting": f"{SD} is running another request"}


def test_the_engine_s_defaults_and_its_start_line(models_dir, tmp_path, caplog):
    from hugginggpt.modelhost.compute import default_threads

    with caplog.at_level(logging.INFO, logger="hugginggpt.modelhost.ray_engine"):
        engine, _, serve, _ = engine_of(models_dir, tmp_path)
    try:
        assert "Ray Serve: 1 deployment(s), 1 replica(s) each, 3 models per replica" in caplog.messages
        [made] = [call for kind, call in serve.calls if kind == "deployment"]
        assert made["cls"].get_model.max_num_models_per_replica == 3
        assert made["cls"].batched._get_max_batch_size() == 1
        assert made["cls"].batched._get_batch_wait_timeout_s() == 0.005
        assert engine.timeout == 300.0
        [run] = [call for kind, call in serve.calls if kind == "run"]
        assert run["args"][-1] == 40_000_000  # max_pixels
        replica = serve_replica(engine)
        assert replica.work.compute.threads == default_threads("cpu") and replica.work.max_batch_size == 1
        assert replica.work.device == "cpu" and replica.work.max_pixels == 40_000_000
    finally:
        serve.close()


def test_a_replica_s_compute_threads_are_the_configured_count_or_its_device_s_default(models_dir, tmp_path, caplog):
    from hugginggpt.modelhost.compute import default_threads

    with caplog.at_level(logging.INFO, logger="hugginggpt.modelhost.ray_engine"):
        engine, _, serve, _ = engine_of(models_dir, tmp_path, "cuda:0", replicas=2)
    assert "Ray Serve: 2 deployment(s), 2 replica(s) each, 3 models per replica" in caplog.messages
    assert {replica.work.compute.threads for handle in engine.handles.values() for replica in handle.replicas} == {
        default_threads("cuda:0")}
    assert default_threads("cuda:0") != default_threads("cpu")
    serve.close()
    (tmp_path / "two").mkdir()
    engine, _, serve, _ = engine_of(models_dir, tmp_path / "two", compute_threads=2)
    assert serve_replica(engine).work.compute.threads == 2
    serve.close()


@pytest.mark.parametrize("watched", [False, True])
def test_a_call_past_the_engine_s_timeout_fails_with_task_timeout_in_its_message(models_dir, tmp_path, watched):
    engine, _, serve, _ = engine_of(models_dir, tmp_path, timeout=0.3)
    try:
        loaded_in(engine, serve, SD)
        inputs = Inputs(body={"text": "a red fox", "steps": 150}, public_dir=engine.public_dir)
        started = time.monotonic()
        with pytest.raises(InferenceFailed) as err:
            if watched:
                with watching(Watch(lambda event: None)):
                    engine.infer(engine.registry.get(SD), inputs)
            else:
                engine.infer(engine.registry.get(SD), inputs)
        assert str(err.value) == "its replica gave no answer within 0.3 s (task_timeout)"
        assert time.monotonic() - started < 5
        # the run the front gave up on keeps its model until it ends (stopped at its next step when watched): the
        # model is free again afterwards, and no diffusion runs on when the test process exits
        locks = serve_replica(engine).work.locks
        wait_until(lambda: not locks[SD].locked(), 120, "the model given back after the late run")
    finally:
        serve.close()


def test_an_unbatched_answer_says_a_batch_of_one(models_dir, tmp_path):
    from hugginggpt.modelhost.batching import batch_size_var

    engine, _, serve, _ = engine_of(models_dir, tmp_path)
    try:
        batch_size_var.set(7)
        engine.infer(engine.registry.get(CLF), Inputs(body={"text": "good dog"}, public_dir=engine.public_dir))
        assert batch_size_var.get() == 1
        for _ in range(2):  # a second file into the same folder of public/
            out = engine.infer(engine.registry.get(SD), Inputs(body={"text": "a fox", "steps": 1},
                                                                 public_dir=engine.public_dir))
            assert (engine.public_dir / out["path"].removeprefix("/")).is_file()
    finally:
        serve.close()
