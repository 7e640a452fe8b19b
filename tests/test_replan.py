"""Recovery by replanning: an invalid plan, and a task whose every model failed, get one more planner call."""

from __future__ import annotations

import json

import requests

from tests.conftest import start_server, stop_server, write_config


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def plan(*tasks, first: int = 0) -> str:
    return json.dumps([{"task": t, "id": first + i, "dep": d, "args": a} for i, (t, d, a) in enumerate(tasks)])


SDXL = "stabilityai/stable-diffusion-xl-base-1.0"


def test_an_invalid_plan_is_replanned_before_anything_runs(server, llm, models):
    llm.on("parse_task", plan(("image-editing", [-1], {"image": "/examples/red.png", "text": "make it blue"})))
    llm.on("parse_task", plan(("image-to-image", [-1], {"image": "/examples/red.png", "text": "make it blue"})),
           contains="cannot run as written")
    with requests.post(server.url + "/hugginggpt", json=ask("make it blue", stream=True), stream=True,
                       timeout=30) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: {")]
    replans = [e for e in events if e.get("event") == "replan"]
    assert len(replans) == 1 and "unknown task type 'image-editing'" in replans[0]["reason"]
    assert [e["tasks"][0]["task"] for e in events if e.get("event") == "plan"] == ["image-to-image"]
    answer = next(e for e in events if e.get("event") == "answer")["message"]
    assert "Replanned after: the plan cannot run as written" in answer
    assert len(llm.stage_requests("parse_task")) == 2


def test_a_replan_that_cannot_run_either_is_not_taken(server, llm, models):
    llm.on("parse_task", plan(("image-editing", [-1], {"image": "/examples/red.png", "text": "make it blue"})))
    llm.on("parse_task", plan(("image-magic", [-1], {"image": "/examples/red.png", "text": "make it blue"})),
           contains="cannot run as written")
    tasks = server.post("/tasks", ask("make it blue")).json()
    assert [t["task"] for t in tasks] == ["image-editing"]  # the first plan stands; its task fails with the reason
    assert len(llm.stage_requests("parse_task")) == 2


def test_a_task_that_failed_on_every_model_is_replanned_once(server, llm, models):
    models.models = {SDXL: "text-to-image", "dslim/bert-base-NER": "token-classification",
                     "microsoft/speecht5_tts": "text-to-speech"}
    models.broken.add(SDXL)
    llm.on("parse_task", plan(("token-classification", [-1], {"text": "Anna lives in Berlin"}),
                              ("text-to-image", [-1], {"text": "Berlin at night"})))
    llm.on("parse_task", plan(("text-to-speech", [-1], {"text": "<GENERATED>-0"}), first=2),
           contains="could not be run")
    results = server.post("/results", ask("tag it and draw Berlin")).json()
    assert "every candidate failed" in results["1"]["inference result"]["error"]["message"]
    assert "error" not in results["0"]["inference result"]  # finished work is kept, not run again
    assert "error" not in results["2"]["inference result"]
    assert json.loads(results["2"]["task"]["args"]["text"])[0]["word"] == "Anna"  # task 0's output, reused
    replan_prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    assert "Number its tasks from 2" in replan_prompt and "<GENERATED>-k" in replan_prompt
    assert [c["model"] for c in models.calls].count("dslim/bert-base-NER") == 1


def test_a_second_failure_ends_with_a_clear_answer(server, llm, models):
    models.models = {SDXL: "text-to-image"}
    models.broken.add(SDXL)
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox"})))
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox, again"}), first=1), contains="could not be run")
    answer = server.post("/hugginggpt", ask("draw a fox")).json()["message"]
    assert "Replanned after: task 0 (text-to-image) could not be run" in answer
    assert "still failed after 1 replan attempt(s) (max_replans: 1)" in answer
    assert len(llm.stage_requests("parse_task")) == 2  # one replan, not more


def test_max_replans_zero_turns_it_off(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                    max_replans=0), tmp_path)
    try:
        models.models = {SDXL: "text-to-image"}
        models.broken.add(SDXL)
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox"})))
        answer = srv.post("/hugginggpt", ask("draw a fox")).json()["message"]
        assert "Replanned" not in answer and len(llm.stage_requests("parse_task")) == 1
        # nor is a plan that cannot run as written replanned
        llm.on("parse_task", plan(("image-editing", [-1], {"image": "/examples/red.png", "text": "make it blue"})))
        tasks = srv.post("/tasks", ask("make it blue")).json()
        assert tasks[0]["task"] == "image-editing" and len(llm.stage_requests("parse_task")) == 2
    finally:
        stop_server(srv)


def test_a_replan_never_runs_a_model_that_already_failed_in_the_request(server, llm, models):
    models.models = {SDXL: "text-to-image", "Salesforce/blip-image-captioning-large": "image-to-text"}
    models.broken.add(SDXL)
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox"})))
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox, again"}), first=1), contains="could not be run")
    results = server.post("/results", ask("draw a fox")).json()
    assert [c["model"] for c in models.calls].count(SDXL) == 1  # the replan's task did not try it again
    assert "no available model for text-to-image" in results["1"]["inference result"]["error"]["message"]


def test_a_replan_may_not_reuse_the_ids_of_tasks_that_already_ran(server, llm, models):
    """The replan names its tasks from first_id on: one that reuses a finished task's id (or the failed one's) is
    refused whole, so nothing that already ran is overwritten."""
    models.models = {SDXL: "text-to-image", "dslim/bert-base-NER": "token-classification",
                     "microsoft/speecht5_tts": "text-to-speech"}
    models.broken.add(SDXL)
    llm.on("parse_task", plan(("token-classification", [-1], {"text": "Anna lives in Berlin"}),
                              ("text-to-image", [-1], {"text": "Berlin at night"})))
    for reused in (0, 1):  # 0 finished; 1 failed (both below first_id 2)
        llm.on("parse_task", plan(("text-to-speech", [-1], {"text": "say hi"}), first=reused),
               contains="could not be run")
        results = server.post("/results", ask("tag it and draw Berlin")).json()
        assert sorted(results) == ["0", "1"], reused
        assert results["0"]["task"]["task"] == "token-classification" and "error" not in results["0"]["inference result"]
        assert results["1"]["task"]["task"] == "text-to-image"
        assert "every candidate failed" in results["1"]["inference result"]["error"]["message"]
        assert "microsoft/speecht5_tts" not in [c["model"] for c in models.calls]
    assert len(llm.stage_requests("parse_task")) == 4  # each request asked for its replan once


def test_a_replan_over_max_tasks_is_not_run(server, llm, models):
    """max_tasks bounds the replan as it bounds the first plan: a runaway replan runs nothing."""
    models.models = {SDXL: "text-to-image", "dslim/bert-base-NER": "token-classification"}
    models.broken.add(SDXL)
    llm.on("parse_task", plan(("token-classification", [-1], {"text": "Anna lives in Berlin"}),
                              ("text-to-image", [-1], {"text": "Berlin at night"})))
    runaway = [("token-classification", [-1], {"text": f"name {n}"}) for n in range(40)]  # max_tasks is 32
    llm.on("parse_task", plan(*runaway, first=2), contains="could not be run")
    results = server.post("/results", ask("tag it and draw Berlin")).json()
    assert sorted(results, key=int) == ["0", "1"]
    assert [c["model"] for c in models.calls].count("dslim/bert-base-NER") == 1


def test_a_replan_the_deadline_cuts_answers_with_what_finished(tmp_path, llm, models, models_server, public_dir):
    """The LLM still replanning when the request's deadline passes: the client gets what finished (200), not a
    504 that throws away the work already done."""
    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                    request_timeout=6), tmp_path)
    try:
        models.models = {SDXL: "text-to-image", "dslim/bert-base-NER": "token-classification"}
        models.broken.add(SDXL)
        llm.on("parse_task", plan(("token-classification", [-1], {"text": "Anna lives in Berlin"}),
                                  ("text-to-image", [-1], {"text": "Berlin at night"})))
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": "again"}), first=2), contains="could not be run",
               delay=30)  # the replan answers long after the deadline
        resp = srv.post("/results", ask("tag it and draw Berlin"), timeout=25)
        assert resp.status_code == 200, resp.text
        results = resp.json()
        assert sorted(results) == ["0", "1"]
        assert "error" not in results["0"]["inference result"]  # the finished task is in the answer
        assert "every candidate failed" in results["1"]["inference result"]["error"]["message"]
        assert len(llm.stage_requests("parse_task")) == 2  # the replan was asked for, and cut
    finally:
        stop_server(srv)
