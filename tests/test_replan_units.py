"""Edge cases of hugginggpt/replan.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json
import logging

from hugginggpt.config import LLMSettings
from hugginggpt.llm import LLMClient
from hugginggpt.plan import Plan, Task, parse_plan
from hugginggpt.replan import Replanner, failed_for_good, invalid_tasks
from hugginggpt.request import ChatRequest, RequestState

PLANNER = [{"role": "system", "content": "#1 Task planning stage: write the plan"},
           {"role": "user", "content": "tag the names and draw Berlin"}]
PREVIOUS = json.dumps([{"task": "token-classification", "id": 0, "dep": [-1], "args": {"text": "Anna in Berlin"}},
                       {"task": "text-to-image", "id": 1, "dep": [-1], "args": {"text": "Berlin at night"}}])


def speech(tid: int, text: str = "<GENERATED>-0") -> dict:
    return {"task": "text-to-speech", "id": tid, "dep": [-1], "args": {"text": text}}


def make_state(llm, listen=True):
    client = LLMClient(LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="scripted", max_retries=0))
    events: list[tuple[str, dict]] = []
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "tag and draw"}]}), client,
                         (lambda name, e: events.append((name, e))) if listen else None, 30)
    return state, events


def failed(message: str) -> dict:
    return {"task": {"task": "text-to-image"}, "inference result": {"error": {"message": message}}}


def logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hugginggpt.replan"]


# -- what is wrong with a plan, and with its results ---------------------------------------------------------------


def test_invalid_tasks_names_each_task_that_cannot_run_and_only_those():
    plan = Plan([Task(0, "text-to-image", [-1], {"text": "a fox"}),
                 Task(3, "image-editing", [-1], {"image": "a.png"}, error="unknown task type"),
                 Task(5, "image-to-text", [3], {"image": "<GENERATED>-5"}, error="refers to itself")])
    assert invalid_tasks(plan) == ["task 3 (image-editing): unknown task type", "task 5 (image-to-text): refers to itself"]


def test_failed_for_good_names_tasks_whose_every_model_failed_and_only_those():
    plan = Plan([Task(i, "text-to-image", [-1], {"text": "x"}) for i in range(6)])
    results = {
        0: {"inference result": {"generated image": "/images/a.png"}},  # done
        1: failed("every candidate failed: sdxl (HTTP 500); sd-1.5 (timeout)"),
        2: failed("the model refused the prompt"),  # a failure another plan would not avoid
        3: {"inference result": {"error": "every candidate failed (but not as a structured error)"}},
        4: {},  # no inference yet
    }  # 5: no result at all
    assert failed_for_good(plan, results) == [
        "task 1 (text-to-image) could not be run: every candidate failed: sdxl (HTTP 500); sd-1.5 (timeout)"]


def test_failed_for_good_cuts_a_long_failure_to_400_characters():
    message = "every candidate failed: " + "x" * 1000
    plan = Plan([Task(7, "image-to-text", [-1], {"image": "a.png"})])
    [line] = failed_for_good(plan, {7: failed(message)})
    assert line == "task 7 (image-to-text) could not be run: " + message[:400]


# -- asking for a new plan ---------------------------------------------------------------------------------------


def test_ask_sends_the_planner_conversation_the_previous_plan_and_what_went_wrong(llm):
    llm.on("parse_task", json.dumps([speech(2)]))
    state, _ = make_state(llm)
    plan = Replanner(1).ask(state, PLANNER, PREVIOUS, "Task 1 (text-to-image) could not be run: all failed.",
                            frozenset({0}), 2, {"max_tokens": 321})
    assert plan.to_list() == [speech(2)]  # <GENERATED>-0: the finished task's output, not a missing task
    [body] = [r["body"] for r in llm.stage_requests("parse_task")]
    assert body["max_tokens"] == 321  # the planner's own call settings
    assert body["messages"][:2] == PLANNER
    assert body["messages"][2] == {"role": "assistant", "content": PREVIOUS}
    assert body["messages"][3] == {"role": "user", "content": (
        "Task 1 (text-to-image) could not be run: all failed.\n"
        "Write a new JSON task list for the remaining work only, in the same format. Number its tasks from 2. "
        "Tasks [0] already finished: use <GENERATED>-k to use the output of finished task k instead of running it "
        "again. Avoid what failed (another task type or another way to reach the goal).")}
    assert len(body["messages"]) == 4


def test_ask_before_anything_ran_does_not_mention_finished_tasks(llm):
    llm.on("parse_task", json.dumps([speech(0, "hello")]))
    state, _ = make_state(llm)
    plan = Replanner(1).ask(state, PLANNER, PREVIOUS, "The plan cannot run as written.", frozenset(), 0, {})
    assert plan.to_list() == [speech(0, "hello")]
    note = llm.stage_requests("parse_task")[0]["body"]["messages"][-1]["content"]
    assert note == ("The plan cannot run as written.\nWrite a new JSON task list for the remaining work only, in the "
                    "same format. Number its tasks from 0. Avoid what failed (another task type or another way to "
                    "reach the goal).")


def test_a_replan_that_uses_a_task_it_does_not_have_is_read_as_a_broken_reference(llm):
    """Only the finished tasks may be referred to without being in the new plan."""
    llm.on("parse_task", json.dumps([speech(2, "<GENERATED>-1")]))
    state, _ = make_state(llm)
    plan = Replanner(1).ask(state, PLANNER, PREVIOUS, "Task 1 failed.", frozenset({0}), 2, {})
    assert invalid_tasks(plan) == ["task 2 (text-to-speech): an argument refers to task 1, which is not in the plan"]


def test_a_replan_reusing_an_id_below_first_id_or_a_finished_one_is_refused(llm, caplog):
    caplog.set_level(logging.INFO, logger="hugginggpt.replan")
    state, _ = make_state(llm)
    rid = state.request.request_id
    replanner = Replanner(1)
    for reused in (1, 5):  # 1: below first_id (the task that failed); 5: a finished task's id
        llm.on("parse_task", json.dumps([speech(2, "hi"), speech(reused, "hi")]))
        assert replanner.ask(state, PLANNER, PREVIOUS, "Task 1 failed.", frozenset({0, 5}), 2, {}) is None
        assert logged(caplog)[-1] == f"[{rid}] the replan is unusable (ids [{reused}] reused or empty)"
    llm.on("parse_task", json.dumps([speech(2, "hi"), speech(3, "hi")]))
    assert [t.id for t in replanner.ask(state, PLANNER, PREVIOUS, "Task 1 failed.", frozenset({0, 5}), 2, {}).tasks] \
        == [2, 3]


def test_an_empty_replan_is_refused(llm, caplog):
    caplog.set_level(logging.INFO, logger="hugginggpt.replan")
    llm.on("parse_task", "[]")
    state, _ = make_state(llm)
    assert Replanner(1).ask(state, PLANNER, PREVIOUS, "Task 1 failed.", frozenset({0}), 2, {}) is None
    assert logged(caplog) == [f"[{state.request.request_id}] the replan is unusable (ids [] reused or empty)"]


def test_a_replan_in_prose_is_refused_and_logged(llm, caplog):
    caplog.set_level(logging.INFO, logger="hugginggpt.replan")
    llm.on("parse_task", "I would rather not plan again.")
    state, _ = make_state(llm)
    assert Replanner(1).ask(state, PLANNER, PREVIOUS, "Task 1 failed.", frozenset({0}), 2, {}) is None
    assert logged(caplog) == [f"[{state.request.request_id}] the replan is not a task list "
                              "(no JSON in the planner's reply)"]


# -- how many, and what the user is told ---------------------------------------------------------------------------


def test_allowed_counts_the_requests_replans_against_max_replans(llm):
    state, _ = make_state(llm)
    assert not Replanner(0).allowed(state)
    assert Replanner(2).allowed(state)
    state.replan_attempts = 1
    assert Replanner(2).allowed(state) and not Replanner(1).allowed(state)
    state.replan_attempts = 2
    assert not Replanner(2).allowed(state)


def test_record_adds_a_line_for_the_answer_and_a_replan_event(llm):
    state, events = make_state(llm)
    plan = parse_plan(json.dumps([speech(2), {"task": "image-to-text", "id": 3, "dep": [-1], "args": {"image": "a.png"}}]),
                      frozenset({0}))
    Replanner(1).record(state, "task 1 (text-to-image) could not be run", plan)
    assert state.replans == ["Replanned after: task 1 (text-to-image) could not be run -> #2 text-to-speech, "
                             "#3 image-to-text"]
    [(name, event)] = events
    assert name == "replan" and event["reason"] == "task 1 (text-to-image) could not be run"
    assert event["tasks"] == plan.to_list()


def test_context_sums_up_the_plan_and_each_result_for_the_planner():
    plan = parse_plan(PREVIOUS)
    results = {
        1: failed("every candidate failed: sdxl"),
        2: {"task": {"task": "text-to-speech"}, "inference result": {"error": "timed out", "generated audio": "/a.wav"}},
        0: {"task": {"task": "token-classification"},
            "inference result": {"predicted": "Anna → PER", "count": 2, "score": 0.5, "entities": [{"word": "Anna"}],
                                 "ok": None}},
    }
    summary = json.loads(Replanner.context(plan, results))
    assert summary["plan"] == plan.to_list()
    assert summary["results"] == [
        {"id": 0, "task": "token-classification", "status": "done",
         "output": {"predicted": "Anna → PER", "count": 2, "score": 0.5}},
        {"id": 1, "task": "text-to-image", "status": "failed", "output": {}},
        {"id": 2, "task": "text-to-speech", "status": "failed", "output": {"generated audio": "/a.wav"}},
    ]
    assert "Anna → PER" in Replanner.context(plan, results)  # not escaped: the planner reads it as written


def test_context_is_cut_to_6000_characters_and_tolerates_records_without_a_task():
    plan = parse_plan(PREVIOUS)
    results = {i: {"inference result": {"text": "y" * 500}} for i in range(20)}
    text = Replanner.context(plan, results)
    assert len(text) == 6000 and text.startswith('{"plan": ')
    assert json.loads(Replanner.context(plan, {0: {}}))["results"] == [
        {"id": 0, "task": None, "status": "done", "output": {}}]
