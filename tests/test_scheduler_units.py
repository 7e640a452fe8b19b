"""Edge cases of hugginggpt/scheduler.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from hugginggpt.scheduler import (
    CANCELLED,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SKIPPED,
    TIMEOUT,
    Outcome,
    Scheduler,
    TaskFailed,
)

# Generous: the machine may be busy. Under mutmut a mutant that loses a task waits this long before its test
# fails, once per mutant: 3 s is still a thousand times what a task hand-over takes.
WAIT = 3.0 if os.environ.get("MUTANT_UNDER_TEST") else 10.0


def wait_until(condition, timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


class Events:
    """An on_event sink that keeps every event with its payload."""

    def __init__(self):
        self.items: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, payload: dict) -> None:
        with self.lock:
            self.items.append((name, dict(payload)))

    def named(self, name: str) -> list[dict]:
        with self.lock:
            return [p for n, p in self.items if n == name]

    def ids(self, name: str) -> list[int]:
        return [p["id"] for p in self.named(name)]


class Gated:
    """A body whose tasks block until their gate opens; records which tasks started and on which thread."""

    def __init__(self, gated: set[int] | None = None):
        self.gated = gated  # None: every task waits for its gate
        self.gates: dict[int, threading.Event] = {}
        self.started: list[int] = []
        self.threads: dict[int, str] = {}
        self.lock = threading.Lock()

    def gate(self, tid: int) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(tid, threading.Event())

    def __call__(self, tid: int):
        with self.lock:
            self.started.append(tid)
            self.threads[tid] = threading.current_thread().name
        if self.gated is None or tid in self.gated:
            assert self.gate(tid).wait(WAIT), f"task {tid} was never released"
        return f"out{tid}"

    def has_started(self, *tids: int) -> bool:
        with self.lock:
            return all(t in self.started for t in tids)

    def release(self, *tids: int) -> None:
        for t in tids:
            self.gate(t).set()

    def release_all(self) -> None:
        with self.lock:
            gates = list(self.gates.values())
        for g in gates:
            g.set()


# -- the small types ------------------------------------------------------------------------


def test_task_failed_keeps_its_message_and_payload():
    exc = TaskFailed("model crashed", {"error": "oom"})
    assert str(exc) == "model crashed" and exc.payload == {"error": "oom"}
    assert TaskFailed("plain").payload is None


def test_an_outcome_starts_pending_and_is_ok_only_when_done():
    o = Outcome(3)
    assert (o.task_id, o.state, o.result, o.error, o.started_at, o.finished_at) == (3, PENDING, None, None, None, None)
    assert not o.ok
    assert Outcome(3, DONE).ok
    for state in (RUNNING, FAILED, SKIPPED, TIMEOUT, CANCELLED):
        assert not Outcome(3, state).ok


# -- what runs, and the outcome it gets ------------------------------------------------------


def test_a_finished_task_reports_its_result_times_and_events():
    events = Events()
    out = Scheduler.of_graph({0: []}, lambda t: {"answer": 42}, on_event=events).run(timeout=WAIT)
    o = out[0]
    assert o.task_id == 0 and o.state == DONE and o.result == {"answer": 42} and o.error is None and o.ok
    assert o.started_at is not None and o.finished_at is not None and o.started_at <= o.finished_at
    assert [n for n, _ in events.items] == ["task_started", "task_finished"]
    assert events.named("task_started") == [{"id": 0}]
    (finished,) = events.named("task_finished")
    assert set(finished) == {"id", "result", "error", "seconds"}
    assert finished["id"] == 0 and finished["result"] == {"answer": 42} and finished["error"] is None
    assert finished["seconds"] == round(o.finished_at - o.started_at, 4)
    assert 0 <= finished["seconds"] < WAIT


def test_a_task_failed_with_a_payload_and_a_crash_are_reported_with_their_reason(caplog):
    events = Events()

    def body(tid):
        if tid == 0:
            raise TaskFailed("model said no", {"error": "no"})
        if tid == 1:
            raise TaskFailed("bare failure")
        raise KeyError("image")

    with caplog.at_level(logging.ERROR, logger="hugginggpt.scheduler"):
        out = Scheduler.of_graph({0: [], 1: [], 2: []}, body, on_event=events).run(timeout=WAIT)
    assert (out[0].state, out[0].result, out[0].error) == (FAILED, {"error": "no"}, "model said no")
    assert (out[1].state, out[1].result, out[1].error) == (FAILED, None, "bare failure")
    assert (out[2].state, out[2].result, out[2].error) == (FAILED, None, "KeyError: 'image'")
    failed = {p["id"]: p for p in events.named("task_failed")}
    assert failed[0]["result"] == {"error": "no"} and failed[0]["error"] == "model said no"
    assert failed[2]["error"] == "KeyError: 'image'"
    assert events.named("task_finished") == []
    crashes = [r for r in caplog.records if r.getMessage() == "task 2 crashed"]
    assert len(crashes) == 1 and crashes[0].exc_info is not None
    assert not any("task 0" in r.getMessage() or "task 1" in r.getMessage() for r in caplog.records)


def test_a_scheduler_without_an_event_sink_still_runs_everything():
    out = Scheduler.of_graph({0: [], 1: [0], 2: [1]}, lambda t: t * 10).run(timeout=WAIT)
    assert {t: (o.state, o.result) for t, o in out.items()} == {0: (DONE, 0), 1: (DONE, 10), 2: (DONE, 20)}


def test_tasks_run_on_threads_named_for_tasks():
    body = Gated(gated=set())
    Scheduler.of_graph({0: []}, body).run(timeout=WAIT)
    assert body.threads[0].startswith("task")


def test_a_dependent_starts_only_when_all_its_dependencies_are_done():
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: [], 2: [0, 1]}, body)
    runner = threading.Thread(target=lambda: results.append(s.run(timeout=WAIT)))
    results: list = []
    runner.start()
    assert wait_until(lambda: body.has_started(0, 1))
    body.release(0)
    assert wait_until(lambda: s.outcomes()[0].state == DONE)
    time.sleep(0.1)
    assert not body.has_started(2) and s.outcomes()[2].state == PENDING  # still waits for task 1
    body.release(1)
    assert wait_until(lambda: body.has_started(2))
    body.release(2)
    runner.join(WAIT)
    assert {t: o.state for t, o in results[0].items()} == {0: DONE, 1: DONE, 2: DONE}


def test_dependencies_outside_the_graph_are_ignored_and_self_or_root_marks_do_not_block():
    out = Scheduler.of_graph({0: [7], 1: [-1], 2: [2, 0, 0]}, lambda t: t).run(timeout=WAIT)
    assert {t: o.state for t, o in out.items()} == {0: DONE, 1: DONE, 2: DONE}


def test_streamed_tasks_marked_minus_one_or_depending_on_themselves_run():
    s = Scheduler(lambda t: t)
    s.add(0, [-1])
    s.add(1, [1])
    s.add(2, [0, 0, -1])
    s.close_input()
    out = s.run(timeout=WAIT)
    assert {t: (o.state, o.error) for t, o in out.items()} == {0: (DONE, None), 1: (DONE, None), 2: (DONE, None)}


def test_a_task_added_twice_runs_once_with_its_first_dependencies():
    ran: list[int] = []
    lock = threading.Lock()

    def body(t):
        with lock:
            ran.append(t)

    s = Scheduler(body)
    s.add(0, [])
    s.add(0, [5])  # ignored: task 0 is known
    s.close_input()
    out = s.run(timeout=WAIT)
    assert ran == [0] and out[0].state == DONE


def test_failed_upfront_reports_its_reason_and_skips_its_dependents_with_events():
    events = Events()
    ran: list[int] = []
    s = Scheduler.of_graph({0: [], 1: [0], 2: [1], 3: []}, ran.append, failed_upfront={0: "bad plan"},
                           on_event=events)
    out = s.run(timeout=WAIT)
    assert (out[0].state, out[0].error) == (FAILED, "bad plan")
    assert out[1].error == "skipped: task 0 it depends on did not finish (bad plan)"
    assert out[2].error.startswith("skipped: task 1 it depends on did not finish (skipped: task 0")
    assert out[3].state == DONE and ran == [3]


def test_a_task_streamed_in_as_failed_emits_its_failure_and_its_waiting_dependents_skips():
    events = Events()
    s = Scheduler(lambda t: t, on_event=events)
    s.add(1, [0])  # waits for task 0, which comes next, already failed
    s.add(0, [], failed="unknown task type")
    assert events.items == [
        ("task_failed", {"id": 0, "result": None, "error": "unknown task type", "seconds": 0.0}),
        ("task_skipped", {"id": 1, "error": "skipped: task 0 it depends on did not finish (unknown task type)"}),
    ]
    s.close_input()
    out = s.run(timeout=WAIT)
    assert (out[0].state, out[1].state) == (FAILED, SKIPPED)
    assert out[0].finished_at is not None and out[1].finished_at is not None


def test_a_task_streamed_in_after_its_dependency_failed_is_skipped_with_its_waiting_dependents():
    events = Events()
    s = Scheduler(lambda t: t, on_event=events)
    s.add(0, [], failed="broken")
    s.add(2, [1])  # waits for task 1, which depends on the failed task
    s.add(1, [0])
    assert events.items[1:] == [
        ("task_skipped", {"id": 1, "error": "skipped: task 0 it depends on did not finish (broken)"}),
        ("task_skipped", {"id": 2, "error": "skipped: task 1 it depends on did not finish "
                                            "(skipped: task 0 it depends on did not finish (broken))"}),
    ]
    s.close_input()
    out = s.run(timeout=WAIT)
    assert {t: o.state for t, o in out.items()} == {0: FAILED, 1: SKIPPED, 2: SKIPPED}


def test_a_failure_skips_each_dependent_once_also_where_paths_join():
    events = Events()

    def body(t):
        if t == 0:
            raise TaskFailed("boom")
        return t

    s = Scheduler.of_graph({0: [], 1: [0], 2: [0], 3: [1, 2], 4: []}, body, on_event=events)
    out = s.run(timeout=WAIT)
    assert {t: o.state for t, o in out.items()} == {0: FAILED, 1: SKIPPED, 2: SKIPPED, 3: SKIPPED, 4: DONE}
    assert sorted(events.ids("task_skipped")) == [1, 2, 3]
    skipped = {p["id"]: p["error"] for p in events.named("task_skipped")}
    assert skipped[1] == skipped[2] == "skipped: task 0 it depends on did not finish (boom)"
    assert skipped[3].startswith("skipped: task ") and "(skipped: task 0 it depends on did not finish (boom))" in skipped[3]
    assert all(out[t].error == skipped[t] and out[t].finished_at is not None for t in (1, 2, 3))
    assert sorted(events.ids("task_started")) == [0, 4]


def test_close_input_skips_a_task_waiting_for_one_that_never_came_with_the_reason():
    events = Events()
    s = Scheduler(lambda t: t, on_event=events)
    s.add(0, [9])
    s.add(1, [0])
    s.close_input()
    assert events.items == [
        ("task_skipped", {"id": 0, "error": "skipped: it depends on task 9, which is not in the plan"}),
        ("task_skipped", {"id": 1, "error": "skipped: task 0 it depends on did not finish "
                                            "(skipped: it depends on task 9, which is not in the plan)"}),
    ]
    out = s.run(timeout=WAIT)
    assert {t: o.state for t, o in out.items()} == {0: SKIPPED, 1: SKIPPED}


def test_close_input_keeps_the_reason_of_a_task_already_skipped():
    """Task 1 waits for task 0 and for task 9 (never added); task 0 failed first: its reason stands."""
    events = Events()

    def body(t):
        if t == 0:
            raise TaskFailed("boom")
        return t

    body2 = Gated(gated={5})

    def both(t):
        return body2(t) if t == 5 else body(t)

    s = Scheduler(both, on_event=events)
    s.start()
    s.add(5, [])  # still running when the input closes
    s.add(1, [0, 9])
    s.add(0, [])
    assert wait_until(lambda: s.outcomes()[1].state == SKIPPED)
    s.close_input()
    assert s.outcomes()[1].error == "skipped: task 0 it depends on did not finish (boom)"
    assert events.ids("task_skipped") == [1]
    assert s.outcomes()[5].state == RUNNING
    body2.release(5)
    out = s.run(timeout=WAIT)
    assert out[5].state == DONE and out[1].error == "skipped: task 0 it depends on did not finish (boom)"


def test_run_returns_without_waiting_for_the_deadline_when_everything_finished_before_the_input_closed():
    s = Scheduler(lambda t: t)
    s.start()
    s.add(0, [])
    assert wait_until(lambda: s.outcomes()[0].state == DONE)
    s.close_input()
    started = time.monotonic()
    out = s.run(timeout=60)
    assert time.monotonic() - started < 30  # not the 60 s deadline
    assert out[0].state == DONE


def test_a_streamed_plan_is_not_over_while_its_input_is_open():
    """Every task added so far finished, more is coming: run still waits for the task added next."""
    body = Gated(gated={1})
    s = Scheduler(body)
    s.start()
    s.add(0, [])
    assert wait_until(lambda: s.outcomes()[0].state == DONE)
    s.add(1, [0])
    s.close_input()
    assert wait_until(lambda: body.has_started(1))
    threading.Timer(0.3, body.release, args=(1,)).start()
    out = s.run(timeout=WAIT)
    assert out[1].state == DONE and out[1].result == "out1"


def test_an_empty_streamed_plan_is_over_when_its_input_closes():
    s = Scheduler(lambda t: t)
    s.close_input()
    started = time.monotonic()
    assert s.run(timeout=60) == {}
    assert time.monotonic() - started < 30


def test_adding_after_the_input_closed_or_after_the_run_ended_is_ignored():
    ran: list[int] = []
    s = Scheduler(ran.append)
    s.add(0, [])
    s.close_input()
    s.add(1, [])  # input closed, run not over: ignored
    assert set(s.outcomes()) == {0}
    out = s.run(timeout=WAIT)
    s.add(2, [])  # the run is over: ignored, without error
    assert set(out) == {0} and set(s.outcomes()) == {0} and ran == [0]


def test_start_twice_runs_each_task_once():
    ran: list[int] = []
    lock = threading.Lock()

    def body(t):
        with lock:
            ran.append(t)

    s = Scheduler.of_graph({0: [], 1: []}, body)
    s.start()
    s.start()
    out = s.run(timeout=WAIT)
    assert sorted(ran) == [0, 1] and all(o.state == DONE for o in out.values())


def test_the_outcomes_handed_out_are_copies():
    s = Scheduler.of_graph({0: []}, lambda t: "real")
    out = s.run(timeout=WAIT)
    out[0].state, out[0].result = FAILED, "changed"
    now = s.outcomes()
    assert (now[0].state, now[0].result) == (DONE, "real")
    now[0].error = "changed"
    assert s.outcomes()[0].error is None


# -- cancel and the deadline -----------------------------------------------------------------


def test_cancel_has_a_default_reason_and_the_first_reason_stands():
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: [0]}, body)
    s.start()
    assert wait_until(lambda: body.has_started(0))
    s.cancel()
    s.cancel("a second reason")
    body.release_all()
    out = s.run(timeout=WAIT)
    assert {t: (o.state, o.error) for t, o in out.items()} == {
        0: (CANCELLED, "cancelled by the client"), 1: (CANCELLED, "cancelled by the client")}
    assert out[0].finished_at is not None and out[1].finished_at is not None
    assert body.started == [0]


def test_cancel_after_the_run_leaves_the_report_alone():
    s = Scheduler.of_graph({0: []}, lambda t: t)
    s.run(timeout=WAIT)
    s.cancel("too late")
    assert s.outcomes()[0].state == DONE and s.outcomes()[0].error is None


def test_a_task_added_after_the_deadline_is_reported_timed_out():
    body = Gated()
    s = Scheduler(body)
    s.add(0, [])
    out = s.run(timeout=0.2)  # input never closed: the deadline ends it
    assert (out[0].state, out[0].error) == (TIMEOUT, "deadline passed before the task finished")
    s.add(1, [0])
    late = s.outcomes()[1]
    assert (late.task_id, late.state, late.error) == (1, TIMEOUT, "deadline passed before the task finished")
    assert late.finished_at is not None
    body.release_all()


def test_a_task_added_after_cancel_is_reported_cancelled_and_never_runs():
    ran: list[int] = []
    s = Scheduler(ran.append)
    s.start()
    s.cancel("user left")
    s.add(0, [])
    s.close_input()
    out = s.run(timeout=WAIT)
    assert (out[0].state, out[0].error) == (CANCELLED, "user left") and out[0].finished_at is not None
    time.sleep(0.1)
    assert ran == []


def test_run_returns_at_the_deadline_while_a_task_body_is_still_busy():
    body = Gated()
    s = Scheduler.of_graph({0: []}, body)
    results: list = []
    runner = threading.Thread(target=lambda: results.append(s.run(timeout=0.2)))
    runner.start()
    runner.join(WAIT)  # the body is still blocked: run must not wait for it
    alive = runner.is_alive()
    body.release_all()
    runner.join(WAIT)
    assert not alive
    assert results[0][0].state == TIMEOUT


def test_a_shut_down_shared_executor_leaves_tasks_to_the_deadline_without_raising():
    shared = ThreadPoolExecutor(max_workers=1)
    shared.shutdown()
    out = Scheduler.of_graph({0: []}, lambda t: t, executor=shared).run(timeout=0.2)
    assert out[0].state == TIMEOUT


def test_tasks_queued_in_a_shared_executor_never_run_after_the_deadline():
    shared = ThreadPoolExecutor(max_workers=1)
    body = Gated(gated={0})
    try:
        s = Scheduler.of_graph({0: [], 1: []}, body, max_workers=2, executor=shared)
        out = s.run(timeout=0.3)  # task 0 holds the only thread; task 1 waits in the executor's queue
        assert out[0].state == TIMEOUT and out[1].state == TIMEOUT
        body.release(0)
        time.sleep(0.3)
        shared.submit(lambda: None).result(WAIT)  # the thread is free again
        assert body.started == [0]
    finally:
        body.release_all()
        shared.shutdown(wait=False)


# -- how many run at once --------------------------------------------------------------------


def test_one_worker_runs_one_task_at_a_time_and_each_waiting_task_gets_its_turn():
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: [], 2: []}, body, max_workers=1)
    results: list = []
    runner = threading.Thread(target=lambda: results.append(s.run(timeout=WAIT)))
    runner.start()
    for _ in range(3):
        assert wait_until(lambda: len(body.started) >= 1)
        time.sleep(0.1)
        running = [t for t in list(body.started) if not body.gate(t).is_set()]
        assert len(running) == 1, body.started  # only one at a time
        body.release(running[0])
        assert wait_until(lambda r=running[0]: s.outcomes()[r].state == DONE)
    runner.join(WAIT)
    assert sorted(body.started) == [0, 1, 2]
    assert all(o.state == DONE for o in results[0].values())


@pytest.mark.parametrize("max_workers", [0, -3])
def test_fewer_than_one_worker_means_one(max_workers):
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: []}, body, max_workers=max_workers)
    s.start()
    assert wait_until(lambda: len(body.started) == 1)
    time.sleep(0.1)
    assert len(body.started) == 1
    body.release(body.started[0])
    assert wait_until(lambda: len(body.started) == 2)
    body.release_all()
    out = s.run(timeout=WAIT)
    assert all(o.state == DONE for o in out.values())


def test_two_workers_run_two_tasks_together_and_a_third_waits():
    both = threading.Barrier(2, timeout=WAIT)
    body = Gated()

    def run(t):
        if t < 2:
            both.wait()  # passes only when tasks 0 and 1 run together
        return body(t)

    s = Scheduler.of_graph({0: [], 1: [], 2: []}, run, max_workers=2)
    s.start()
    assert wait_until(lambda: body.has_started(0, 1))
    time.sleep(0.1)
    assert not body.has_started(2)  # no third worker
    body.release(1)
    assert wait_until(lambda: body.has_started(2))  # task 1's worker went to task 2
    assert s.outcomes()[0].state == RUNNING
    body.release_all()
    out = s.run(timeout=WAIT)
    assert all(o.state == DONE for o in out.values())


def test_eight_workers_by_default():
    body = Gated()
    s = Scheduler.of_graph({t: [] for t in range(9)}, body)
    s.start()
    assert wait_until(lambda: len(body.started) >= 8)
    time.sleep(0.2)
    assert len(body.started) == 8  # the ninth waits for a free worker
    body.release(body.started[0])
    assert wait_until(lambda: len(body.started) == 9)
    body.release_all()
    out = s.run(timeout=WAIT)
    assert all(o.state == DONE for o in out.values())


def test_a_task_waiting_for_a_worker_never_runs_after_cancel():
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: []}, body, max_workers=1)
    s.start()
    assert wait_until(lambda: len(body.started) == 1)
    first = body.started[0]
    s.cancel("stop")
    body.release_all()
    time.sleep(0.3)
    assert body.started == [first]
    out = s.run(timeout=WAIT)
    assert all((o.state, o.error) == (CANCELLED, "stop") for o in out.values())


def test_a_task_waiting_for_a_worker_is_running_for_the_report():
    """Started (its dependencies done) but waiting for a free worker: the report counts it as running."""
    body = Gated()
    s = Scheduler.of_graph({0: [], 1: []}, body, max_workers=1)
    s.start()
    assert wait_until(lambda: len(body.started) == 1)
    now = s.outcomes()
    assert now[0].state == RUNNING and now[1].state == RUNNING
    assert now[0].started_at is not None and now[1].started_at is not None
    body.release_all()
    assert wait_until(lambda: len(body.started) == 2)
    body.release_all()
    assert all(o.state == DONE for o in s.run(timeout=WAIT).values())


def run_promptly(s: Scheduler) -> dict[int, Outcome]:
    """run() with a far deadline, which must not be what ends it: everything settled long before."""
    started = time.monotonic()
    out = s.run(timeout=60)
    assert time.monotonic() - started < 30, "run() waited for the deadline"
    return out


def test_a_failure_reaching_a_task_twice_still_skips_every_dependent():
    """Task 2 depends on 0 and on 3 (which depends on 0): when 0 fails, 2 is reached twice; 1 is skipped too."""
    events = Events()

    def body(t):
        raise TaskFailed("boom")

    out = run_promptly(Scheduler.of_graph({0: [], 1: [0], 2: [0, 3], 3: [0]}, body, on_event=events))
    assert {t: o.state for t, o in out.items()} == {0: FAILED, 1: SKIPPED, 2: SKIPPED, 3: SKIPPED}
    assert sorted(events.ids("task_skipped")) == [1, 2, 3]


def test_run_ends_the_moment_the_last_task_is_skipped():
    body = Gated(gated={2})

    def fail_first(t):
        if t == 0:
            assert body.gate(0).wait(WAIT)
            raise TaskFailed("boom")
        return body(t)

    s = Scheduler.of_graph({2: [], 0: [], 1: [0]}, fail_first)
    s.start()
    assert wait_until(lambda: body.has_started(2))
    body.release(2)
    assert wait_until(lambda: s.outcomes()[2].state == DONE)
    body.release(0)  # the last events: task 0 fails, task 1 is skipped
    out = run_promptly(s)
    assert {t: o.state for t, o in out.items()} == {0: FAILED, 1: SKIPPED, 2: DONE}


def test_a_skip_does_not_end_the_run_while_another_task_still_runs():
    body = Gated(gated={2})

    def body_(t):
        if t == 0:
            raise TaskFailed("boom")
        return body(t)

    s = Scheduler.of_graph({0: [], 1: [0], 2: []}, body_, max_workers=3)
    s.start()
    assert wait_until(lambda: s.outcomes()[1].state == SKIPPED and body.has_started(2))
    threading.Timer(0.3, body.release, args=(2,)).start()
    out = s.run(timeout=WAIT)
    assert out[2].state == DONE and out[2].result == "out2"


def test_the_worker_limit_holds_for_tasks_streamed_in_after_earlier_ones_finished():
    for_two = threading.Barrier(2, timeout=WAIT)
    body = Gated(gated={2, 3, 4})

    def run(t):
        if t in (0, 1, 2, 3):
            for_two.wait()  # 0 and 1 together, then 2 and 3 together
        return body(t)

    s = Scheduler(run, max_workers=2)
    s.start()
    s.add(0, [])
    s.add(1, [])
    assert wait_until(lambda: s.outcomes()[0].state == DONE and s.outcomes()[1].state == DONE)
    for_two.reset()
    s.add(2, [])
    s.add(3, [])
    s.add(4, [])
    assert wait_until(lambda: body.has_started(2, 3))
    time.sleep(0.1)
    assert not body.has_started(4)  # both workers busy
    body.release(2)
    assert wait_until(lambda: body.has_started(4))
    body.release_all()
    s.close_input()
    assert all(o.state == DONE for o in run_promptly(s).values())


@pytest.mark.parametrize("shared", [False, True])
def test_one_worker_still_runs_one_task_at_a_time_after_a_task_finished(shared):
    """On its own thread, or on a shared executor with threads to spare: the scheduler keeps to its limit."""
    body = Gated(gated={1, 2})
    executor = ThreadPoolExecutor(max_workers=4) if shared else None
    s = Scheduler(body, max_workers=1, executor=executor)
    s.start()
    s.add(0, [])
    assert wait_until(lambda: s.outcomes()[0].state == DONE)
    s.add(1, [])
    s.add(2, [])
    assert wait_until(lambda: len(body.started) == 2)
    time.sleep(0.1)
    assert len(body.started) == 2  # 0, then one of 1 and 2
    body.release_all()
    assert wait_until(lambda: len(body.started) == 3)
    body.release_all()
    s.close_input()
    assert all(o.state == DONE for o in run_promptly(s).values())
    if executor is not None:
        executor.shutdown(wait=False)


def test_the_scheduler_s_own_threads_end_after_the_run():
    threads: list[threading.Thread] = []
    s = Scheduler.of_graph({0: [], 1: []}, lambda t: threads.append(threading.current_thread()), max_workers=2)
    s.run(timeout=WAIT)
    assert threads and wait_until(lambda: not any(t.is_alive() for t in threads))


def test_a_task_queued_for_the_own_thread_when_the_deadline_passes_never_runs():
    """The one thread is still announcing task 0's end when task 1 arrives: task 1 waits for the thread, and the
    deadline passes first."""
    announcing, release = threading.Event(), threading.Event()

    def on_event(name, payload):
        if name == "task_finished" and payload["id"] == 0:
            announcing.set()
            release.wait(WAIT)

    ran: list[int] = []
    s = Scheduler(ran.append, max_workers=1, on_event=on_event)
    s.start()
    s.add(0, [])
    assert announcing.wait(WAIT)
    s.add(1, [])
    out = s.run(timeout=0.2)
    release.set()
    time.sleep(0.3)
    assert ran == [0]
    assert out[0].state == DONE and out[1].state == TIMEOUT


def test_a_task_added_twice_is_counted_once():
    s = Scheduler(lambda t: t)
    s.add(0, [])
    s.add(0, [])
    s.close_input()
    assert run_promptly(s)[0].state == DONE


def test_seconds_in_the_event_is_how_long_the_task_ran():
    events = Events()
    out = Scheduler.of_graph({0: []}, lambda t: time.sleep(0.03), on_event=events).run(timeout=WAIT)
    (finished,) = events.named("task_finished")
    assert isinstance(finished["seconds"], float) and finished["seconds"] >= 0.03
    assert finished["seconds"] == round(out[0].finished_at - out[0].started_at, 4)


def test_close_input_reports_every_task_left_waiting_for_a_missing_one():
    events = Events()
    s = Scheduler(lambda t: t, on_event=events)
    s.add(0, [8])
    s.add(1, [9])
    s.close_input()
    assert sorted(events.items, key=lambda e: e[1]["id"]) == [
        ("task_skipped", {"id": 0, "error": "skipped: it depends on task 8, which is not in the plan"}),
        ("task_skipped", {"id": 1, "error": "skipped: it depends on task 9, which is not in the plan"}),
    ]
    assert {t: o.state for t, o in run_promptly(s).items()} == {0: SKIPPED, 1: SKIPPED}
