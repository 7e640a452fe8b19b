"""Replies a real small LLM wrote (Qwen2.5-Coder-1.5B-Instruct Q4_K_M on llama.cpp, recorded once by
bench/record_replies.py into tests/fixtures/small_llm_replies.json), replayed through the scripted LLM server
and the real answer stage. Each broke an answer before the answer was held to the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hugginggpt.config import load_config
from hugginggpt.llm import LLMClient
from hugginggpt.prompts import PromptSet
from hugginggpt.respond import write_answer
from tests.conftest import make_public, write_config

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "small_llm_replies.json").read_text())
CASES = {case["name"]: case for case in FIXTURES["cases"]}


def answer_for(tmp_path, llm, case) -> str:
    llm.on("response_results", case["reply"])
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", make_public(tmp_path / "public")))
    results = {int(k): v for k, v in case["results"].items()}
    from hugginggpt.request import ChatRequest, RequestState

    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": case["request"]}]}),
                         LLMClient(config.llm), None, 30)
    return write_answer(state.llm, PromptSet.from_config(config), case["request"], results, 30)


def test_the_fixtures_are_the_real_models_replies():
    assert FIXTURES["model"] == "qwen2.5-coder-1.5b-instruct-q4_k_m" and set(CASES) == {"files", "failed"}


def test_an_answer_that_names_no_file_still_gives_every_file_as_served(tmp_path, llm):
    case = CASES["files"]
    assert "/images/" not in case["reply"]  # what the model wrote: it named neither file
    answer = answer_for(tmp_path, llm, case)
    assert answer.startswith(case["reply"].strip())
    assert "/images/5f2a9c.png (task 0, text-to-image)" in answer
    assert "/audios/0b7e41.wav (task 1, text-to-speech)" in answer


def test_an_answer_that_describes_a_failed_caption_reports_the_failure(tmp_path, llm):
    case = CASES["failed"]
    assert "fail" not in case["reply"].lower()  # what the model wrote: a caption nobody made
    answer = answer_for(tmp_path, llm, case)
    assert "Task 0 (image-to-text) failed: every candidate failed" in answer
    assert "Task 1 (text-to-speech) failed: skipped" in answer


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_answer_stage_is_capped_for_the_local_backend(tmp_path, llm, name):
    answer_for(tmp_path, llm, CASES[name])
    [asked] = llm.stage_requests("response_results")
    assert asked["body"]["max_tokens"] == 700
