"""Stage 1 alone: the Planner with plain data in (a request's state) and out (a plan or a reply)."""

from __future__ import annotations

import json

from hugginggpt.config import load_config
from hugginggpt.llm import LLMClient
from hugginggpt.planner import Planner
from hugginggpt.prompts import PromptSet
from hugginggpt.replan import Replanner
from hugginggpt.request import ChatRequest, RequestState
from tests.conftest import make_public, write_config

FOX = {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}
CAPTION = {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}


class RecordingSink:
    """Records what starts; with a state, says so as the real sink's tasks do (events held until the plan)."""

    def __init__(self, state=None):
        self.started = []
        self.stops = 0
        self.state = state

    def start(self, task):
        self.started.append(task)
        if self.state is not None:
            self.state.emit("task_started", {"id": task.id})

    def stop(self):
        self.stops += 1


def make(tmp_path, llm, text="draw a fox and caption it"):
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", make_public(tmp_path / "public")))
    planner = Planner(config, PromptSet.from_config(config), Replanner(config.max_replans))
    events: list[tuple[str, dict]] = []
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": text}]}),
                         LLMClient(config.llm), lambda name, e: events.append((name, e)), 30)
    return planner, state, events


def test_a_plan_comes_out_as_plain_tasks_and_is_announced(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, CAPTION]))
    planner, state, events = make(tmp_path, llm)
    planned = planner.plan(state)
    assert planned.reply is None and planned.streamed == frozenset()
    assert planned.plan.to_list() == [FOX, CAPTION]
    assert [name for name, _ in events] == ["plan"]


def test_streamed_final_tasks_go_to_the_sink_and_are_the_plans_own_objects(tmp_path, llm):
    llm.on("parse_task", json.dumps([FOX, CAPTION]))
    planner, state, _ = make(tmp_path, llm)
    sink = RecordingSink()
    planned = planner.plan(state, sink)
    assert [t.id for t in sink.started] == [0, 1] and sink.stops == 0
    assert planned.streamed == frozenset({0, 1})
    assert all(a is b for a, b in zip(planned.plan.tasks, sink.started, strict=True))  # the very objects that run


def test_a_full_plan_that_cannot_run_stops_the_sink_and_is_replanned(tmp_path, llm):
    broken = [FOX, {"task": "image-editing", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}]
    llm.on("parse_task", json.dumps(broken))
    llm.on("parse_task", json.dumps([FOX, CAPTION]), contains="cannot run as written")
    planner, state, events = make(tmp_path, llm)
    sink = RecordingSink(state)
    planned = planner.plan(state, sink)
    assert [t.id for t in sink.started] == [0] and sink.stops == 1  # task 0 had started; it was stopped
    assert planned.streamed == frozenset() and planned.plan.to_list() == [FOX, CAPTION]
    assert [name for name, _ in events] == ["replan", "plan"]  # the stopped task's held events are dropped


def test_a_plan_that_turns_into_a_lone_text_task_is_a_chat_reply_and_the_sink_stops_once(tmp_path, llm):
    broken = [FOX, {"task": "image-editing", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}]
    llm.on("parse_task", json.dumps(broken))
    llm.on("parse_task", json.dumps([{"task": "summarization", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]),
           contains="cannot run as written")
    planner, state, events = make(tmp_path, llm, "tell me about foxes")
    sink = RecordingSink()
    planned = planner.plan(state, sink)
    assert planned.plan is None and planned.reply.startswith("CHITCHAT: tell me about foxes")
    assert sink.stops == 1
    assert "plan" not in [name for name, _ in events]


def test_a_planner_error_stops_what_the_stream_started(tmp_path, llm):
    import pytest

    from hugginggpt.errors import LLMError

    llm.on("parse_task", json.dumps([FOX, CAPTION]))
    planner, state, _ = make(tmp_path, llm)
    sink = RecordingSink()

    def fail_after_first(task):
        sink.started.append(task)
        raise LLMError("the connection dropped")

    sink.start = fail_after_first
    with pytest.raises(LLMError):
        planner.plan(state, sink)
    assert sink.stops == 1


def test_a_plan_over_max_tasks_is_refused_at_once_and_what_streamed_is_stopped(tmp_path, llm):
    chain = [FOX] + [{"task": "image-to-text", "id": i, "dep": [i - 1], "args": {"image": f"<GENERATED>-{i - 1}"}}
                     for i in range(1, 40)]
    llm.on("parse_task", json.dumps(chain))
    planner, state, events = make(tmp_path, llm)
    sink = RecordingSink()
    planned = planner.plan(state, sink)
    assert planned.plan is None and "40 tasks" in planned.reply and "at most 32" in planned.reply
    assert len(sink.started) <= 32 and sink.stops == 1  # what had started was stopped
    assert "plan" not in [name for name, _ in events]


def test_an_error_raised_by_the_sink_surfaces_as_itself_not_as_the_llms_fault(tmp_path, llm):
    """The LLM answered well; our sink failed. A 4xx of ours stays a 4xx, and a bug of ours is not reported as
    "the LLM answered in an unexpected shape" (issue 20, round 2)."""
    import pytest

    from hugginggpt.errors import BadRequest, LLMError

    for error in (BadRequest("task 0 names a file this server does not have"), KeyError("a bug in our sink"),
                  ValueError("a bug in our sink")):
        llm.on("parse_task", json.dumps([FOX, CAPTION]))
        planner, state, _ = make(tmp_path, llm)
        sink = RecordingSink()

        def fail(task, error=error):
            raise error

        sink.start = fail
        with pytest.raises(Exception) as info:
            planner.plan(state, sink)
        assert info.value is error, f"{error!r} came out as {info.value!r}"
        assert not isinstance(info.value, LLMError)


def test_an_error_raised_by_on_token_is_not_blamed_on_the_llm(llm):
    """LLMClient.chat(on_token=...) against the scripted server: the callback's own error comes out."""
    import pytest

    from hugginggpt.config import LLMSettings

    llm.on("chitchat", "hello there")
    client = LLMClient(LLMSettings(api_type="local", endpoint=llm.base_url + "/v1", model="scripted", max_retries=0))
    pieces: list[str] = []
    assert client.chat([{"role": "user", "content": "hi"}], on_token=pieces.append) == "hello there"
    assert "".join(pieces) == "hello there"

    def broken(piece: str) -> None:
        raise TypeError("the display went away")

    with pytest.raises(TypeError, match="the display went away"):
        client.chat([{"role": "user", "content": "hi"}], on_token=broken)
