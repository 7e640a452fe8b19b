"""`<GENERATED>-N` resolution: which output of task N an argument gets, and JARVIS's fallback."""

from __future__ import annotations

import json

import pytest

from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import ChatRequest, HuggingGPT
from hugginggpt.config import load_config
from tests.conftest import make_public, write_config

OUTPUTS = {
    # image-to-text answers with several text fields: "generated text" must win
    "image-to-text": {"generated text": "from-generated-text", "text": "from-text", "answer": "from-answer"},
    # text-to-image produces no text at all
    "text-to-image": {"generated image": "/examples/red.png"},
    "token-classification": {"predicted": [{"word": "ok"}]},
}


class ScriptedBackend:
    """Answers each task type with fixed outputs and records what it was asked."""

    name = "local"

    def __init__(self):
        self.seen: list[tuple[str, str | None]] = []

    def is_available(self, model_id: str) -> bool:
        return True

    def infer(self, model_id, inputs):
        self.seen.append((inputs.task, inputs.text))
        return dict(OUTPUTS[inputs.task])


@pytest.fixture
def engine(tmp_path, llm):
    public = make_public(tmp_path / "public")
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public, num_candidate_models=1))
    backend = ScriptedBackend()
    return HuggingGPT(config, ranker=KeywordRanker(), backends={"local": backend}), backend


def run(engine, llm, tasks) -> dict:
    llm.on("parse_task", json.dumps(tasks))
    return engine.run(ChatRequest.from_body({"messages": [{"role": "user", "content": "go"}]}), "results")


def test_generated_text_is_preferred_over_other_text_fields(engine, llm):
    eng, backend = engine
    results = run(eng, llm, [
        {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
        {"task": "token-classification", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
    ])
    assert results[1]["task"]["args"]["text"] == "from-generated-text"
    assert ("token-classification", "from-generated-text") in backend.seen


def test_a_dependency_without_text_falls_back_to_its_own_input(engine, llm):
    """JARVIS: when task N made no text, the argument gets task N's own text input."""
    eng, _ = engine
    results = run(eng, llm, [
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox in the snow"}},
        {"task": "token-classification", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
    ])
    assert "error" not in results[1]["inference result"], results[1]
    assert results[1]["task"]["args"]["text"] == "a red fox in the snow"


def test_an_image_argument_takes_the_generated_image(engine, llm):
    eng, _ = engine
    results = run(eng, llm, [
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    ])
    assert results[1]["task"]["args"]["image"] == "/examples/red.png"
