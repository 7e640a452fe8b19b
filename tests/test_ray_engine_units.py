"""The Ray engine's front: a replica's answer or stream bounded by the engine's timeout (task_timeout), without
starting Ray. The stand-ins behave as Serve's handle results do (ray/serve/handle.py): `result(timeout_s=)`
raises TimeoutError when late; a stream's iteration blocks until the replica yields, and `cancel()` makes the
waiting iteration raise RequestCancelledError. The real engine runs in tests/test_models_engines.py."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from hugginggpt.cancel import Cancelled
from hugginggpt.modelhost.pool import InferenceFailed
from hugginggpt.modelhost.progress import Watch, watching
from hugginggpt.modelhost.ray_engine import answer_of, in_turn, relay

try:
    from ray.serve.exceptions import RequestCancelledError
except ImportError:  # Ray is an extra; the front's code only needs the stream to raise
    class RequestCancelledError(Exception):  # type: ignore[no-redef]
        pass


class Stream:
    """Serve's DeploymentResponseGenerator as the front sees it."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()
        self.cancels = 0

    def send(self, item: dict) -> None:
        self.items.put(item)

    def cancel(self) -> None:
        self.cancels += 1
        self.items.put(RequestCancelledError("cancelled"))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        item = self.items.get()
        if isinstance(item, Exception):
            raise item
        if item is StopIteration:
            raise StopIteration
        return item


def bounded(call, seconds: float = 10.0):
    """`call()` on a thread, at most `seconds`: a relay that never ends fails the test instead of hanging it."""
    outcome: list = []

    def run():
        try:
            outcome.append(("value", call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(("raised", exc))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"still running after {seconds} s: no deadline ended it"
    kind, value = outcome[0]
    if kind == "raised":
        raise value
    return value


class Response:
    """Serve's DeploymentResponse: `result(timeout_s=)` waits for the replica, at most timeout_s."""

    def __init__(self, answer: dict | None, takes: float) -> None:
        self.answer, self.takes, self.cancelled = answer, takes, False

    def result(self, timeout_s: float | None = None) -> dict:
        if timeout_s is not None and self.takes > timeout_s:
            time.sleep(timeout_s)
            raise TimeoutError("Timed out waiting for result.")
        time.sleep(self.takes)
        return self.answer

    def cancel(self) -> None:
        self.cancelled = True


def test_a_replica_silent_past_the_timeout_ends_a_watched_call_with_a_clear_failure_and_its_run_cancelled():
    stream, seen = Stream(), []
    stream.send({"progress": {"phase": "running", "step": 1, "steps": 50}})  # then nothing: a stuck replica
    started = time.monotonic()
    with pytest.raises(InferenceFailed, match=r"no answer within 0\.5 s \(task_timeout\)"):
        bounded(lambda: relay(stream, Watch(seen.append), 0.5))
    assert 0.4 <= time.monotonic() - started < 5
    assert seen == [{"phase": "running", "step": 1, "steps": 50}]  # what came before the deadline was passed on
    assert stream.cancels >= 1  # the replica's generator is closed: its run stops at its next step


def test_the_deadline_is_for_the_whole_call_not_each_event():
    """A replica that sends a step every 0.2 s, for ever, is still cut off at the timeout."""
    stream, seen = Stream(), []
    stop = threading.Event()

    def dribble():
        k = 0
        while not stop.is_set():
            k += 1
            stream.send({"progress": {"phase": "running", "step": k, "steps": 1000}})
            time.sleep(0.2)

    threading.Thread(target=dribble, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(InferenceFailed, match="no answer within 1 s"):
            bounded(lambda: relay(stream, Watch(seen.append), 1.0))
    finally:
        stop.set()
    assert time.monotonic() - started < 3 and len(seen) >= 3


def test_a_watched_answer_in_time_is_returned_and_its_timer_leaves_the_stream_alone_after():
    stream, seen = Stream(), []
    stream.send({"progress": {"phase": "loading"}})
    stream.send({"answer": {"result": {"path": "/images/a.png"}, "files": {}}})
    assert relay(stream, Watch(seen.append), 0.3) == {"result": {"path": "/images/a.png"}, "files": {}}
    assert seen == [{"phase": "loading"}]
    cancels = stream.cancels
    time.sleep(0.5)  # past the timeout: the timer was stopped with the call
    assert stream.cancels == cancels


def test_a_client_that_left_stops_relaying_and_cancels_the_replica_s_stream():
    stream = Stream()
    watch = Watch(lambda e: None)
    watch.stop()
    stream.send({"progress": {"phase": "running", "step": 3, "steps": 25}})
    with pytest.raises(Cancelled):
        relay(stream, watch, 30)
    assert stream.cancels == 1


def test_a_stream_that_ends_without_an_answer_is_a_failure_not_a_hang():
    stream = Stream()
    stream.send(StopIteration)
    with pytest.raises(InferenceFailed, match="ended without an answer"):
        relay(stream, Watch(lambda e: None), 30)


def test_an_unwatched_call_past_the_timeout_says_so_and_is_cancelled():
    late = Response({"result": 1}, takes=5)
    with pytest.raises(InferenceFailed, match=r"no answer within 0\.3 s"):
        bounded(lambda: answer_of(late, 0.3))
    assert late.cancelled
    quick = Response({"result": 1}, takes=0)
    assert answer_of(quick, 0.3) == {"result": 1} and not quick.cancelled


def test_the_events_still_queued_when_the_answer_comes_are_passed_on_first():
    """The run's thread hands its last steps to the loop just before its answer: none is dropped."""
    import asyncio

    from hugginggpt.modelhost.ray_engine import pump

    async def main():
        events: asyncio.Queue = asyncio.Queue()
        answer = asyncio.get_running_loop().create_future()
        for k in (4, 5, 6):  # three steps queued at once, then the answer, before the pump reads any
            events.put_nowait({"phase": "running", "step": k, "steps": 6})
        answer.set_result({"result": {"path": "/images/a.png"}})
        return [item async for item in pump(answer, events)]

    assert asyncio.run(main()) == [{"progress": {"phase": "running", "step": 4, "steps": 6}},
                                   {"progress": {"phase": "running", "step": 5, "steps": 6}},
                                   {"progress": {"phase": "running", "step": 6, "steps": 6}},
                                   {"answer": {"result": {"path": "/images/a.png"}}}]


def test_events_made_while_the_run_goes_on_come_as_they_are_made_and_the_answer_last():
    import asyncio

    from hugginggpt.modelhost.ray_engine import pump

    async def main():
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def run():  # the replica's thread: steps through the loop, as the watch sends them
            for k in range(1, 4):
                time.sleep(0.05)
                loop.call_soon_threadsafe(events.put_nowait, {"step": k})
            time.sleep(0.05)  # saving the image: the pump waits for an event that will not come
            return {"result": "done"}

        answer = asyncio.ensure_future(asyncio.to_thread(run))
        seen = []
        async for item in pump(answer, events):
            seen.append((item, answer.done()))
        await asyncio.sleep(0.05)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == [], left  # no reader of the queue is left waiting for ever, one per call
        return seen

    seen = asyncio.run(main())
    assert [item for item, _ in seen] == [{"progress": {"step": 1}}, {"progress": {"step": 2}},
                                          {"progress": {"step": 3}}, {"answer": {"result": "done"}}]
    assert not seen[0][1]  # the first step came while the run went on, not after it


# -- the front's part of a call: inputs sent as bytes, the replica's answer turned into the server's -------------


class Handle:
    """Serve's DeploymentHandle as the front uses it: `.options(multiplexed_model_id=..., stream=...)`, then
    `.infer.remote(body)` (a DeploymentResponse) or `.infer_watched.remote(body)` (a stream)."""

    def __init__(self, answer: dict, events: list[dict] | None = None):
        self.answer, self.events = answer, events or []
        self.sent: list[tuple[dict, dict]] = []  # (options, body)

    def options(self, **kw):
        handle = Handle(self.answer, self.events)
        handle.sent = self.sent
        handle.opts = {**getattr(self, "opts", {}), **kw}
        return handle

    def __getattr__(self, method):
        if method not in ("infer", "infer_watched"):
            raise AttributeError(method)
        outer = self

        class Method:
            def remote(self, body):
                outer.sent.append((dict(getattr(outer, "opts", {})), body))
                if method == "infer":
                    return Response(outer.answer, takes=0)
                stream = Stream()
                for event in outer.events:
                    stream.send({"progress": event})
                stream.send({"answer": outer.answer})
                return stream
        return Method()


def front(tmp_path, answer: dict, events: list[dict] | None = None, share: float = 0.0):
    from hugginggpt.modelhost.ray_engine import RayEngine

    engine = object.__new__(RayEngine)  # the front without starting Ray: its handles are Serve's stand-ins
    engine.public_dir, engine.timeout, engine.device_name = tmp_path / "public", 30.0, "cpu"
    engine.handles = {share: Handle(answer, events)}
    return engine


def spec(task="text-to-image", model="acme/sd", gpu_fraction=0.5):
    from hugginggpt.modelhost.registry import ModelSpec

    return ModelSpec(id=model, task=task, loader="pipeline", level="standard", gpu_fraction=gpu_fraction)


def test_a_generated_file_comes_back_as_bytes_and_is_written_into_the_front_s_public_folder(tmp_path):
    from hugginggpt.modelhost.handlers import Inputs

    engine = front(tmp_path, {"result": {"path": "/images/ab12.png"}, "files": {"/images/ab12.png": b"PNG bytes"}})
    got = engine.infer(spec(), Inputs({"text": "a lighthouse"}, tmp_path / "public"))
    assert got == {"path": "/images/ab12.png"}
    assert (tmp_path / "public" / "images" / "ab12.png").read_bytes() == b"PNG bytes"
    options, body = engine.handles[0.0].sent[0]
    assert options == {"multiplexed_model_id": "acme/sd"} and body == {"text": "a lighthouse"}


@pytest.mark.parametrize("path", ["/images/../../etc/cron.d/x", "/secrets/key.png", "images/a.png", "/images/",
                                  "/images/a/b.png", "/images/.hidden"])
def test_a_replica_naming_a_file_outside_the_output_folders_is_refused_and_nothing_is_written(tmp_path, path):
    from hugginggpt.modelhost.handlers import Inputs

    engine = front(tmp_path, {"result": {"path": path}, "files": {path: b"x"}})
    with pytest.raises(InferenceFailed, match="a replica named an output outside images/audios/videos"):
        engine.infer(spec(), Inputs({"text": "a"}, tmp_path / "public"))
    assert not any(p.is_file() for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("kind, error", [("bad_request", "BadRequest"), ("cancelled", "Cancelled"),
                                         ("unavailable", "ModelUnavailable"), ("failed", "InferenceFailed"),
                                         ("something new", "InferenceFailed")])
def test_a_replica_s_error_becomes_the_server_s_error_of_its_kind_with_its_message(tmp_path, kind, error):
    from hugginggpt.modelhost.handlers import Inputs

    engine = front(tmp_path, {"error": {"kind": kind, "message": "what the replica said"}})
    with pytest.raises(Exception, match="^what the replica said$") as raised:
        engine.infer(spec(), Inputs({"text": "a"}, tmp_path / "public"))
    assert type(raised.value).__name__ == error


def test_a_watched_call_passes_the_replica_s_events_on_and_gets_its_answer(tmp_path):
    from hugginggpt.modelhost.batching import batch_size_var
    from hugginggpt.modelhost.handlers import Inputs

    events = [{"phase": "loading"}, {"phase": "running", "step": 1, "steps": 2}]
    engine = front(tmp_path, {"result": {"label": "POSITIVE"}, "files": {}, "batch": 3}, events)
    seen: list[dict] = []
    with watching(Watch(seen.append)):
        assert engine.infer(spec(task="text-classification"), Inputs({"text": "a"}, tmp_path)) == {"label": "POSITIVE"}
    assert seen == events
    assert engine.handles[0.0].sent[0][0] == {"multiplexed_model_id": "acme/sd", "stream": True}
    assert batch_size_var.get() == 3  # the replica's batch, as the X-Batch-Size header says it


def test_an_image_named_by_path_travels_to_the_replica_as_a_data_uri(tmp_path):
    from hugginggpt.modelhost.handlers import Inputs
    from tests.conftest import make_public

    public = make_public(tmp_path / "public")
    engine = front(tmp_path, {"result": [{"label": "red"}], "files": {}})
    engine.infer(spec(task="image-classification"), Inputs({"img_url": "/examples/red.png", "text": ""}, public))
    body = engine.handles[0.0].sent[0][1]
    assert body["img_url"].startswith("data:image/png;base64,") and body["text"] == ""  # the replica has no disk


def test_gpu_shares_apply_on_cuda_only_and_outputs_are_the_result_s_paths():
    from hugginggpt.modelhost.ray_engine import RayEngine, output_paths

    assert RayEngine.gpu_share(spec(gpu_fraction=0.5), "cuda:0") == 0.5
    assert RayEngine.gpu_share(spec(gpu_fraction=0.5), "cpu") == 0.0
    assert output_paths({"path": "/images/a.png", "paths": ["/videos/b.mp4", 3]}) == ["/images/a.png", "/videos/b.mp4"]
    assert output_paths({"path": 3, "paths": "/images/a.png"}) == [] and output_paths(["/images/a.png"]) == []


def test_a_replica_runs_its_models_in_turn_on_its_compute_thread_and_a_waiting_call_says_why():
    """A replica's requests, as `_dispatch` runs them: a second request of the same model waits for the model;
    one of another model waits for the replica's compute thread (one on the CPU), and each hears why."""
    import asyncio

    from hugginggpt.modelhost.compute import Compute

    compute = Compute(1)
    release = threading.Event()
    ran_on: list[int] = []

    def work(answer: str, hold: bool = False) -> str:
        ran_on.append(threading.get_ident())
        if hold:
            release.wait(10)
        return answer

    async def scenario() -> tuple[list, dict[str, list[dict]]]:
        locks = {"a": asyncio.Lock(), "b": asyncio.Lock()}
        heard: dict[str, list[dict]] = {"a2": [], "b": []}

        async def watched(name: str, model: str, answer: str, hold: bool = False):
            if name in heard:
                with watching(Watch(heard[name].append)):
                    return await in_turn(locks[model], compute, model, work, answer, hold)
            return await in_turn(locks[model], compute, model, work, answer, hold)

        first = asyncio.ensure_future(watched("a1", "a", "one", True))
        await asyncio.sleep(0.1)  # a1 holds model a and the compute thread
        second = asyncio.ensure_future(watched("a2", "a", "two"))
        other = asyncio.ensure_future(watched("b", "b", "three"))
        await asyncio.sleep(0.2)
        release.set()
        return await asyncio.gather(first, second, other), heard

    answers, heard = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert answers == ["one", "two", "three"]
    assert heard["a2"][0] == {"phase": "queued", "waiting": "a is running another request"}
    assert heard["b"] == [{"phase": "queued", "waiting": "behind other models' calls"}, {"phase": "running"}]
    assert len(set(ran_on)) == 1 and threading.get_ident() not in ran_on  # the compute thread, not the loop's


def test_a_request_cancelled_while_its_call_runs_keeps_its_model_until_the_call_ends():
    """A front that times out cancels the replica's request; the call already running on the compute thread cannot
    stop there, so the model's lock stays held until it ends (the next request never shares the pipeline), and a
    call cancelled before its turn never runs."""
    import asyncio

    from hugginggpt.modelhost.compute import Compute

    compute = Compute(1)
    release = threading.Event()
    ran: list[str] = []

    def work(name: str, hold: bool = False) -> str:
        ran.append(name)
        if hold:
            release.wait(10)
        return name

    async def started(name: str) -> None:
        for _ in range(500):
            if name in ran:
                return
            await asyncio.sleep(0.02)

    async def scenario() -> tuple[bool, bool, list[str]]:
        lock = asyncio.Lock()
        running = asyncio.ensure_future(in_turn(lock, compute, "m", work, "running", True))
        await started("running")
        running.cancel()  # the front gave up while the call runs
        await asyncio.sleep(0.1)
        held_while_running = lock.locked()
        release.set()
        try:
            await running
        except asyncio.CancelledError:
            pass
        other = asyncio.Lock()
        release.clear()
        holder = asyncio.ensure_future(in_turn(other, compute, "x", work, "holder", True))
        await started("holder")
        queued = asyncio.ensure_future(in_turn(asyncio.Lock(), compute, "y", work, "never"))
        await asyncio.sleep(0.1)
        queued.cancel()  # cancelled before its turn
        await asyncio.sleep(0.1)  # the cancellation reaches the request before the holder lets the thread go
        release.set()
        await holder
        await asyncio.sleep(0.1)
        return held_while_running, lock.locked(), list(ran)

    held, after, ran_names = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert held and not after
    assert ran_names == ["running", "holder"]
