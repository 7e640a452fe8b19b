"""Edge cases of hugginggpt/planner.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import dataclasses
import json
import logging

from hugginggpt.config import load_config
from hugginggpt.llm import LLMClient
from hugginggpt.planner import Planner
from hugginggpt.prompts import PromptSet
from hugginggpt.replan import Replanner
from hugginggpt.request import ChatRequest, RequestState
from hugginggpt.select import control_task_fixup
from tests.conftest import make_public, write_config

FOX = {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}
CAPTION = {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}
EDIT = {"task": "image-editing", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}  # no such task type
TELEPORT = {"task": "teleport", "id": 2, "dep": [-1], "args": {"text": "the fox"}}  # no such task type either
SUMMARY = {"task": "summarization", "id": 2, "dep": [1], "args": {"text": "<GENERATED>-1"}}
CANNY = {"task": "canny-text-to-image", "id": 0, "dep": [-1], "args": {"image": "/examples/a.jpg"}}


class Sink:
    """Records what starts and how often it is stopped; `fixup`: fixes ControlNet tasks up as the real sink does."""

    def __init__(self, fixup: bool = False):
        self.started: list = []
        self.stops = 0
        self.fixup = fixup

    def start(self, task):
        if self.fixup:
            control_task_fixup(task)
        self.started.append(task)

    def stop(self):
        self.stops += 1


def make(tmp_path, llm, messages=None, listen=True, **config):
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", make_public(tmp_path / "public"),
                                      **config))
    planner = Planner(config, PromptSet.from_config(config), Replanner(config.max_replans))
    events: list[tuple[str, dict]] = []
    messages = messages or [{"role": "user", "content": "draw a fox and caption it"}]
    state = RequestState(ChatRequest.from_body({"messages": messages}), LLMClient(config.llm),
                         (lambda name, e: events.append((name, e))) if listen else None, 30)
    return planner, state, events


def planner_asked(llm) -> list[dict]:
    return [r["body"] for r in llm.stage_requests("parse_task")]


def logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hugginggpt.planner"]


# -- what the planner is asked ---------------------------------------------------------------------------------


def test_the_planner_sees_the_earlier_turns_as_history_and_the_last_one_as_the_request(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX]))
    messages = [{"role": "user", "content": "draw a cat"}, {"role": "assistant", "content": "here is the cat picture"},
                {"role": "user", "content": "now a fox please"}]
    planner, state, _ = make(tmp_path, llm, messages)
    planner.plan(state)
    [body] = planner_asked(llm)
    prompt = body["messages"][-1]["content"]
    assert "draw a cat" in prompt and "here is the cat picture" in prompt and "now a fox please" in prompt
    assert state.planner_messages == body["messages"]  # kept for a replan later in the request
    assert state.plan_reply == json.dumps([FOX])


def test_a_configured_large_context_window_keeps_a_long_history_the_default_window_would_drop(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX]))
    old = "an old turn about foxes " + "x" * 40_000  # about 10,000 tokens: more than the default 8192 window
    messages = [{"role": "user", "content": old}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "draw a fox"}]
    planner, state, _ = make(tmp_path, llm, messages, max_context_tokens=64_000)
    planner.plan(state)
    [body] = planner_asked(llm)
    assert "an old turn about foxes" in body["messages"][-1]["content"]


def test_the_planner_is_asked_for_schema_constrained_output_capped_at_planner_max_tokens(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX]))
    planner, state, _ = make(tmp_path, llm, planner_max_tokens=700)
    planner.plan(state)
    [body] = planner_asked(llm)
    assert body["response_format"]["type"] == "json_schema"
    assert body["max_tokens"] == 700 and body["temperature"] == 0


def test_structured_output_off_asks_for_free_text(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX]))
    planner, state, _ = make(tmp_path, llm, structured_output="off")
    assert planner.plan(state).plan.to_list() == [FOX]
    [body] = planner_asked(llm)
    assert "response_format" not in body
    assert planner.chat_kwargs()["json_schema"] is None and planner.chat_kwargs()["structured"] == "off"


def test_the_planner_bias_is_the_configured_parse_task_weight_and_none_when_unset(tmp_path, llm):
    planner, _, _ = make(tmp_path, llm, logit_bias={"parse_task": 0.25, "choose_model": 5})
    assert planner.chat_kwargs()["logit_bias_weight"] == 0.25
    planner.config = dataclasses.replace(planner.config, logit_bias={})
    assert planner.chat_kwargs()["logit_bias_weight"] == 0.0


# -- what comes out --------------------------------------------------------------------------------------------


def test_a_one_task_plan_is_a_plan_not_a_chat_reply(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX]))
    planner, state, events = make(tmp_path, llm)
    planned = planner.plan(state)
    assert planned.reply is None and planned.plan.to_list() == [FOX]
    assert llm.stage_requests("chitchat") == []
    [(name, event)] = events
    assert name == "plan" and event["tasks"] == [FOX]


def test_the_plan_event_carries_the_tasks_and_the_repairs_made(tmp_path, llm):
    llm.on("parse_task", json.dumps([{**FOX, "task": "image-generation"}]))
    planner, state, events = make(tmp_path, llm)
    planner.plan(state)
    [(name, event)] = events
    assert name == "plan" and event["tasks"] == [FOX]
    assert event["notes"] == ["task 0: task type 'image-generation' read as 'text-to-image'"]


def test_a_plan_of_exactly_max_tasks_runs_and_one_more_is_refused_with_the_reason(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, CAPTION]))
    planner, state, _ = make(tmp_path, llm, max_tasks=2)
    assert planner.plan(state).plan.to_list() == [FOX, CAPTION]
    llm.on("parse_task", json.dumps([FOX, CAPTION, {**CAPTION, "id": 2}]))
    planner, state, events = make(tmp_path, llm, max_tasks=2)
    planned = planner.plan(state)
    assert planned.plan is None
    assert planned.reply == ("The plan for this request has 3 tasks; this server runs at most 2 per request "
                             "(max_tasks), so nothing was run. Ask for fewer steps at once.")
    assert events == []


def test_a_conversational_reply_streams_its_tokens_as_answer_events_at_a_warmer_temperature(tmp_path, llm):
    llm.on("parse_task", "There is nothing to run for this; just chatting.")
    llm.on("chitchat", "hello there, fox friend")
    planner, state, events = make(tmp_path, llm, [{"role": "user", "content": "hi"}])
    planned = planner.plan(state)
    assert planned.plan is None and planned.reply == "hello there, fox friend"
    assert {name for name, _ in events} == {"answer_token"}
    assert "".join(e["text"] for _, e in events) == "hello there, fox friend"
    [body] = [r["body"] for r in llm.stage_requests("chitchat")]
    assert body["temperature"] == 0.7 and body.get("stream") is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_with_nobody_listening_the_conversational_reply_is_not_streamed_by_a_hosted_llm(tmp_path, llm):
    """(A local server's calls are always streamed, so that one whose caller left stops: test_local_backend.py.)"""
    llm.on("chitchat", "hello there")
    planner, state, _ = make(tmp_path, llm, [{"role": "user", "content": "hi"}], listen=False, dev=False,
                             openai={"api_key": "sk-test-0123456789", "base_url": llm.base_url + "/v1"})
    assert state.llm.settings.api_type == "openai"
    assert planner.plan(state).reply == "hello there"
    [body] = [r["body"] for r in llm.stage_requests("chitchat")]
    assert not body.get("stream") and "max_tokens" not in body


# -- the streamed plan against the full one ----------------------------------------------------------------------


def test_a_task_the_stream_could_not_start_does_not_stop_those_that_started(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, CAPTION, SUMMARY]))  # a text task never starts early
    planner, state, _ = make(tmp_path, llm)
    sink = Sink()
    planned = planner.plan(state, sink)
    assert [t.id for t in sink.started] == [0, 1] and sink.stops == 0
    assert planned.streamed == frozenset({0, 1}) and planned.plan.to_list() == [FOX, CAPTION, SUMMARY]


def test_a_started_task_that_is_not_the_one_the_plan_will_run_is_stopped_and_the_plan_starts_over(
        tmp_path, llm, caplog):
    caplog.set_level(logging.INFO, logger="hugginggpt.planner")
    llm.on("parse_task", json.dumps([CANNY]))
    planner, state, events = make(tmp_path, llm)
    sink = Sink()  # starts the task as streamed; the plan runs it as canny-control
    planned = planner.plan(state, sink)
    assert [t.task for t in sink.started] == ["canny-text-to-image"] and sink.stops == 1
    assert planned.streamed == frozenset()
    assert planned.plan.to_list() == [{**CANNY, "task": "canny-control"}]
    rid = state.request.request_id
    assert f"[{rid}] the full plan differs from the streamed tasks [0]; starting over" in logged(caplog)
    assert [name for name, _ in events] == ["plan"]


def test_a_task_started_from_an_example_the_full_plan_does_not_hold_is_stopped(tmp_path, llm, caplog):
    """The stream reads the first array in the reply; the full parse prefers a fenced block: an example in the
    prose before it is started early but is no task of the plan."""
    caplog.set_level(logging.INFO, logger="hugginggpt.planner")
    example = {"task": "text-to-image", "id": 5, "dep": [-1], "args": {"text": "a cat"}}
    llm.on("parse_task", f"A cat would be {json.dumps([example])}. Yours:\n```json\n{json.dumps([FOX])}\n```")
    planner, state, events = make(tmp_path, llm)
    sink = Sink()
    planned = planner.plan(state, sink)
    assert [t.id for t in sink.started] == [5] and sink.stops == 1
    assert planned.streamed == frozenset() and planned.plan.to_list() == [FOX]
    rid = state.request.request_id
    assert f"[{rid}] the full plan differs from the streamed tasks [5]; starting over" in logged(caplog)


def test_a_started_task_the_sink_fixed_up_as_the_plan_will_run_it_keeps_running(tmp_path, llm):
    llm.on("parse_task", json.dumps([CANNY]))
    planner, state, _ = make(tmp_path, llm)
    sink = Sink(fixup=True)
    planned = planner.plan(state, sink)
    assert sink.stops == 0 and planned.streamed == frozenset({0})
    assert planned.plan.tasks[0] is sink.started[0] and planned.plan.tasks[0].task == "canny-control"


# -- replanning a plan that cannot run ---------------------------------------------------------------------------


def test_a_broken_plan_is_replanned_with_every_problem_named(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, EDIT, TELEPORT]))
    llm.on("parse_task", json.dumps([FOX, CAPTION]), contains="cannot run as written")
    planner, state, events = make(tmp_path, llm)
    planned = planner.plan(state)
    assert planned.plan.to_list() == [FOX, CAPTION]
    [replan] = [e for name, e in events if name == "replan"]
    problems = replan["reason"].removeprefix("the plan cannot run as written: ")
    assert problems != replan["reason"]
    assert problems.startswith("task 1 (image-editing): unknown task type 'image-editing'")
    assert "; task 2 (teleport): unknown task type 'teleport'" in problems
    asked = planner_asked(llm)[-1]["messages"]
    assert asked[-2] == {"role": "assistant", "content": json.dumps([FOX, EDIT, TELEPORT])}
    assert asked[-1]["content"].startswith(f"The plan cannot run as written: {problems}.\nWrite a new JSON task list")
    assert "Number its tasks from 0. " in asked[-1]["content"]


def test_a_replan_that_is_no_plan_leaves_the_original_plan_with_its_problems(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, EDIT]))
    llm.on("parse_task", "Sorry, I cannot do better.", contains="cannot run as written")
    planner, state, events = make(tmp_path, llm)
    planned = planner.plan(state)
    assert [t.task for t in planned.plan.tasks] == ["text-to-image", "image-editing"]
    assert planned.plan.tasks[1].error and "replan" not in [name for name, _ in events]


def test_a_replan_that_still_cannot_run_leaves_the_original_plan(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, EDIT]))
    llm.on("parse_task", json.dumps([FOX, TELEPORT]), contains="cannot run as written")
    planner, state, events = make(tmp_path, llm)
    planned = planner.plan(state)
    assert [t.task for t in planned.plan.tasks] == ["text-to-image", "image-editing"]
    assert "replan" not in [name for name, _ in events]


def test_a_planning_replan_spends_one_of_the_requests_replans(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, EDIT]))
    llm.on("parse_task", json.dumps([FOX, CAPTION]), contains="cannot run as written")
    planner, state, _ = make(tmp_path, llm, max_replans=2)
    planner.plan(state)
    assert state.replan_attempts == 1 and planner.replanner.allowed(state)  # one left for failed tasks
    planner, state, _ = make(tmp_path, llm, max_replans=2)
    state.replan_attempts = 1  # one already spent
    planner.plan(state)
    assert len(planner_asked(llm)) == 4 and not planner.replanner.allowed(state)


# -- what the operator reads in the log ---------------------------------------------------------------------------


def test_the_log_has_what_the_planner_said_and_each_repair(tmp_path, llm, caplog):
    caplog.set_level(logging.DEBUG, logger="hugginggpt.planner")
    reply = json.dumps([{**FOX, "task": "image-generation"}])
    llm.on("parse_task", reply)
    planner, state, _ = make(tmp_path, llm)
    planner.plan(state)
    rid = state.request.request_id
    assert logged(caplog) == [f"[{rid}] planner said: {reply}",
                              f"[{rid}] plan: task 0: task type 'image-generation' read as 'text-to-image'"]


def test_the_log_says_why_a_reply_without_a_task_list_is_answered_as_chat(tmp_path, llm, caplog):
    caplog.set_level(logging.INFO, logger="hugginggpt.planner")
    llm.on("parse_task", "Just chatting, no tasks.")
    planner, state, _ = make(tmp_path, llm)
    planner.plan(state)
    rid = state.request.request_id
    assert logged(caplog) == [f"[{rid}] no task list in the plan (no JSON in the planner's reply); "
                              "answering conversationally"]
