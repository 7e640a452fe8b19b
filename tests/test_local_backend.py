"""What a local LLM server (llama.cpp, Ollama, vLLM) gets from us, through the real openai client against the
scripted server: a grammar-friendly plan schema, a token cap on every stage, streamed calls (so a caller that
leaves frees the server), no retry behind a call that timed out, and a repair round for mistyped inputs."""

from __future__ import annotations

import json

import pytest

from hugginggpt.config import load_config
from hugginggpt.errors import LLMError
from hugginggpt.llm import LLMClient
from hugginggpt.plan import ARG_KEYS
from hugginggpt.planner import Planner, plan_token_cap
from hugginggpt.prompts import PromptSet
from hugginggpt.replan import Replanner
from hugginggpt.request import ChatRequest, RequestState
from tests.conftest import make_public, write_config

CAPTION = {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/a.jpg"}}
SPEAK = {"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}
# what the real 1.5B model wrote for "caption /examples/a.jpg and draw it again": the caption (text) as an image
MISTYPED = {"task": "image-to-image", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}
REDRAWN = {"task": "text-to-image", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}


def make(tmp_path, llm, hosted=False, **config):
    extra = {"dev": False, "openai": {"api_key": "sk-test-0123456789", "base_url": llm.base_url + "/v1"}} \
        if hosted else {}
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", make_public(tmp_path / "public"),
                                      **extra, **config))
    planner = Planner(config, PromptSet.from_config(config), Replanner(config.max_replans))
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "caption a.jpg"}]}),
                         LLMClient(config.llm), None, 30)
    return planner, state


def plan_bodies(llm) -> list[dict]:
    return [r["body"] for r in llm.stage_requests("parse_task")]


def test_a_local_planner_call_is_streamed_capped_and_asks_for_optional_arguments(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}))
    planner, state = make(tmp_path, llm, max_tasks=5)
    assert planner.plan(state).plan.to_list() == [CAPTION]
    [body] = plan_bodies(llm)
    assert body["stream"] is True  # nobody listens to tokens, yet it streams: a caller that leaves stops it
    assert body["max_tokens"] == plan_token_cap(5) == 416
    schema = body["response_format"]["json_schema"]["schema"]
    tasks = schema["properties"]["tasks"]
    assert tasks["maxItems"] == 5
    branches = {name: b["properties"]["args"] for b in tasks["items"]["anyOf"] for name in b["properties"]["task"]["enum"]}
    assert branches["image-to-text"] == {"type": "object", "properties": {"image": {"type": "string"}},
                                         "required": ["image"], "additionalProperties": False}
    assert branches["visual-question-answering"]["required"] == ["image", "text"]


def test_planner_max_tokens_still_sets_a_local_plans_cap(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}))
    planner, state = make(tmp_path, llm, planner_max_tokens=123)
    planner.plan(state)
    assert plan_bodies(llm)[0]["max_tokens"] == 123


def test_a_hosted_planner_keeps_openai_strict_schema_and_no_cap(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}))
    planner, state = make(tmp_path, llm, hosted=True)
    assert state.llm.settings.api_type == "openai"
    planner.plan(state)
    [body] = plan_bodies(llm)
    args = body["response_format"]["json_schema"]["schema"]["properties"]["tasks"]["items"]["properties"]["args"]
    assert args["required"] == list(ARG_KEYS) and "max_tokens" not in body
    assert "maxItems" not in body["response_format"]["json_schema"]["schema"]["properties"]["tasks"]


def test_an_input_of_the_wrong_kind_is_shown_to_the_planner_once_and_its_fix_is_used(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION, MISTYPED]}), times=1)
    llm.on("parse_task", json.dumps({"tasks": [CAPTION, REDRAWN]}), contains="makes text, not an image")
    planner, state = make(tmp_path, llm)
    planned = planner.plan(state)
    assert planned.plan.to_list() == [CAPTION, REDRAWN]
    second = plan_bodies(llm)[1]["messages"][-1]["content"]
    assert "task 1 (image-to-image): its image argument is <GENERATED>-0, but task 0 (image-to-text) makes text" \
        in second
    assert state.replans and "image-to-image" not in json.dumps(planned.plan.to_list())


def test_a_task_without_the_input_it_runs_on_is_repaired_too(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [{"task": "image-to-text", "id": 0, "dep": [-1],
                                                 "args": {"text": "a.jpg"}}]}), times=1)
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}), contains="needs an image argument")
    planner, state = make(tmp_path, llm)
    assert planner.plan(state).plan.to_list() == [CAPTION]


def test_a_mistyped_plan_whose_repair_is_no_better_runs_as_written(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION, MISTYPED]}))
    planner, state = make(tmp_path, llm)
    assert planner.plan(state).plan.to_list() == [CAPTION, MISTYPED]
    assert len(plan_bodies(llm)) == 2  # asked once more, never a third time


def test_a_local_call_that_times_out_is_not_retried_behind_itself(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}), delay=3)
    planner, state = make(tmp_path, llm, llm_timeout=1, llm_max_retries=3)
    with pytest.raises(LLMError, match="timed out after 1s \\(not retried"):
        state.llm.chat([{"role": "system", "content": "#1 plan"}, {"role": "user", "content": "x"}])
    assert len(plan_bodies(llm)) == 1


def test_a_hosted_call_that_times_out_is_retried(tmp_path, llm):
    llm.on("parse_task", json.dumps({"tasks": [CAPTION]}))
    llm.on("parse_task", "late", delay=1.5, times=1)  # the first call times out; its retry is answered at once
    planner, state = make(tmp_path, llm, hosted=True, llm_timeout=1, llm_max_retries=2)
    assert "image-to-text" in state.llm.chat([{"role": "system", "content": "#1 plan"}, {"role": "user", "content": "x"}])
    assert len(plan_bodies(llm)) == 2


@pytest.mark.parametrize("stage, cap", [("response_results", 700), ("choose_model", 160)])
def test_the_answer_and_the_choice_are_capped_on_a_local_backend(tmp_path, llm, stage, cap):
    from hugginggpt.llm import stage_cap

    _, state = make(tmp_path, llm)
    assert stage_cap(state.llm.settings, "answer" if stage == "response_results" else stage) == cap
    _, hosted = make(tmp_path / "h", llm, hosted=True)
    assert stage_cap(hosted.llm.settings, "answer") is None
