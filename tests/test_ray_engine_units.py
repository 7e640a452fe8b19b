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
from hugginggpt.modelhost.progress import Watch
from hugginggpt.modelhost.ray_engine import answer_of, relay

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
