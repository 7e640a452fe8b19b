"""Server-sent events: order and content for a three-task DAG, a streamed answer, and disconnects."""

from __future__ import annotations

import json
import time

import requests

from tests.conftest import sse, wait_until

DAG = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
])


def test_events_for_a_three_task_dag(server, llm, models):
    llm.on("parse_task", DAG)
    t0 = time.perf_counter()
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                           "stream": True}, stream=True, timeout=30)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(resp)
    names = [n for n, _ in events]
    assert names[0] == "plan" and names[-1] == "done"
    assert names.index("answer") == len(names) - 2
    rid = {e["request_id"] for n, e in events if n != "done"}
    assert len(rid) == 1
    plan = events[0][1]
    assert [t["task"] for t in plan["tasks"]] == ["text-to-image", "image-to-text", "token-classification"]
    by = {(n, e.get("id")): e for n, e in events}
    for tid in (0, 1, 2):
        assert ("model_selected", tid) in by and ("task_started", tid) in by and ("task_finished", tid) in by
        assert names.index("plan") < [i for i, (n, e) in enumerate(events) if n == "task_started" and e["id"] == tid][0]
    pos = {(n, e.get("id")): i for i, (n, e) in enumerate(events)}
    assert pos[("task_finished", 0)] < pos[("task_started", 1)]  # dependency order
    fin1 = by[("task_finished", 1)]
    assert fin1["result"]["generated text"] == "a picture of 64x48 pixels" and fin1["seconds"] >= 0
    assert by[("model_selected", 0)]["model"] == "stabilityai/stable-diffusion-xl-base-1.0"
    assert by[("model_selected", 0)]["hosted_on"] == "local"
    tokens = "".join(e["text"] for n, e in events if n == "answer_token")
    answer = by[("answer", None)]["message"]
    assert tokens.strip() == answer and answer.startswith("ANSWER")  # streamed token by token
    assert sum(1 for n in names if n == "answer_token") > 5
    print("\n" + " ".join(f"{n}:{e.get('id', '')}@{e.get('t', 0):.2f}" for n, e in events if n != "answer_token"))
    print(f"\nfirst plan event after {plan['t'] * 1000:.1f} ms, first task_started after "
          f"{min(e['t'] for n, e in events if n == 'task_started') * 1000:.1f} ms (request took "
          f"{(time.perf_counter() - t0) * 1000:.0f} ms)")


def test_failed_and_skipped_tasks_stream_as_task_failed(server, llm, models):
    models.broken.add("stabilityai/stable-diffusion-xl-base-1.0")
    llm.on("parse_task", DAG)
    events = sse(requests.post(server.url + "/hugginggpt", json={
        "messages": [{"role": "user", "content": "go"}], "stream": True}, stream=True, timeout=30))
    failed = {e["id"]: e for n, e in events if n == "task_failed"}
    assert "crashed" in failed[0]["error"] and failed[1]["skipped"] is True and 2 not in failed


def test_stream_errors_arrive_as_an_error_event(server, llm):
    llm.fail(500, 500, 500, 500)
    events = sse(requests.post(server.url + "/hugginggpt", json={
        "messages": [{"role": "user", "content": "go"}], "stream": True}, stream=True, timeout=30))
    assert events[0][0] == "error" and "HTTP 500" in events[0][1]["error"]["message"]


def test_bad_stream_requests_are_plain_4xx(server):
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [], "stream": True}, timeout=10)
    assert resp.status_code == 400 and "empty" in resp.json()["error"]["message"]


def test_disconnect_cancels_the_work(server, llm, models):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 1.0
    llm.on("parse_task", json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    ]))
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                           "stream": True}, stream=True, timeout=30)
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: task_started"):
            break
    resp.close()  # the client goes away while task 0 runs
    wait_until(lambda: "client went away" in server.logs() and models.calls, what="task 0 ending after the client left")
    time.sleep(0.5)  # what must not happen has had its chance
    ran = [c["model"] for c in models.calls]
    assert "stabilityai/stable-diffusion-xl-base-1.0" in ran
    assert not any("caption" in m for m in ran)  # the dependent never started
    assert not llm.stage_requests("response_results")  # no answer was written for nobody
    assert "client went away" in server.logs()


def test_fallback_to_the_next_model_stops_once_the_request_is_cancelled(server, llm, models):
    """The first candidate fails after the client went away: the next one is not tried for nobody."""
    captioners = ["Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning"]
    for mid in captioners:  # whichever is chosen first (the ranking and each model's health decide) fails slowly
        models.broken.add(mid)
        models.delays[mid] = 3.0  # time enough for the server to notice the client left
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    went_away = server.logs().count("client went away")
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "caption"}],
                                                           "stream": True}, stream=True, timeout=30)
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("event: task_started"):
            break
    resp.close()  # the client goes away while the first candidate runs
    deadline = time.monotonic() + 30  # wide: a busy machine is slow to see the socket close
    while server.logs().count("client went away") == went_away or not models.calls:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.1)
    time.sleep(3.5)  # time enough for a fallback call to be made and recorded (calls are recorded as they end)
    assert len(models.calls) == 1 and models.calls[0]["model"] in captioners
    assert len(llm.stage_requests("parse_task")) == 1  # nor is the failure replanned for nobody


def test_a_request_cancelled_after_a_task_failed_for_good_is_not_replanned(server, llm, models):
    sdxl, ner = "stabilityai/stable-diffusion-xl-base-1.0", "dslim/bert-base-NER"
    models.broken.add(sdxl)  # fails at once, on its only candidate
    models.delays[ner] = 3.0
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
                                     {"task": "token-classification", "id": 1, "dep": [-1],
                                      "args": {"text": "Anna lives in Paris"}}]))
    went_away = server.logs().count("client went away")  # the server is the module's: earlier tests left too
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                           "stream": True}, stream=True, timeout=30)
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and '"event": "task_failed"' in line:
            break
    resp.close()  # the client goes away while task 1 still runs (or, on a busy machine, before it reaches its model)
    deadline = time.monotonic() + 30  # wide: a busy machine is slow to see the socket close
    while server.logs().count("client went away") == went_away:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.1)
    time.sleep(4.0)  # time enough for task 1's 3 s call to end and a replan to be asked for, were it to be
    assert len(llm.stage_requests("parse_task")) == 1  # task 0 failed for good, but nobody is there to replan for
    assert not llm.stage_requests("response_results")


def test_an_llm_still_writing_the_answer_at_the_request_deadline_is_cut_there(
        tmp_path, llm, models, models_server, public_dir):
    """An LLM that writes its answer a word every 0.1 s (some 20 s in all) is cut at the request's 4 s deadline:
    the client gets the deadline's error in time, streamed or not, and the LLM's stream is closed."""
    from tests.conftest import start_server, stop_server, write_config

    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          request_timeout=4)
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 0, "dep": [-1],
                                          "args": {"text": "Anna lives in Berlin"}}]))
        llm.on("response_results", "word " * 200)
        llm.stream_delay = 0.1
        for stream in (True, False):
            started = time.monotonic()
            resp = requests.post(srv.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                              "stream": stream}, stream=stream, timeout=60)
            text = "".join(json.dumps(e) for e in sse(resp)) if stream else resp.text
            took = time.monotonic() - started
            assert "deadline" in text, text[-500:]
            assert took < 12, took  # 4 s of deadline and wide margins; the LLM would write for 20 s
            answers = llm.stage_requests("response_results")
            assert answers and "stream_end" not in answers[-1]  # the LLM never got to finish its stream
    finally:
        stop_server(srv)
