"""Demos picked per request (hugginggpt/demopick.py) and where they sit in the planner's prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hugginggpt.catalog.embedders import HashEmbedder
from hugginggpt.config import load_config
from hugginggpt.demopick import DemoPool
from hugginggpt.errors import ConfigError
from hugginggpt.prompts import PromptSet
from tests.conftest import make_public, write_config

ROOT = Path(__file__).resolve().parent.parent
POOL = [
    {"request": "transcribe the meeting recording audio and summarize it",
     "plan": [{"task": "automatic-speech-recognition", "id": 0, "dep": [-1], "args": {"audio": "a.wav"}},
              {"task": "summarization", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}]},
    {"request": "draw a picture of a red fox in the snow",
     "plan": [{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox in the snow"}}]},
    {"request": "translate this sentence into german",
     "plan": [{"task": "translation", "id": 0, "dep": [-1], "args": {"text": "this sentence"}}]},
]


def pool_file(tmp_path, items=POOL) -> Path:
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(items))
    return path


def test_the_closest_demos_are_picked_and_the_closest_comes_last(tmp_path):
    pool = DemoPool.load(pool_file(tmp_path), HashEmbedder())
    picked = pool.pick("please draw a picture of a fox", 2)
    assert len(picked) == 2 and picked[-1].request == POOL[1]["request"]
    assert pool.pick("transcribe my recording audio", 1)[0].request == POOL[0]["request"]
    assert pool.pick("anything", 0) == [] and len(pool.pick("anything", 10)) == 3


def test_a_demo_reply_is_the_plan_in_the_schema_form(tmp_path):
    demo = DemoPool.load(pool_file(tmp_path), HashEmbedder()).demos[0]
    assert json.loads(demo.reply()) == {"tasks": POOL[0]["plan"]}


@pytest.mark.parametrize("items, message", [
    ({"request": "x"}, "item 0 must be"),
    ([{"request": "x", "plan": "not a list"}], "item 0 must be"),
    ([], "empty"),
    ([{"request": "caption it", "plan": [{"task": "image-to-text", "id": 0, "dep": [0],
                                          "args": {"image": "<GENERATED>-0"}}]}], "cannot run"),
])
def test_a_bad_pool_is_refused_at_start_with_its_path(tmp_path, items, message):
    with pytest.raises(ConfigError, match=message):
        DemoPool.load(pool_file(tmp_path, items), HashEmbedder())


def test_the_shipped_pool_loads_and_every_plan_in_it_can_run():
    pool = DemoPool.load(ROOT / "demos" / "plan_pool.json", HashEmbedder())
    assert len(pool.demos) >= 40
    from hugginggpt.plan import kind_problems, tasks_from_json

    for demo in pool.demos:
        assert kind_problems(tasks_from_json(list(demo.plan))) == [], demo.request


def test_picked_demos_sit_after_the_fixed_prompt_and_before_the_request(tmp_path):
    path = write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", make_public(tmp_path / "public"),
                        planner_demos=2, planner_demo_pool=str(pool_file(tmp_path)))
    config = load_config(path)
    prompts = PromptSet.from_config(config, HashEmbedder())
    messages = prompts.parse_task([], "draw a fox please", "scripted")
    fixed = 1 + len(prompts.demos["parse_task"])
    assert messages[0]["role"] == "system" and messages[-1]["content"].count("draw a fox please") == 1
    picked = messages[fixed:-1]
    assert [m["role"] for m in picked] == ["user", "assistant"] * 2
    assert "red fox" in picked[-2]["content"] and json.loads(picked[-1]["content"])["tasks"][0]["task"] == "text-to-image"
    other = prompts.parse_task([], "transcribe the recording", "scripted")
    assert other[:fixed] == messages[:fixed]  # the fixed prefix a server's cache keeps is the same for both


def test_planner_demos_must_not_be_negative(tmp_path):
    path = write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", make_public(tmp_path / "public"),
                        planner_demos=-1)
    with pytest.raises(ConfigError, match="planner_demos"):
        load_config(path)
