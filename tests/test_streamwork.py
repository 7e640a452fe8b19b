"""StreamWork and ReleaseWhenAll on their own: a stream's admission slot comes back only when both its response
is closed and its work has ended, in whichever order those happen (the HTTP tests can't hold the work open:
a cancel cuts it within milliseconds)."""

from __future__ import annotations

import threading
import time

import pytest

from hugginggpt.admission import Busy, ReleaseWhenAll, admitted, local_slots, take


def free(slots) -> bool:
    if slots.acquire(blocking=False):
        slots.release()
        return True
    return False


@pytest.mark.parametrize("work_ends_first", [True, False])
def test_the_slot_comes_back_when_the_response_and_the_work_are_both_done(work_ends_first):
    from hugginggpt.streamwork import StreamWork

    slots = local_slots(1)
    take(slots, 1)
    slot = ReleaseWhenAll(slots, "response")
    go, ended = threading.Event(), threading.Event()
    thread = StreamWork("r1").start(lambda: (go.wait(10), ended.set()), slot, "test-work")
    if work_ends_first:
        go.set()
        thread.join(10)
        assert ended.is_set() and not thread.is_alive()
        assert not free(slots), "the slot came back while the client was still being answered"
        slot.done("response")
    else:
        slot.done("response")  # the client left; the work goes on for a while
        assert not ended.wait(0.1)
        assert not free(slots), "the slot came back while the work still ran"
        go.set()
        thread.join(10)
        assert ended.is_set() and not thread.is_alive()
    assert free(slots)


def test_ended_waits_for_the_work_s_last_lines_then_the_slot_is_free_at_once():
    """The stream calls `ended` once its last event is sent, while the work still runs its last lines: `ended`
    waits for them, so the slot is free the moment it returns and a client that read the end and asks again at
    once is not refused. A work never started has nothing to wait for."""
    from hugginggpt.streamwork import StreamWork

    slots = local_slots(1)
    take(slots, 1)
    last_event = threading.Event()

    def body() -> None:
        last_event.set()
        time.sleep(0.3)  # the lines after its last event

    work = StreamWork("r2")
    work.start(body, ReleaseWhenAll(slots, "response"), "test-work")
    assert last_event.wait(10)
    work.ended()
    assert free(slots), "ended() returned before the work had, with the slot still held"
    StreamWork("r3").ended()


def test_a_work_thread_that_cannot_start_gives_its_slot_back(monkeypatch):
    from hugginggpt.streamwork import StreamWork

    slots = local_slots(1)
    take(slots, 1)
    slot = ReleaseWhenAll(slots, "response")

    def no_threads(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_threads)
    with pytest.raises(RuntimeError):
        StreamWork("r3").start(lambda: None, slot, "test-work")
    monkeypatch.undo()
    slot.done("response")  # admitted() gives the response's part back when the route raises
    assert free(slots)


def test_a_stream_cancelled_before_its_state_exists_is_cancelled_when_it_does():
    from hugginggpt.streamwork import StreamWork

    class State:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    work = StreamWork("r2")
    work.cancel()
    state = State()
    work.state_ready(state)
    assert state.cancelled and work.state is state


def test_busy_is_a_429_naming_the_setting():
    slots = local_slots(1)
    with admitted(slots, 1):
        with pytest.raises(Busy) as caught, admitted(slots, 1):
            pass
    assert caught.value.status == 429 and "max_concurrent_requests" in str(caught.value)
    assert free(slots)


def test_a_party_added_after_the_slot_went_back_is_refused_by_name():
    """The slot is given back once, when the last party is done; adding a party after that is a bug in the caller,
    said as such (the slot is not taken twice, nor given back twice)."""
    slots = local_slots(1)
    assert slots.acquire(blocking=False)
    release = ReleaseWhenAll(slots, "work")
    release.add("response")
    release.done("work")
    assert not slots.acquire(blocking=False)  # "response" still holds it
    release.done("response")
    release.done("response")  # again: nothing more is given back
    with pytest.raises(RuntimeError, match="^the slot was given back already$"):
        release.add("late")
    assert slots.acquire(blocking=False) and not slots.acquire(blocking=False)


class Cancellable:
    """A request's state as StreamWork sees it: something to cancel."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the pipeline's own error
def test_work_that_fails_still_gives_its_slot_back_and_runs_in_the_request_s_context():
    import contextvars

    from hugginggpt.streamwork import StreamWork

    slots = local_slots(1)
    take(slots, 1)
    slot = ReleaseWhenAll(slots, "response")
    request_id = contextvars.ContextVar("request_id", default="none")
    request_id.set("abc123")
    seen: list[str] = []

    def pipeline() -> None:
        seen.append(request_id.get())  # the log lines of the stream's thread name its request
        raise RuntimeError("the LLM is down")

    thread = StreamWork("r4").start(pipeline, slot, "test-work")
    thread.join(10)
    assert thread.daemon  # a stream still running never keeps the server from exiting
    assert seen == ["abc123"]
    slot.done("response")
    assert free(slots), "a failed pipeline kept its slot: after max_concurrent_requests of them every request is a 429"


def test_the_disconnect_watch_cancels_work_whose_client_left_and_forgets_requests_that_ended():
    from hugginggpt.streamwork import DisconnectWatch

    watch = DisconnectWatch(period=0.01)
    left = threading.Event()
    state = Cancellable()
    with watch.watching(left.is_set, "r5") as work:
        work.state_ready(state)
        assert not state.cancelled.wait(0.1)
        left.set()
        assert state.cancelled.wait(5)

    with pytest.raises(ValueError), watch.watching(lambda: False, "r6"):
        raise ValueError("the request failed")
    assert watch._watched == {}  # noqa: SLF001 - a failed request is not polled for ever

    def broken() -> bool:
        raise KeyError("the channel is closed and cannot say")

    other = Cancellable()
    with watch.watching(broken, "r7") as work:  # a channel that fails to say is gone, and the watch goes on
        work.state_ready(other)
        assert other.cancelled.wait(5)
        later = Cancellable()
        gone = threading.Event()
        with watch.watching(gone.is_set, "r8") as next_work:
            next_work.state_ready(later)
            gone.set()
            assert later.cancelled.wait(5), "the watch thread died on a channel that failed to say"


def test_a_watch_whose_thread_could_not_start_tries_again_on_the_next_request(monkeypatch):
    from hugginggpt.streamwork import DisconnectWatch

    watch = DisconnectWatch(period=0.01)
    real_start = threading.Thread.start

    def no_threads(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_threads)
    with pytest.raises(RuntimeError), watch.watching(lambda: False, "r9"):
        pass
    monkeypatch.setattr(threading.Thread, "start", real_start)
    left = threading.Event()
    state = Cancellable()
    with watch.watching(left.is_set, "r10") as work:
        work.state_ready(state)
        left.set()
        assert state.cancelled.wait(5), "disconnects were never noticed again after one failed start"
