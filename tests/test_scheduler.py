"""The DAG runner alone: start order, overlap, failure propagation, deadlines, no polling."""

from __future__ import annotations

import threading
import time

from hugginggpt.scheduler import DONE, FAILED, SKIPPED, TIMEOUT, Scheduler, TaskFailed


def recorder(delays: dict[int, float], fail: set[int] = frozenset()):
    times: dict[int, tuple[float, float]] = {}
    lock = threading.Lock()

    def body(tid: int):
        start = time.perf_counter()
        time.sleep(delays.get(tid, 0.0))
        end = time.perf_counter()
        with lock:
            times[tid] = (start, end)
        if tid in fail:
            raise TaskFailed(f"task {tid} broke", {"error": "broke"})
        return f"out{tid}"

    return body, times


def test_dependent_starts_only_after_its_dependency():
    body, times = recorder({0: 0.15})
    outcomes = Scheduler.of_graph({0: [], 1: [0]}, body).run(timeout=5)
    assert outcomes[1].state == DONE
    assert times[1][0] >= times[0][1]


def test_independent_tasks_overlap():
    """Each task waits for the other to start: run one after the other, neither would get past the barrier."""
    both = threading.Barrier(2, timeout=10)

    def body(tid, _inputs=None):
        both.wait()
        return f"out{tid}"

    outcomes = Scheduler.of_graph({0: [], 1: []}, body).run(timeout=30)
    assert outcomes[0].state == DONE and outcomes[1].state == DONE


def test_dependent_starts_the_moment_its_last_dependency_finishes():
    body, times = recorder({0: 0.1, 1: 0.3})
    outcomes = Scheduler.of_graph({0: [], 1: [], 2: [0, 1]}, body).run(timeout=5)
    assert times[2][0] >= times[1][1]
    hop = outcomes[2].started_at - outcomes[1].finished_at
    assert 0 <= hop < 0.4  # event driven: no 0.5 s polling tick (the margin is for a busy machine)


def test_failure_skips_dependents_transitively_with_a_reason():
    body, _ = recorder({}, fail={0})
    events = []
    outcomes = Scheduler.of_graph({0: [], 1: [0], 2: [1], 3: []}, body,
                         on_event=lambda n, p: events.append((n, p["id"]))).run(timeout=5)
    assert outcomes[0].state == FAILED and outcomes[0].result == {"error": "broke"}
    assert outcomes[1].state == SKIPPED and "task 0" in outcomes[1].error
    assert outcomes[2].state == SKIPPED
    assert outcomes[3].state == DONE
    assert ("task_failed", 0) in events and ("task_skipped", 1) in events and ("task_skipped", 2) in events


def test_a_crashing_body_fails_only_its_task():
    def body(tid):
        if tid == 0:
            raise ZeroDivisionError("boom")
        return tid

    outcomes = Scheduler.of_graph({0: [], 1: []}, body).run(timeout=5)
    assert outcomes[0].state == FAILED and "ZeroDivisionError" in outcomes[0].error
    assert outcomes[1].state == DONE


def test_deadline_reports_what_finished():
    body, _ = recorder({0: 0.0, 1: 2.0})
    t0 = time.perf_counter()
    outcomes = Scheduler.of_graph({0: [], 1: [], 2: [1]}, body).run(timeout=0.3)
    assert time.perf_counter() - t0 < 1.0
    assert outcomes[0].state == DONE
    assert outcomes[1].state == TIMEOUT and outcomes[2].state == TIMEOUT


def test_failed_upfront_tasks_never_run():
    ran = []
    outcomes = Scheduler.of_graph({0: [], 1: [0]}, lambda t: ran.append(t), failed_upfront={0: "bad plan"}).run(timeout=5)
    assert ran == [] and outcomes[0].error == "bad plan" and outcomes[1].state == SKIPPED


def test_cancel_stops_waiting():
    body, _ = recorder({0: 2.0})
    sched = Scheduler.of_graph({0: [], 1: [0]}, body)
    threading.Timer(0.1, sched.cancel).start()
    t0 = time.perf_counter()
    outcomes = sched.run(timeout=10)
    assert time.perf_counter() - t0 < 1.0
    assert outcomes[0].state == "cancelled" and outcomes[1].state == "cancelled"


def test_empty_graph_returns_at_once():
    assert Scheduler.of_graph({}, lambda t: t).run(timeout=1) == {}


def test_a_task_finishing_after_the_deadline_keeps_its_timeout():
    """The deadline settled task 0 as timed out; its late finish must not rewrite that or emit events."""
    events: list[tuple[str, int]] = []
    body, times = recorder({0: 0.6})
    sched = Scheduler.of_graph({0: [], 1: [0]}, body, on_event=lambda name, p: events.append((name, p["id"])))
    outcomes = sched.run(timeout=0.2)
    assert outcomes[0].state == TIMEOUT and outcomes[1].state == TIMEOUT
    time.sleep(0.7)  # task 0's body returns meanwhile
    assert 0 in times  # it did finish...
    later = sched.outcomes()
    assert later[0].state == TIMEOUT and later[0].result is None  # ...but its outcome stands
    assert later[1].state == TIMEOUT
    assert ("task_finished", 0) not in events and ("task_started", 1) not in events


def test_a_late_result_never_replaces_the_timeout_record(tmp_path, llm):
    """At the request level: the task that ran past the deadline is reported as such, with no result."""
    import json

    from hugginggpt.catalog import KeywordRanker
    from hugginggpt.chat import ChatRequest, HuggingGPT
    from hugginggpt.config import load_config
    from tests.conftest import make_public, write_config

    class SlowLocal:
        name = "local"

        def is_available(self, model_id: str) -> bool:
            return True

        def infer(self, model_id, inputs):
            time.sleep(1.6)
            return {"predicted": [{"label": "late"}]}

    public = make_public(tmp_path / "public")
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public, request_timeout=1.0))
    engine = HuggingGPT(config, ranker=KeywordRanker(), backends={"local": SlowLocal()})
    llm.on("parse_task", json.dumps([{"task": "image-classification", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    states = []
    results = engine.run(ChatRequest.from_body({"messages": [{"role": "user", "content": "classify"}]}), "results",
                         state_ready=states.append)
    assert "deadline" in results[0]["inference result"]["error"]["message"]
    time.sleep(1.2)  # the backend call returns now, after the request ended
    with states[0].lock:
        record = states[0].results[0]
    assert "predicted" not in record["inference result"] and "error" in record["inference result"]


def test_streamed_tasks_waiting_for_a_task_that_never_came_are_skipped_with_their_dependents():
    ran: list[int] = []
    events: list[tuple[str, int]] = []
    s = Scheduler(lambda tid: ran.append(tid),
                  on_event=lambda name, payload: events.append((name, payload["id"])))
    s.add(0, [])
    s.add(2, [1])  # task 1 is never added
    s.add(3, [2])
    s.close_input()
    started = time.monotonic()
    out = s.run(timeout=5)
    assert time.monotonic() - started < 2  # nothing left waiting until the deadline
    assert out[0].state == DONE and ran == [0]
    assert out[2].state == SKIPPED and "task 1" in out[2].error and "not in the plan" in out[2].error
    assert out[3].state == SKIPPED and "task 2" in out[3].error
    assert ("task_skipped", 2) in events and ("task_skipped", 3) in events  # watchers hear of both


def test_cancel_before_run_reports_every_task_cancelled_and_runs_none():
    """Whether the graph came whole or task by task (streamed after the cancel), the report is the same."""
    ran: list[int] = []
    whole = Scheduler.of_graph({0: [], 1: [0]}, ran.append)
    whole.cancel("stopped by the user")
    streamed = Scheduler(ran.append)
    streamed.cancel("stopped by the user")
    streamed.add(0, [])
    streamed.add(1, [0])
    streamed.close_input()
    for scheduler in (whole, streamed):
        out = scheduler.run(timeout=1)
        assert {t: (o.state, o.error) for t, o in out.items()} == {
            0: ("cancelled", "stopped by the user"), 1: ("cancelled", "stopped by the user")}
    assert ran == []


def test_nothing_starts_before_start_and_later_tasks_start_on_arrival():
    ran: list[int] = []
    s = Scheduler(ran.append)
    s.add(0, [])
    time.sleep(0.1)
    assert ran == []  # added, not started
    s.start()
    s.add(1, [0])
    s.add(2, [])
    deadline = time.monotonic() + 2
    while len(ran) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(ran) == [0, 1, 2]  # all ran before close_input / run was called
    s.close_input()
    assert all(o.state == DONE for o in s.run(timeout=1).values())


def test_a_scheduler_on_shared_threads_runs_at_most_max_workers_of_its_tasks_at_once():
    from concurrent.futures import ThreadPoolExecutor

    shared = ThreadPoolExecutor(max_workers=8)
    running, peak, lock = [0], [0], threading.Lock()

    def body(tid):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    out = Scheduler.of_graph({t: [] for t in range(6)}, body, max_workers=2, executor=shared).run(timeout=5)
    assert all(o.state == DONE for o in out.values()) and peak[0] == 2  # the other four waited their turn
    other = Scheduler.of_graph({0: []}, lambda t: "ok", executor=shared).run(timeout=5)  # the threads live on
    assert other[0].state == DONE and not shared._shutdown


def test_a_streamed_task_whose_dependency_already_settled_is_decided_at_once():
    """Streamed in after its dependency failed: skipped at once with the reason (not left waiting for the
    deadline); after its dependency finished: it runs at once."""
    ran: list[int] = []
    events: list[tuple[str, int]] = []

    def body(tid: int) -> str:
        ran.append(tid)
        if tid == 0:
            raise TaskFailed("task 0 broke")
        return f"out{tid}"

    s = Scheduler(body, on_event=lambda name, payload: events.append((name, payload["id"])))
    s.start()
    s.add(0, [])
    s.add(1, [])
    deadline = time.monotonic() + 2
    while len(s.outcomes()) < 2 or any(o.state in ("pending", "running") for o in s.outcomes().values()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    s.add(2, [0])  # its dependency failed before it came
    s.add(3, [2])
    s.add(4, [1])  # its dependency finished before it came
    assert s.outcomes()[2].state == SKIPPED and "task 0" in s.outcomes()[2].error  # decided on arrival
    s.close_input()
    started = time.monotonic()
    out = s.run(timeout=3)
    assert time.monotonic() - started < 1  # nothing waited for the deadline
    assert out[0].state == FAILED and out[1].state == DONE and out[4].state == DONE
    assert out[3].state == SKIPPED and "task 2" in out[3].error
    assert sorted(ran) == [0, 1, 4]
    assert ("task_skipped", 2) in events and ("task_skipped", 3) in events
