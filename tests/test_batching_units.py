"""Dynamic batching with plain data (batching.py), and each batchable task's batch run against its handler."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest

from hugginggpt.errors import BadRequest
from hugginggpt.modelhost.batching import Batcher, each_or_batch
from hugginggpt.modelhost.compute import Compute
from hugginggpt.modelhost.handlers import BATCHABLE, Inputs, handle
from hugginggpt.modelhost.pool import ModelPool
from hugginggpt.modelhost.registry import ModelSpec, Registry
from tests.conftest import make_public
from tests.tiny_models import (
    close,
    image_captioner,
    image_classifier,
    text_classifier,
    token_classifier,
    words_tokenizer,
)


def submit_all(batcher: Batcher, items: list, run, key="m") -> list:
    """Every item from its own thread, all released at once; returns (ok, value, batch size) per item."""
    out: list = [None] * len(items)
    gate = threading.Barrier(len(items))

    def call(k: int) -> None:
        gate.wait()
        try:
            value, size = batcher.submit(key, items[k], run)
            out[k] = (True, value, size)
        except Exception as exc:  # noqa: BLE001
            out[k] = (False, exc, None)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(items))]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert all(o is not None for o in out), "a caller never got an answer"
    return out


def until_gathered(batcher: Batcher, key: str, n: int) -> None:
    """Hold the running batch until `n` callers wait in the key's open one (they gather while the model is busy)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        k = batcher._keys.get(key)
        if k is not None and k.open is not None and len(k.open.items) >= n:
            return
        time.sleep(0.005)
    raise AssertionError(f"{n} callers never gathered")


def with_company(batcher: Batcher, key: str = "m") -> list[int]:
    """Run the key's first batches with company: the first caller runs alone while two more gather behind it.
    Returns the sizes of the batches that ran (a key that has seen company waits for more next time)."""
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        if not sizes:
            until_gathered(batcher, key, 2)
        sizes.append(len(items))
        return items

    submit_all(batcher, [0, 1, 2], run, key=key)
    return sizes


def test_concurrent_calls_share_a_batch_and_each_gets_its_own_result():
    batcher = Batcher(max_size=8, wait_s=5.0)
    batches: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        if not batches:  # the first caller runs at once; the seven others gather meanwhile
            until_gathered(batcher, "m", 7)
        batches.append(list(items))
        return [x * 10 for x in items]

    out = submit_all(batcher, list(range(8)), run)
    assert [value for _, value, _ in out] == [x * 10 for x in range(8)]
    assert sorted(len(b) for b in batches) == [1, 7]
    assert sorted(size for *_, size in out) == [1] + [7] * 7


def test_batches_hold_at_most_max_size():
    """Eight callers gather while the first runs; with max_size 3 they leave in batches of at most three."""
    batcher = Batcher(max_size=3, wait_s=0.05)
    sizes: list[int] = []

    def run(items: list[int]) -> list[int]:
        if not sizes:  # hold the first until every other caller has joined a batch
            deadline = time.monotonic() + 20
            while batcher._keys["m"].users < 8 and time.monotonic() < deadline:
                time.sleep(0.005)
        sizes.append(len(items))
        return [x + 100 for x in items]

    out = submit_all(batcher, list(range(8)), run)
    assert [value for _, value, _ in out] == [x + 100 for x in range(8)]
    assert sorted(sizes) == [1, 1, 3, 3], sizes


def test_keys_never_share_a_batch():
    seen: list[tuple[str, int]] = []

    def run_for(key: str):
        def run(items: list[str]) -> list[str]:
            seen.append((key, len(items)))
            assert all(item.startswith(key) for item in items)
            return [item.upper() for item in items]
        return run

    batcher = Batcher(max_size=4, wait_s=0.2)
    results: dict[str, list] = {}

    def burst(key: str) -> None:
        results[key] = submit_all(batcher, [f"{key}{k}" for k in range(7)], run_for(key), key=key)

    threads = [threading.Thread(target=burst, args=(key,)) for key in ("a", "b")]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    for key in ("a", "b"):
        assert [value for _, value, _ in results[key]] == [f"{key.upper()}{k}" for k in range(7)]
        assert sum(n for k, n in seen if k == key) == 7


def test_a_lone_caller_does_not_wait_for_company():
    """One caller at a time runs at once: with an hour's wait configured the calls still return (each would hang
    for the hour if it waited)."""
    batcher = Batcher(max_size=8, wait_s=3600)
    done: list = []

    def calls() -> None:
        for k in range(3):
            done.append(batcher.submit("m", k, lambda items: items))

    thread = threading.Thread(target=calls, daemon=True)
    thread.start()
    thread.join(20)
    assert done == [(0, 1), (1, 1), (2, 1)]


def test_after_a_batch_with_company_an_idle_model_waits_for_more():
    """Callers that arrive one after another, a little apart, share a batch once the key has seen company."""
    batcher = Batcher(max_size=3, wait_s=3600)
    assert with_company(batcher) == [1, 2]  # the key has seen company
    out: list = []
    threads = []
    for k in range(3):  # 50 ms apart: without the wait each would run alone
        threads.append(threading.Thread(target=lambda k=k: out.append(batcher.submit("m", k, lambda items: items))))
        threads[-1].start()
        time.sleep(0.05)
    [t.join(20) for t in threads]
    assert sorted(out) == [(0, 3), (1, 3), (2, 3)]


def test_a_bad_item_fails_only_its_caller():
    """The model raises on a batch holding a bad item; the batch is run again one item at a time."""
    calls: list[list[int]] = []

    def model(items: list[int]) -> list[int]:
        calls.append(list(items))
        if any(x < 0 for x in items):
            raise ValueError("negative input")
        return [x + 1 for x in items]

    batcher = Batcher(max_size=8, wait_s=5.0)

    def run(items: list[int]) -> list[int]:
        if not calls:
            until_gathered(batcher, "m", 4)
        return each_or_batch(model, items)

    out = submit_all(batcher, [0, 1, 2, -3, 4], run)
    assert [o[:2] for o in out if o[0]] == [(True, 1), (True, 2), (True, 3), (True, 5)]
    assert not out[3][0] and isinstance(out[3][1], ValueError)
    assert sorted(len(c) for c in calls) == [1, 1, 1, 1, 1, 4]  # alone, the batch of four, its four again alone


def test_a_batch_that_fails_as_a_whole_fails_every_caller():
    def run(items: list[int]) -> list[int]:
        raise RuntimeError("the model could not load")

    out = submit_all(Batcher(max_size=4, wait_s=5.0), [1, 2, 3, 4], run)
    assert all(not ok and "could not load" in str(exc) for ok, exc, _ in out) and len(out) == 4


def test_each_or_batch_keeps_results_that_are_exceptions():
    assert each_or_batch(lambda items: [x if x else ValueError("zero") for x in items], [1, 0])[0] == 1
    one = each_or_batch(lambda items: 1 / 0, [5])
    assert isinstance(one[0], ZeroDivisionError)


def test_a_failed_batch_is_run_again_item_by_item_and_says_why_in_the_log(caplog):
    calls: list[list[int]] = []

    def model(items: list[int]) -> list[int]:
        calls.append(list(items))
        if len(items) > 1:
            raise ValueError("out of memory " + "x" * 300)
        if items == [2]:
            raise KeyError("two")
        return [10 * items[0]]

    with caplog.at_level(logging.INFO, logger="hugginggpt.modelhost.batching"):
        results = each_or_batch(model, [1, 2, 3])
    assert results[0] == 10 and isinstance(results[1], KeyError) and results[2] == 30
    assert calls == [[1, 2, 3], [1], [2], [3]]
    assert caplog.messages == ["a batch of 3 failed (ValueError: " + ("out of memory " + "x" * 300)[:200]
                               + "); running its items one at a time"]


def test_a_batch_that_answers_the_wrong_number_of_results_is_run_item_by_item(caplog):
    calls: list[list[int]] = []

    def short(items: list[int]) -> list[int]:
        calls.append(list(items))
        return items[:1]  # a model that drops results: each must still get its own

    with caplog.at_level(logging.INFO, logger="hugginggpt.modelhost.batching"):
        assert each_or_batch(short, [4, 5]) == [4, 5]
    assert calls == [[4, 5], [4], [5]]
    assert caplog.messages == ["a batch of 2 failed (RuntimeError: a batch of 2 gave 1 results); running its items "
                               "one at a time"]


def test_a_lone_item_that_fails_is_not_run_twice(caplog):
    calls: list[list[int]] = []

    def model(items: list[int]) -> list[int]:
        calls.append(list(items))
        raise ValueError("bad input")

    with caplog.at_level(logging.INFO, logger="hugginggpt.modelhost.batching"):
        [result] = each_or_batch(model, [7])
    assert isinstance(result, ValueError) and calls == [[7]] and caplog.messages == []


def test_batcher_refuses_nonsense_settings():
    for max_size, wait_s in ((0, 0.01), (4, -1)):
        with pytest.raises(ValueError) as refused:
            Batcher(max_size=max_size, wait_s=wait_s)
        assert str(refused.value) == "max_size must be at least 1 and wait_s at least 0"
    # the edges are allowed: batch_wait_ms 0 (never wait for company) and a batch of one (no batching)
    assert submit_all(Batcher(max_size=4, wait_s=0), [1, 2], lambda items: items)[0][0] is True
    assert Batcher(max_size=1, wait_s=0).submit("m", 5, lambda items: items) == (5, 1)


# -- each batchable task: a batch gives what the handler gives one input at a time -------------------------------


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    folder = tmp_path_factory.mktemp("batch-models")
    builders = {"t/cls": text_classifier, "t/ner": token_classifier, "t/img": image_classifier,
                "t/cap": image_captioner}
    for mid, build in builders.items():
        build(folder / mid)
        if mid != "t/img":
            words_tokenizer(folder / mid)
    specs = (ModelSpec("t/cls", "text-classification", "pipeline", "minimal", "text-classification"),
             ModelSpec("t/ner", "token-classification", "pipeline", "minimal", "token-classification"),
             ModelSpec("t/img", "image-classification", "pipeline", "minimal", "image-classification"),
             ModelSpec("t/cap", "image-to-text", "vision2seq", "minimal"),
             ModelSpec("sentence-transformers/all-MiniLM-L6-v2", "sentence-similarity", "sentence-embedding",
                       "minimal"))
    public = make_public(folder / "public")
    from PIL import Image

    for k, colour in enumerate([(250, 250, 250), (0, 0, 255), (20, 120, 40)]):
        Image.new("RGB", (30 + 10 * k, 50), colour).save(public / "examples" / f"c{k}.png")
    return ModelPool(Registry("minimal", folder, specs), "cpu"), public


TEXTS = ["a great movie", "anna lives in berlin", "the cat sits on the mat in paris .", "bad", "w1 w2 w3 w4 w5 w6"]
BODIES = {
    "t/cls": [{"text": t} for t in TEXTS],
    "t/ner": [{"text": t} for t in TEXTS],
    "t/img": [{"img_url": f"/examples/{n}"} for n in ("red.png", "green.jpg", "c0.png", "c1.png", "c2.png")],
    "t/cap": [{"img_url": f"/examples/{n}"} for n in ("red.png", "green.jpg", "c0.png", "c1.png", "c2.png")],
    "sentence-transformers/all-MiniLM-L6-v2": [{"text": a, "text2": b} for a, b in
                                               zip(TEXTS, TEXTS[1:] + ["a man plays the guitar"], strict=True)],
}


@pytest.mark.parametrize("model_id", list(BODIES))
def test_a_batch_answers_what_each_request_gets_alone(pool, model_id):
    pool, public = pool
    spec = pool.registry.get(model_id)
    batchable = BATCHABLE[spec.task]
    inputs = [Inputs(body=body, public_dir=public) for body in BODIES[model_id]]
    with pool.use(spec) as loaded:
        if spec.task == "image-to-text":  # the random captioner says [CLS] for ever: louder weights, varied words
            import torch

            torch.manual_seed(1)
            with torch.no_grad():
                for name, param in loaded.obj[2].named_parameters():
                    if "ln" not in name and "norm" not in name:
                        param.normal_(0, 0.3)
        alone = [handle(spec.task, loaded, i) for i in inputs]
        together = batchable.run(loaded, [batchable.prepare(i) for i in inputs])
    assert close(together, alone, 1e-6), (together, alone)
    # every input gives its own answer, so an answer given to the wrong caller would not pass as close
    assert not any(close(a, b, 1e-6) for k, a in enumerate(alone) for b in alone[k + 1:]), alone
    with pytest.raises(BadRequest):
        batchable.prepare(Inputs(body={"txt": "typo"}, public_dir=Path(public)))


def test_a_partly_filled_batch_waits_at_most_wait_s_for_company():
    """After a batch with company, a caller alone waits batch_wait_ms (here 50 ms) for more, then runs: the wait
    is seconds as given, measured on one clock, and ends however few came."""
    batcher = Batcher(max_size=8, wait_s=0.05)
    assert with_company(batcher) == [1, 2]  # company seen: the next caller alone waits for more
    started = time.monotonic()
    assert batcher.submit("m", 7, lambda items: items) == (7, 1)
    waited = time.monotonic() - started
    assert 0.04 <= waited < 1.0, waited  # its 50 ms, not nothing and not 50 s


def test_callers_behind_a_running_batch_hear_why_they_wait():
    """While a batch of the model runs, the next caller leads the next batch and hears that it waits behind one;
    a caller that joins that batch hears it is in a batch with other requests."""
    from hugginggpt.modelhost.progress import Watch, watching

    batcher = Batcher(max_size=4, wait_s=0)
    entered, release = threading.Event(), threading.Event()

    def run(items):
        entered.set()
        release.wait(10)
        return items

    heard: dict[str, list[dict]] = {"leader": [], "joined": []}

    def watched(name: str, item: int) -> None:
        with watching(Watch(heard[name].append)):
            batcher.submit("m", item, run)

    threads = [threading.Thread(target=batcher.submit, args=("m", 1, run))]
    threads[0].start()
    assert entered.wait(10)
    threads.append(threading.Thread(target=watched, args=("leader", 2)))
    threads[-1].start()
    until_gathered(batcher, "m", 1)
    threads.append(threading.Thread(target=watched, args=("joined", 3)))
    threads[-1].start()
    until_gathered(batcher, "m", 2)
    release.set()
    for thread in threads:
        thread.join(10)
    assert heard["leader"][0] == {"phase": "queued", "waiting": "behind a batch of this model"}
    assert heard["joined"][0] == {"phase": "queued", "waiting": "in a batch with other requests for this model"}


def test_callers_who_left_before_their_batch_ran_are_not_run_and_the_others_are():
    """Behind a running batch, a leader and two joiners gather; the leader's client and one joiner's leave. The
    batch then runs the one item still wanted, alone, and those who left hear Cancelled: no one else fails."""
    from hugginggpt.cancel import Cancelled
    from hugginggpt.modelhost.progress import Watch, watching

    batcher = Batcher(max_size=4, wait_s=0)
    entered, release = threading.Event(), threading.Event()
    ran: list[list[int]] = []

    def run(items):
        ran.append(list(items))
        entered.set()
        release.wait(10)
        return [i * 10 for i in items]

    watches = {n: Watch(lambda event: None) for n in (2, 3, 4)}
    out: dict[int, object] = {}

    def watched(item: int) -> None:
        with watching(watches[item]):
            try:
                out[item] = batcher.submit("m", item, run)
            except Cancelled as exc:
                out[item] = exc

    threads = [threading.Thread(target=batcher.submit, args=("m", 1, run))]
    threads[0].start()
    assert entered.wait(10)
    for n in (2, 3, 4):
        threads.append(threading.Thread(target=watched, args=(n,)))
        threads[-1].start()
        until_gathered(batcher, "m", n - 1)
    watches[2].stop()  # the leader's client left
    watches[4].stop()
    release.set()
    for thread in threads:
        thread.join(10)
    assert ran == [[1], [3]]
    assert out[3] == (30, 1)  # run alone: the batch held one caller still there
    assert isinstance(out[2], Cancelled) and isinstance(out[4], Cancelled)


def test_a_queued_call_whose_client_left_leaves_the_queue_at_once():
    from hugginggpt.cancel import Cancelled
    from hugginggpt.modelhost.progress import Watch, waiting_for, watching

    lock = threading.Lock()
    lock.acquire()  # another call holds the model
    watch = Watch(lambda event: None)
    threading.Timer(0.2, watch.stop).start()
    started = time.monotonic()
    with watching(watch), pytest.raises(Cancelled):
        with waiting_for(lock, "behind another request"):
            pass
    assert time.monotonic() - started < 2  # not for as long as the other call holds the model
    with watching(Watch(lambda event: None)):
        threading.Timer(0.2, lock.release).start()
        with waiting_for(lock, "behind another request"):  # a caller still there gets the model
            pass


def test_a_batch_with_too_few_results_fails_each_of_its_callers_saying_so():
    out = submit_all(Batcher(max_size=2, wait_s=1.0), [1, 2], lambda items: items[1:])  # one result short
    assert [ok for ok, _, _ in out] == [False, False]
    for _, exc, _ in out:
        given = re.fullmatch(r"a batch of (\d) gave (\d) results", str(exc))
        assert given and int(given[2]) == int(given[1]) - 1, exc


def test_a_batch_interrupted_by_a_base_exception_frees_every_caller():
    """A KeyboardInterrupt-like exception ends the leading caller; the callers in its batch are told, never left
    waiting."""

    class Stop(BaseException):
        pass

    batcher = Batcher(max_size=4, wait_s=0)
    entered, release = threading.Event(), threading.Event()
    got: dict[str, BaseException | object] = {}

    def first_run(items):
        entered.set()
        release.wait(10)
        return items

    def interrupted(items):
        raise Stop()

    def call(name: str, item: int, run) -> None:
        try:
            got[name] = batcher.submit("m", item, run)
        except BaseException as exc:  # noqa: BLE001 - what each caller got
            got[name] = exc

    threads = [threading.Thread(target=call, args=("first", 1, first_run))]
    threads[0].start()
    assert entered.wait(10)
    threads.append(threading.Thread(target=call, args=("leader", 2, interrupted)))
    threads[-1].start()
    until_gathered(batcher, "m", 1)
    threads.append(threading.Thread(target=call, args=("joined", 3, interrupted)))
    threads[-1].start()
    until_gathered(batcher, "m", 2)
    release.set()
    for thread in threads:
        thread.join(10)
    assert got["first"] == (1, 1)
    assert isinstance(got["leader"], Stop)
    assert isinstance(got["joined"], RuntimeError) and str(got["joined"]) == "the batch was interrupted"


def test_idle_models_are_forgotten_once_the_remembered_keys_are_full(monkeypatch):
    """MAX_KEYS keys are remembered (each for its last batch's size); a new key past them forgets the idle ones,
    and a key is idle once every caller of it has its answer, however many came at once."""
    import hugginggpt.modelhost.batching as batching

    monkeypatch.setattr(batching, "MAX_KEYS", 2)
    batcher = Batcher(max_size=4, wait_s=0)

    def slow(items):
        time.sleep(0.2)  # both callers of "a" are inside submit at once
        return items

    assert [value for _, value, _ in submit_all(batcher, [1, 2], slow, key="a")] == [1, 2]
    assert batcher.submit("b", 3, lambda items: items) == (3, 1)
    assert sorted(batcher._keys) == ["a", "b"]  # two keys: none forgotten yet
    assert batcher.submit("c", 4, lambda items: items) == (4, 1)
    assert sorted(batcher._keys) == ["c"]  # the third: "a" and "b" were idle, and forgotten


def test_past_the_remembered_keys_a_running_model_is_never_forgotten(monkeypatch):
    """Idle keys are forgotten past MAX_KEYS; a key whose batch is running is not, so a new caller of that model
    waits for it instead of starting a second batch of the same model at once."""
    import hugginggpt.modelhost.batching as batching

    monkeypatch.setattr(batching, "MAX_KEYS", 2)
    batcher = Batcher(max_size=4, wait_s=0)
    running, peak = [0], [0]
    entered, release = threading.Event(), threading.Event()

    def run_a(items):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        entered.set()
        release.wait(10)
        running[0] -= 1
        return items

    first = threading.Thread(target=lambda: batcher.submit("a", 1, run_a))
    first.start()
    assert entered.wait(10)
    entered.clear()
    for other in ("b", "c", "d"):  # other models come and go meanwhile
        assert batcher.submit(other, 1, lambda items: items) == (1, 1)
    second = threading.Thread(target=lambda: batcher.submit("a", 2, run_a))
    second.start()
    assert not entered.wait(0.3), "a second batch of a running model started"
    release.set()
    first.join(10)
    second.join(10)
    assert peak == [1] and entered.is_set()


def test_two_models_of_one_task_never_share_a_batch(tmp_path):
    """Concurrent requests for two text classifiers: each gets its own model's answer (the batch key holds the
    model)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from hugginggpt.modelhost.engine import LocalEngine

    class Pipe:
        def __init__(self, name: str):
            self.name = name

        def __call__(self, inputs, **kwargs):
            one = [{"label": self.name, "score": 1.0}]
            return [one for _ in inputs] if isinstance(inputs, list) else one

    class Pool:
        registry, device, compute = None, "cpu", Compute(1)

        @contextmanager
        def use(self, spec):
            time.sleep(0.02)  # long enough for the other model's callers to gather
            yield SimpleNamespace(obj=Pipe(spec.id), spec=spec)

    engine = LocalEngine(Pool(), Batcher(max_size=8, wait_s=0.05))
    specs = [ModelSpec(name, "text-classification", "pipeline", "minimal", "text-classification")
             for name in ("org/model-a", "org/model-b")]
    public = make_public(tmp_path / "public")
    out: dict[int, object] = {}
    gate = threading.Barrier(8)

    def call(k: int) -> None:
        gate.wait()
        out[k] = engine.infer(specs[k % 2], Inputs(body={"text": f"text {k}"}, public_dir=public))

    threads = [threading.Thread(target=call, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert {k: v[0]["label"] for k, v in out.items()} == {k: specs[k % 2].id for k in range(8)}


def test_an_item_that_runs_out_of_device_memory_in_a_batch_is_a_no_room_refusal(tmp_path):
    """Out of memory inside a batch: each caller hit gets the pool's NoRoom (503 with Retry-After at the app,
    the allocator's cache given back), not a 500 with the CUDA message."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from hugginggpt.modelhost.engine import LocalEngine
    from hugginggpt.modelhost.pool import NoRoom

    class Pipe:
        def __call__(self, inputs, **kwargs):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    released: list[str] = []

    class Pool:
        registry, device, compute = None, "cuda:0", Compute(1)

        @contextmanager
        def use(self, spec):
            yield SimpleNamespace(obj=Pipe(), spec=spec)

        def out_of_memory(self, spec):
            released.append(spec.id)
            return NoRoom(f"{spec.id} ran out of memory on cuda:0 while running this request")

    engine = LocalEngine(Pool(), Batcher(max_size=8, wait_s=0.05))
    spec = ModelSpec("org/big", "text-classification", "pipeline", "minimal", "text-classification")
    public = make_public(tmp_path / "public")
    with pytest.raises(NoRoom, match="ran out of memory"):
        engine.infer(spec, Inputs(body={"text": "hi"}, public_dir=public))
    assert released == ["org/big"]


def test_tasks_are_batched_by_their_task_whatever_loads_them(tmp_path):
    """sentence-similarity models load as sentence encoders (no pipeline task): their concurrent requests still
    share batches."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import numpy as np

    from hugginggpt.modelhost.batching import batch_size_var
    from hugginggpt.modelhost.engine import LocalEngine

    class Encoder:
        def encode(self, texts, **kwargs):
            return np.ones((len(texts), 4)) / 2.0

    class Pool:
        registry, device, compute = None, "cpu", Compute(1)

        @contextmanager
        def use(self, spec):
            time.sleep(0.05)  # long enough for the other callers to gather
            yield SimpleNamespace(obj=Encoder(), spec=spec)

    engine = LocalEngine(Pool(), Batcher(max_size=8, wait_s=0.05))
    spec = ModelSpec("org/sim", "sentence-similarity", "sentence-embedding", "minimal")
    public = make_public(tmp_path / "public")
    sizes: list[int] = []
    gate = threading.Barrier(4)

    def call() -> None:
        gate.wait()
        assert engine.infer(spec, Inputs(body={"text": "a", "text2": "b"}, public_dir=public)) == {"score": 1.0}
        sizes.append(batch_size_var.get())

    threads = [threading.Thread(target=call) for _ in range(4)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert len(sizes) == 4 and max(sizes) > 1, sizes


def test_a_request_runs_while_its_model_is_held_in_use(tmp_path):
    """The model is used inside the pool's hold on it (an eviction waits for the call; an out-of-memory error
    during it is the pool's to answer), batched or not."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    from hugginggpt.modelhost.engine import LocalEngine

    held: list[bool] = []

    class Pool:
        registry, device, compute = None, "cpu", Compute(1)
        busy = False

        @contextmanager
        def use(self, spec):
            self.busy = True
            try:
                yield SimpleNamespace(obj=lambda text, **kw: held.append(pool.busy) or [{"label": "x", "score": 1.0}],
                                      spec=spec)
            finally:
                self.busy = False

    pool = Pool()
    public = make_public(tmp_path / "public")
    spec = ModelSpec("org/tc", "text-classification", "pipeline", "minimal", "text-classification")
    for engine in (LocalEngine(pool), LocalEngine(pool, Batcher(max_size=8, wait_s=0))):
        assert engine.infer(spec, Inputs(body={"text": "hi"}, public_dir=public)) == [{"label": "x", "score": 1.0}]
    assert held == [True, True]
