"""Stage 4 alone (respond.py): the answer the LLM writes, the notes it must carry, and the answer put together
from the results when the deadline leaves the LLM no time. The LLM is the scripted one on loopback."""

from __future__ import annotations

import time

from hugginggpt.config import load_config
from hugginggpt.llm import DeadlineLLM, LLMClient
from hugginggpt.prompts import PromptSet
from hugginggpt.request import ChatRequest, RequestState
from hugginggpt.respond import answer, deadline_answer, write_answer
from tests.conftest import make_public, write_config

RESULTS = {
    1: {"task": {"task": "token-classification"}, "choose model result": {"id": "dslim/bert-base-NER"},
        "inference result": {"error": {"message": "the model crashed"}}},
    0: {"task": {"task": "text-to-image"}, "choose model result": {"id": "sd"},
        "inference result": {"generated image": "/images/a.png"}},
}


def setup(tmp_path, llm):
    config = load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", make_public(tmp_path / "public")))
    return config, PromptSet.from_config(config), LLMClient(config.llm)


def test_deadline_answer_lists_every_task_in_order_with_what_it_produced():
    results = {
        **RESULTS,
        2: {"task": {"task": "image-to-text"}, "inference result": {"generated text": "a red square"}},
        3: {"task": {"task": "object-detection"}, "choose model result": "not a dict",
            "inference result": {"predicted": [{"label": "cat", "word": "été"}]}},
        4: {"task": {"task": "text-to-speech"},
            "inference result": {"generated audio": "/audios/b.wav", "text": "hello there"}},
        5: {"task": {}, "inference result": {}},
        6: {"inference result": {"error": "plain text error"}},
        7: {"task": {"task": "summarization"}, "inference result": None},
        8: {"task": {"task": "text-generation"}, "inference result": {"response": "r" * 600, "predicted": [1]}},
        9: {"task": {"task": "question-answering"}, "inference result": {"answer": "42", "predicted": None}},
        10: {"task": {"task": "text-to-video"}, "inference result": {"generated video": "/videos/c.mp4",
                                                                   "generated image": ""}},
        11: {"task": {"task": "x"}, "inference result": {"error": {"code": 3}}},
    }
    assert deadline_answer(results, 2.5) == "\n".join([
        "The request reached its 2.5 s deadline before the answer could be written. Here is what each task produced:",
        "- task 0 (text-to-image, sd): generated image /images/a.png",
        "- task 1 (token-classification, dslim/bert-base-NER): failed: the model crashed",
        "- task 2 (image-to-text): a red square",
        '- task 3 (object-detection): [{"label": "cat", "word": "été"}]',
        "- task 4 (text-to-speech): generated audio /audios/b.wav; hello there",
        "- task 5 (?): done",
        "- task 6 (?): failed: plain text error",
        "- task 7 (summarization): done",
        "- task 8 (text-generation): " + "r" * 500,
        "- task 9 (question-answering): 42",
        "- task 10 (text-to-video): generated video /videos/c.mp4",
        "- task 11 (x): failed: {'code': 3}",
    ])


def test_deadline_answer_cuts_long_predictions_and_names_whole_seconds_plainly():
    results = {0: {"task": {"task": "token-classification"}, "inference result": {"predicted": ["w" * 900]}}}
    text = deadline_answer(results, 30)
    assert text.startswith("The request reached its 30 s deadline")
    line = text.splitlines()[1]
    assert line == "- task 0 (token-classification): " + ('["' + "w" * 900)[:500]


def test_the_llm_writes_the_answer_streamed_token_by_token_with_the_notes_after(tmp_path, llm):
    _, prompts, client = setup(tmp_path, llm)
    llm.on("response_results", "  The fox is drawn: /images/a.png. The tagging failed.  ")
    events: list[tuple[str, dict]] = []
    message = write_answer(DeadlineLLM(client, time.monotonic() + 30), prompts, "draw a fox", RESULTS, 30,
                           lambda name, e: events.append((name, e)), ["Replanned task 1.", "Note two."])
    assert message == "The fox is drawn: /images/a.png. The tagging failed.\n\nReplanned task 1.\nNote two."
    tokens = "".join(e["text"] for name, e in events if name == "answer_token")
    assert tokens.strip() == "The fox is drawn: /images/a.png. The tagging failed."
    assert events[-1] == ("answer", {"message": message})
    asked = llm.stage_requests("response_results")[-1]["body"]["messages"]
    assert "draw a fox" in str(asked) and "/images/a.png" in str(asked)
    assert str(asked).index("/images/a.png") < str(asked).index("the model crashed")  # the results, in task order


def test_without_a_listener_nothing_is_emitted_and_no_notes_add_nothing(tmp_path, llm):
    _, prompts, client = setup(tmp_path, llm)
    done = "Done: /images/a.png; one task failed."  # true to RESULTS, so the answer check leaves it as it is
    llm.on("response_results", done)
    assert write_answer(DeadlineLLM(client, time.monotonic() + 30), prompts, "go", RESULTS, 30) == done
    assert write_answer(DeadlineLLM(client, time.monotonic() + 30), prompts, "go", RESULTS, 30, None, []) == done
    assert llm.stage_requests("response_results")[-1]["body"].get("stream") in (None, False)


def test_past_the_deadline_the_answer_is_put_together_from_the_results(tmp_path, llm):
    _, prompts, client = setup(tmp_path, llm)
    events: list[tuple[str, dict]] = []
    message = write_answer(DeadlineLLM(client, time.monotonic() - 1), prompts, "go", RESULTS, 7,
                           lambda name, e: events.append((name, e)), ["A note."])
    assert message == deadline_answer(RESULTS, 7) + "\n\nA note."
    assert events == [("answer", {"message": message})]
    assert llm.stage_requests("response_results") == []  # no time: the LLM is not asked


def test_the_answer_notes_replans_and_what_still_failed_after_them(tmp_path, llm):
    _, prompts, client = setup(tmp_path, llm)
    llm.on("response_results", "Answer: /images/a.png; a task failed.")
    events: list[tuple[str, dict]] = []
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "draw a fox"}]}),
                         client, lambda name, e: events.append((name, e)), 30)
    state.replans.append("Task 1 was replanned: another model.")
    state.replan_attempts = 2
    message = answer(state, prompts, RESULTS, 3)
    assert message == ("Answer: /images/a.png; a task failed.\n\nTask 1 was replanned: another model.\n"
                       "Some tasks still failed after 2 replan attempt(s) (max_replans: 3); their errors are above.")
    assert [e["message"] for name, e in events if name == "answer"] == [message]
    assert any(name == "answer_token" for name, _ in events)
    assert state.replans == ["Task 1 was replanned: another model."]  # the request's own list is left alone
    assert "draw a fox" in str(llm.stage_requests("response_results")[-1]["body"]["messages"])


def test_no_failure_note_when_every_task_succeeded_or_nothing_was_replanned(tmp_path, llm):
    _, prompts, client = setup(tmp_path, llm)
    llm.on("response_results", "Answer: /images/a.png; a task failed.")
    ok = {0: RESULTS[0]}
    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "go"}]}), client, None, 30)
    state.replan_attempts = 1
    assert answer(state, prompts, ok, 3) == "Answer: /images/a.png; a task failed."
    state.replan_attempts = 0
    # failed, but no replan was tried: no note
    assert answer(state, prompts, RESULTS, 3) == "Answer: /images/a.png; a task failed."
    assert llm.stage_requests("response_results")[-1]["body"].get("stream") in (None, False)  # nobody listens
