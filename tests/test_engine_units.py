"""`LocalEngine` (hugginggpt/modelhost/engine.py) in-process, on the real pool, batcher and handlers.

Tiny random-weight BERT text classifiers are saved under two catalog ids of one task (text-classification, batchable)
and served by a `ModelPool(Registry("full", models_dir), "cpu")`. Covered: a request runs alone without a batcher
or with one of max_size 1 (and reports a batch of 1); the engine answers the pool's registry, device, loaded models
and memory; concurrent requests share batches and each gets the answer of its own text (as one run alone gives it)
and of its own model; a bad input is refused at once, before it joins a batch or waits for the model, while the
others answer. Concurrency is made certain, not timed: the test holds the model (`pool.use`) until every request
says, through its own progress watch, that it is queued.

Not covered: the out-of-memory branch of `infer` (`is_out_of_memory` -> `pool.out_of_memory(spec)`). On the CPU no
real run raises torch's CUDA OutOfMemoryError (nor an error saying "CUDA out of memory"); triggering it would take
patching the pipeline or torch. tests/test_batching_units.py covers it with a stand-in pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hugginggpt.errors import BadRequest
from hugginggpt.modelhost import progress
from hugginggpt.modelhost.batching import Batcher, batch_size_var
from hugginggpt.modelhost.engine import LocalEngine
from hugginggpt.modelhost.handlers import Inputs
from hugginggpt.modelhost.pool import ModelPool
from hugginggpt.modelhost.registry import ModelSpec, Registry
from tests.conftest import make_public
from tests.tiny_models import bert_config, bert_tokenizer, close, words_tokenizer

MODEL = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"  # NEGATIVE / POSITIVE
OTHER = "cardiffnlp/twitter-roberta-base-sentiment-latest"  # the catalog's other text classifier
OTHER_LABELS = ["negative", "neutral", "positive"]
TEXTS = ["a great movie", "bad", "the cat sits on the mat", "anna lives in berlin", "hello world !",
         "w1 w2 w3 w4 w5", "where is the red fox ?", "good dog"]


def classifier(folder: Path, labels: list[str], seed: int) -> None:
    """A tiny BERT text classifier (tiny_models' config and vocabulary) whose weights are drawn wide enough that
    different texts get clearly different answers (tiny_models.text_classifier says 0.5031 POSITIVE of every text)."""
    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(seed)
    bert_tokenizer(folder)
    words_tokenizer(folder)
    BertForSequenceClassification(bert_config(num_labels=len(labels), initializer_range=0.5,
                                              id2label=dict(enumerate(labels)),
                                              label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, Path]:
    """(models folder, public folder), the models built once for the module."""
    folder = tmp_path_factory.mktemp("engine")
    models = folder / "models"
    classifier(models / MODEL, ["NEGATIVE", "POSITIVE"], seed=0)
    classifier(models / OTHER, OTHER_LABELS, seed=1)
    return models, make_public(folder / "public")


@pytest.fixture(scope="module")
def alone(site) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """What each model says of each text, one text at a time, straight from a transformers pipeline."""
    from transformers import pipeline

    models, _ = site
    out = {}
    for model_id in (MODEL, OTHER):
        pipe = pipeline("text-classification", model=str(models / model_id), device="cpu")
        for text in TEXTS:
            out[model_id, text] = [{"label": r["label"], "score": float(r["score"])} for r in pipe(text)]
    return out


def new_pool(site) -> ModelPool:
    return ModelPool(Registry("full", site[0]), "cpu")


def same(a: Any, b: Any) -> bool:
    """One classifier answer equal to another: labels exactly, scores within 1e-5."""
    return isinstance(a, list) and all(isinstance(x, dict) and x.keys() == {"label", "score"} for x in a) and close(a, b, 1e-5)


def infer_in_new_context(engine: LocalEngine, spec: ModelSpec, body: dict, public: Path) -> tuple[Any, int | None]:
    """One request in a context of its own (as a server's request has): (its result, the batch size it reports)."""

    def call() -> tuple[Any, int | None]:
        assert batch_size_var.get() is None
        result = engine.infer(spec, Inputs(body=body, public_dir=public))
        return result, batch_size_var.get()

    return contextvars.Context().run(call)


def concurrently(engine: LocalEngine, pool: ModelPool, requests: list[tuple[ModelSpec, dict]], public: Path,
                 queued: int) -> tuple[list[tuple[Any, int | None]], set[int]]:
    """Each (spec, body) from its own thread, all started at once while the test holds their models (pool.use),
    until `queued` of them say so through their own progress watch; then the models are let go.

    Returns, per request, (its result or its exception, the batch size read in its thread right after), and the
    requests that had ended while the models were held."""
    out: list[tuple[Any, int | None] | None] = [None] * len(requests)
    changed = threading.Condition()
    waiting = [0]
    gate = threading.Barrier(len(requests))

    def call(k: int) -> None:
        spec, body = requests[k]
        said: list[dict] = []

        def send(event: dict) -> None:
            if event.get("phase") == progress.QUEUED and not said:
                said.append(event)
                with changed:
                    waiting[0] += 1
                    changed.notify_all()

        gate.wait()
        with progress.watching(progress.Watch(send)):
            try:
                result: Any = engine.infer(spec, Inputs(body=body, public_dir=public))
            except Exception as exc:  # noqa: BLE001 - that caller's answer
                result = exc
        out[k] = (result, batch_size_var.get())
        with changed:
            changed.notify_all()

    threads = [threading.Thread(target=call, args=(k,), daemon=True) for k in range(len(requests))]
    try:
        with contextlib.ExitStack() as held:
            for spec in {spec.id: spec for spec, _ in requests}.values():
                held.enter_context(pool.use(spec))  # loads it first, in this thread
            [t.start() for t in threads]
            deadline = time.monotonic() + 30
            with changed:
                while waiting[0] + sum(o is not None for o in out) < len(requests) and time.monotonic() < deadline:
                    changed.wait(deadline - time.monotonic())
                ended_while_held = {k for k, o in enumerate(out) if o is not None}
                queued_while_held = waiting[0]
    finally:  # the models are let go: every request ends, whatever was asserted
        [t.join(30) for t in threads if t.is_alive()]
    assert queued_while_held == queued, f"{queued_while_held} requests queued for the held models, not {queued}"
    assert all(o is not None for o in out), "a request never got an answer"
    return out, ended_while_held  # type: ignore[return-value]


def assert_sizes_are_whole_batches(sizes: list[int | None]) -> None:
    """Every caller of a batch of n reports n: n callers (or a multiple, for several batches of n) report n."""
    assert all(isinstance(s, int) and s >= 1 for s in sizes), sizes
    assert all(sizes.count(s) % s == 0 for s in set(sizes)), sizes


@pytest.mark.parametrize("batcher", [None, Batcher(max_size=1, wait_s=0.3)], ids=["no batcher", "max_size 1"])
def test_without_a_batcher_a_request_runs_alone_and_says_so(site, alone, batcher):
    models, public = site
    pool = new_pool(site)
    engine = LocalEngine(pool, batcher)
    assert engine.batcher is None
    spec = pool.registry.get(MODEL)
    for text in TEXTS[:2]:
        result, size = infer_in_new_context(engine, spec, {"text": text}, public)
        assert len(result) == 1 and result[0]["label"] in {"NEGATIVE", "POSITIVE"} and 0 <= result[0]["score"] <= 1
        assert same(result, alone[MODEL, text]), (result, alone[MODEL, text])
        assert size == 1


def test_the_engine_answers_for_its_pool(site):
    _, public = site
    pool = new_pool(site)
    engine = LocalEngine(pool, Batcher(max_size=8, wait_s=0.3))
    assert engine.registry is pool.registry
    assert engine.device == pool.device == "cpu"
    assert engine.loaded() == {} and engine.memory()["models_bytes"] == 0
    infer_in_new_context(engine, pool.registry.get(MODEL), {"text": "good dog"}, public)
    assert set(engine.loaded()) == {MODEL}
    assert engine.loaded()[MODEL] is pool.loaded()[MODEL]
    assert engine.memory().keys() == pool.memory().keys()
    assert engine.memory()["models_bytes"] == pool.memory()["models_bytes"] == pool.loaded()[MODEL].nbytes > 0


def test_the_texts_give_different_answers(alone):
    """What the batching tests below rely on: an answer handed to the wrong caller would not pass as its own."""
    answers = [alone[MODEL, t] for t in TEXTS]
    assert not any(same(a, b) for k, a in enumerate(answers) for b in answers[k + 1:]), answers


def test_concurrent_requests_share_batches_and_each_gets_its_own_answer(site, alone):
    _, public = site
    pool = new_pool(site)
    engine = LocalEngine(pool, Batcher(max_size=8, wait_s=0.3))
    assert engine.batcher is not None
    spec = pool.registry.get(MODEL)
    out, ended_while_held = concurrently(engine, pool, [(spec, {"text": t}) for t in TEXTS], public,
                                         queued=len(TEXTS))
    assert ended_while_held == set()
    for text, (result, _) in zip(TEXTS, out, strict=True):
        assert same(result, alone[MODEL, text]), (text, result, alone[MODEL, text])
    sizes = [size for _, size in out]
    assert_sizes_are_whole_batches(sizes)
    assert max(sizes) > 1, sizes


def test_two_models_of_one_task_each_answer_their_own_requests(site, alone):
    _, public = site
    pool = new_pool(site)
    engine = LocalEngine(pool, Batcher(max_size=8, wait_s=0.3))
    specs = [pool.registry.get(MODEL), pool.registry.get(OTHER)]
    assert specs[0].task == specs[1].task == "text-classification"
    requests = [(specs[k % 2], {"text": t}) for k, t in enumerate(TEXTS)]
    out, _ = concurrently(engine, pool, requests, public, queued=len(TEXTS))
    for (spec, body), (result, _) in zip(requests, out, strict=True):
        assert same(result, alone[spec.id, body["text"]]), (spec.id, body, result)
    sizes = [size for _, size in out]
    assert_sizes_are_whole_batches(sizes)
    assert max(sizes) <= len(TEXTS) // 2, sizes  # a batch holds one model's requests


def test_a_bad_input_is_refused_at_once_and_the_others_answer(site, alone):
    """A body without `text`, or with a number for it, is a BadRequest in its own caller's thread, before it
    joins a batch: it is refused while the model is still busy, and no batch counts it."""
    _, public = site
    pool = new_pool(site)
    engine = LocalEngine(pool, Batcher(max_size=8, wait_s=0.3))
    spec = pool.registry.get(MODEL)
    good = TEXTS[:6]
    bodies = [{"text": good[0]}, {"txt": "typo"}, *({"text": t} for t in good[1:4]), {"text": 5},
              *({"text": t} for t in good[4:])]
    out, ended_while_held = concurrently(engine, pool, [(spec, b) for b in bodies], public, queued=len(good))
    bad = {k for k, b in enumerate(bodies) if not isinstance(b.get("text"), str)}
    assert ended_while_held == bad
    for k in bad:
        error, _ = out[k]
        assert isinstance(error, BadRequest), error
        assert "`text` is required and must be a non-empty string" in str(error)
    answers = [out[k] for k in range(len(bodies)) if k not in bad]
    for text, (result, _) in zip(good, answers, strict=True):
        assert same(result, alone[MODEL, text]), (text, result)
    sizes = [size for _, size in answers]
    assert_sizes_are_whole_batches(sizes)
    assert max(sizes) > 1, sizes


def test_a_batch_of_two_is_a_batch(site):
    """max_batch_size: 2 batches (only 1 turns batching off)."""
    batcher = Batcher(max_size=2, wait_s=0.3)
    assert LocalEngine(new_pool(site), batcher).batcher is batcher
