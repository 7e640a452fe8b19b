"""Edge cases of hugginggpt/choose.py, each pinned where a user would notice it broken (mutation audit:
docs/TESTING.md). The shared fakes live in tests/test_select_units.py."""

from __future__ import annotations

import logging

from hugginggpt.choose import Choice, decisions, ready_to_start, start_selection
from hugginggpt.plan import Plan, Task
from hugginggpt.select import Selection
from tests.test_select_units import FakeSelector, Inline, pick, request_state, task


def test_the_llm_chooses_without_a_logit_bias_unless_one_is_given():
    state, _ = request_state()
    sel = FakeSelector(choose="llm")
    start_selection(state, sel, [task()], Inline())
    assert sel.asked == [("org/a", "draw a fox", 0, 0.0)]
    assert state.selections[0].result(timeout=5).model_id == "org/b"


def test_the_log_says_when_a_ready_task_ran_the_ranking_pick_before_the_llm_answered(caplog):
    state, events = request_state()
    t = task(tid=4)
    choice = state.selections[4] = Choice()
    choice.offer(pick(t, model="org/top"))
    with caplog.at_level(logging.INFO, logger="hugginggpt.choose"):
        ready_to_start(state, t)
    assert choice.result(timeout=5).model_id == "org/top" and [p["model"] for _, p in events] == ["org/top"]
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.choose"] == [
        "[req1] task 4: inputs ready before the LLM chose; running the top-ranked org/top"]


def test_a_task_the_plan_could_not_run_is_unavailable_with_its_error_and_no_choice():

    state, _ = request_state()
    broken = Task(task="object-detection", id=2, dep=[-1], args={}, error="no such resource")
    out = decisions(state, Plan([broken]))
    assert out["decisions"]["model_selections"] == {"2": {
        "task": "object-detection", "selected_model": None, "hosted_on": None, "reason": "no such resource",
        "status": "unavailable", "available_candidates": {}}}
    assert out["decisions"]["summary"] == {"total_tasks": 1, "tasks_with_selections": 0, "tasks_unavailable": 1}
    assert out["raw_results"] == {"2": {"task": broken.to_dict(), "choose model result": "",
                                        "inference result": {"error": {"message": "no such resource"}}}}


def test_tasks_after_one_that_cannot_run_or_is_chosen_already_are_still_chosen():
    state, events = request_state()
    earlier = state.selections[1] = Choice()  # chosen while the plan streamed
    tasks = [Task(task="object-detection", id=0, dep=[-1], args={}, error="no such resource"), task(tid=1),
             task(tid=2)]
    sel = FakeSelector(choose="llm")
    start_selection(state, sel, tasks, Inline())
    assert [t.id for _, t, _ in sel.ranked_for] == [2]
    assert state.selections[2].result(timeout=5).model_id == "org/b" and state.selections[1] is earlier
    assert [p["id"] for _, p in events] == [2]


def test_a_choice_reports_how_long_it_took(monkeypatch):
    import hugginggpt.choose as choose_mod

    clock = [100.0]
    monkeypatch.setattr(choose_mod.time, "perf_counter", lambda: clock[0])

    def ranking_takes_2_5_seconds(t):
        clock[0] += 2.5
        return Selection(t.id, t.task, "org/a", "local", "ranked")

    state, events = request_state()
    seen = []
    start_selection(state, FakeSelector(choose="ranking", ranked=ranking_takes_2_5_seconds), [task()], Inline(),
                    observe_seconds=seen.append)
    assert seen == [2.5] and state.selections[0].result(timeout=5).seconds == 2.5
    assert [p["seconds"] for _, p in events] == [2.5]


def choose_log(caplog) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "hugginggpt.choose"]


def test_the_log_says_when_the_llm_answered_after_the_task_started(caplog):
    from hugginggpt.choose import _choose

    state, events = request_state()
    choice = Choice()
    choice.settle(state, task(), Selection(0, "image-classification", "org/a", "local", "ranked"))
    with caplog.at_level(logging.INFO, logger="hugginggpt.choose"):
        _choose(state, FakeSelector(choose="llm"), task(), 0.0, frozenset(), None, choice)
    assert choice.result(timeout=5).model_id == "org/a" and len(events) == 1
    assert choose_log(caplog) == [
        (logging.INFO, "[req1] task 0: the LLM chose org/b after the task had started on the top-ranked model")]


def test_a_failed_choice_is_logged_only_when_no_task_waits_for_it(caplog):
    from hugginggpt.choose import _choose

    state, _ = request_state()
    waited_for = Choice()
    with caplog.at_level(logging.INFO, logger="hugginggpt.choose"):
        _choose(state, FakeSelector(rank_error=RuntimeError("index broken")), task(), 0.0, frozenset(), None,
                waited_for)
    assert str(waited_for.exception(timeout=5)) == "index broken"
    assert choose_log(caplog) == []  # the waiting task reports it
    late = Choice()
    late.settle(state, task(), Selection(0, "image-classification", "org/a", "local", "ranked"))
    with caplog.at_level(logging.INFO, logger="hugginggpt.choose"):
        _choose(state, FakeSelector(choose="llm", llm_error=RuntimeError("llm down")), task(), 0.0, frozenset(),
                None, late)
    assert late.result(timeout=5).model_id == "org/a"
    assert choose_log(caplog) == [
        (logging.ERROR, "[req1] task 0: choosing its model failed after it started on the top-ranked model")]
    assert "RuntimeError: llm down" in caplog.text  # with its traceback
