"""The four stages together over HTTP: concurrency, timing, failures, fixed rules, fallbacks, chit-chat."""

from __future__ import annotations

import json
import threading
import time

import requests

from tests.conftest import start_server, stop_server, wait_until, write_config


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def plan(*tasks) -> str:
    return json.dumps([{"task": t, "id": i, "dep": d, "args": a} for i, (t, d, a) in enumerate(tasks)])


def test_concurrent_requests_get_only_their_own_results(server, llm, models):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 0.8  # long enough to overlap on a busy 2-core CI box
    words = ["apple", "banana", "cherry", "damson", "elder", "fig"]
    for w in words:
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": w}),
                                  ("token-classification", [-1], {"text": f"{w} is a fruit"})), contains=f"draw {w}")
    out: dict[str, dict] = {}

    def go(w):
        out[w] = server.post("/results", ask(f"draw {w}")).json()

    threads = [threading.Thread(target=go, args=(w,)) for w in words]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in words:
        assert out[w]["0"]["task"]["args"]["text"] == w
        assert out[w]["1"]["inference result"]["predicted"][0]["word"] == w
    starts = sorted(c["start"] for c in models.calls if "stable" in c["model"])
    ends = sorted(c["end"] for c in models.calls if "stable" in c["model"])
    assert starts[-1] < ends[0]  # all six requests were in flight together


def test_dependent_waits_and_independent_tasks_overlap(server, llm, models):
    models.delays.update({"stabilityai/stable-diffusion-xl-base-1.0": 0.4, "dslim/bert-base-NER": 0.4})
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox"}),
                              ("token-classification", [-1], {"text": "Anna lives in Berlin"}),
                              ("image-classification", [0], {"image": "<GENERATED>-0"})))
    results = server.post("/results", ask("go")).json()
    assert results["2"]["inference result"]["predicted"][0]["label"] == "tabby cat"
    calls = {c["model"]: c for c in models.calls}
    sd, ner, cls = (calls["stabilityai/stable-diffusion-xl-base-1.0"], calls["dslim/bert-base-NER"],
                    calls["google/vit-base-patch16-224"])
    assert ner["start"] < sd["end"] and sd["start"] < ner["end"]  # independent: overlap
    assert cls["start"] >= sd["end"]  # dependent: after its dependency
    assert cls["start"] - sd["end"] < 0.45  # and right after it (JARVIS polled every 0.5 s; margin for a busy box)


def test_failed_task_skips_its_dependents_with_a_reason(server, llm, models):
    models.broken.add("stabilityai/stable-diffusion-xl-base-1.0")
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a fox"}),
                              ("image-to-text", [0], {"image": "<GENERATED>-0"}),
                              ("token-classification", [-1], {"text": "Anna"})))
    results = server.post("/results", ask("go")).json()
    assert "crashed (scripted)" in results["0"]["inference result"]["error"]["message"]
    assert "skipped" in results["1"]["inference result"]["error"]["message"]
    assert "error" not in results["2"]["inference result"]
    assert not any(c["model"].startswith("Salesforce") or "vit-gpt2" in c["model"] for c in models.calls)


def test_failed_model_falls_back_to_the_next_candidate(server, llm, models):
    models.broken.add("Salesforce/blip-image-captioning-large")
    llm.on("choose_model", json.dumps({"id": "Salesforce/blip-image-captioning-large", "reason": "best"}))
    llm.on("parse_task", plan(("image-to-text", [-1], {"image": "/examples/red.png"})))
    result = server.post("/results", ask("caption")).json()["0"]
    assert result["inference result"]["generated text"] == "a picture of 80x60 pixels"
    assert result["choose model result"]["id"] == "nlpconnect/vit-gpt2-image-captioning"
    assert result["choose model result"]["reason"] == "fallback after Salesforce/blip-image-captioning-large failed"
    tried = result["inference result"]["fallback"]["tried"]
    assert tried[0]["model"] == "Salesforce/blip-image-captioning-large" and "crashed" in tried[0]["error"]


def test_llm_chooses_among_several_candidates_tolerantly(tmp_path, llm, models, models_server, public_dir):
    """`choose_model: llm` (JARVIS's way): the LLM picks among the available candidates, its reply read tolerantly."""
    llm.on("choose_model", 'I pick this one:\n```json\n{"id": "nlpconnect/vit-gpt2-image-captioning", '
                           '"reason": "smaller and fast"}\n```')
    llm.on("parse_task", plan(("image-to-text", [-1], {"image": "/examples/red.png"})))
    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, choose_model="llm",
                          semantic_ranking=False)
    srv = start_server(config, tmp_path)
    try:
        result = srv.post("/results", ask("caption")).json()["0"]
        # an LLM that fails to choose (a 401 is final) leaves the top-ranked candidate, and the task runs
        llm.failing_stages["choose_model"] = 401
        fallback = srv.post("/results", ask("caption")).json()["0"]
    finally:
        stop_server(srv)
    assert fallback["choose model result"]["id"] in ("Salesforce/blip-image-captioning-large",
                                                    "nlpconnect/vit-gpt2-image-captioning")
    assert "the LLM could not choose" in fallback["choose model result"]["reason"]
    assert fallback["inference result"]["generated text"] == "a picture of 80x60 pixels"
    assert result["choose model result"] == {"id": "nlpconnect/vit-gpt2-image-captioning",
                                             "reason": "smaller and fast"}
    prompt = json.dumps(llm.stage_requests("choose_model")[0]["body"]["messages"])
    assert "Salesforce/blip-image-captioning-large" in prompt and "image-to-text" in prompt


def test_choice_outside_the_candidates_takes_the_top_ranked(server, llm, models):
    llm.on("choose_model", '{"id": "made-up/model", "reason": "?"}')
    llm.on("parse_task", plan(("image-to-text", [-1], {"image": "/examples/red.png"})))
    result = server.post("/results", ask("caption")).json()["0"]
    assert result["choose model result"]["id"] in ("Salesforce/blip-image-captioning-large",
                                                  "nlpconnect/vit-gpt2-image-captioning")
    assert "top-ranked" in result["choose model result"]["reason"]


def test_no_available_model_is_reported(server, llm, models):
    llm.on("parse_task", plan(("depth-estimation", [-1], {"image": "/examples/red.png"})))
    result = server.post("/results", ask("depth")).json()["0"]
    assert "no available model for depth-estimation" in result["inference result"]["error"]["message"]


def test_text_tasks_in_a_plan_are_done_by_the_llm(server, llm, models):
    llm.on("text_task", "Un renard roux")
    llm.on("parse_task", plan(("text-to-image", [-1], {"text": "a red fox"}),
                              ("image-to-text", [0], {"image": "<GENERATED>-0"}),
                              ("translation", [1], {"text": "<GENERATED>-1"})))
    results = server.post("/results", ask("draw, caption, translate to French")).json()
    assert results["2"]["choose model result"]["id"] == "ChatGPT"
    assert results["2"]["inference result"] == {"response": "Un renard roux"}
    assert results["2"]["task"]["args"]["text"] == "a picture of 64x48 pixels"


def test_single_text_task_is_answered_directly(server, llm, models):
    llm.on("parse_task", plan(("summarization", [-1], {"text": "long text"})))
    llm.on("chitchat", "SHORT SUMMARY")
    resp = server.post("/hugginggpt", ask("summarize this long text"))
    assert resp.json() == {"message": "SHORT SUMMARY"}
    assert models.calls == []


def test_empty_or_unparseable_plan_gets_a_conversational_answer(server, llm, models):
    llm.on("parse_task", "[]", contains="hello there")
    llm.on("parse_task", "I am not sure what you mean.", contains="mumble")
    assert server.post("/hugginggpt", ask("hello there")).json() == {"message": "CHITCHAT: hello there"}
    assert server.post("/hugginggpt", ask("mumble")).json() == {"message": "CHITCHAT: mumble"}


def test_controlnet_rules(server, llm, models):
    models.models.update({"openpose-control": "openpose-control",
                          "lllyasviel/sd-controlnet-openpose": "openpose-text-to-image"})
    llm.on("parse_task", plan(("openpose-control", [-1], {"image": "/examples/red.png"}),
                              ("openpose-text-to-image", [0], {"text": "a dancer", "image": "<GENERATED>-0"}),
                              ("canny-text-to-image", [-1], {"image": "/examples/red.png"}),
                              ("hed-text-to-image", [-1], {"text": "a house", "image": "/examples/red.png"})))
    decisions = server.post("/hugginggpt", ask("pose", return_decisions=True)).json()["decisions"]
    sel = decisions["model_selections"]
    assert sel["0"]["selected_model"] == "openpose-control"
    assert sel["1"]["selected_model"] == "lllyasviel/sd-controlnet-openpose"
    assert sel["1"]["reason"] == "ControlNet is the best model for this task."
    # a control-text-to-image task without text becomes the annotator (JARVIS's rule)
    assert decisions["planned_tasks"][2]["task"] == "canny-control"
    # the models server's /status decides, not an assumption: it has no HED ControlNet
    assert sel["3"]["selected_model"] is None and sel["3"]["status"] == "unavailable"
    assert "cannot serve lllyasviel/sd-controlnet-hed" in sel["3"]["reason"]
    assert "lllyasviel/sd-controlnet-hed" in models.status_calls


def test_history_reaches_the_planner_and_is_trimmed(server, llm):
    llm.on("parse_task", "[]")
    history = []
    for i in range(40):
        history += [{"role": "user", "content": f"turn {i} " + "words " * 400},
                    {"role": "assistant", "content": f"reply {i}"}]
    body = {"messages": history + [{"role": "user", "content": "and now?"}]}
    assert server.post("/tasks", body).status_code == 200
    prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    assert "turn 39" in prompt and "turn 0 " not in prompt  # newest kept, oldest dropped
    assert len(prompt) < 8192 * 4


def test_logit_bias_is_not_sent_to_a_local_backend(server, llm):
    llm.on("parse_task", "[]")
    server.post("/tasks", ask("hi"))
    assert "logit_bias" not in llm.stage_requests("parse_task")[-1]["body"]


def test_per_request_overrides_reach_another_backend(llm, tmp_path, models_server, public_dir):
    from tests.fakes.llm_server import ScriptedLLM, ThreadedServer

    other = ScriptedLLM()
    srv = ThreadedServer(other.app()).start()
    _, models_url = models_server
    # the other LLM is on loopback: a request may name it only where url_allowlist opens it
    server = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                       url_allowlist=["127.0.0.1"]), tmp_path)
    try:
        other.on("parse_task", plan(("text-to-image", [-1], {"text": "from the other LLM"})))
        body = ask("draw", api_type="local", api_endpoint=srv.url + "/v1/chat/completions", api_key="k-123")
        tasks = server.post("/tasks", body).json()
        assert tasks[0]["args"]["text"] == "from the other LLM"
        assert other.requests and not llm.requests
    finally:
        srv.stop()
        stop_server(server)


def test_completion_mode(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, use_completion=True, planner_max_tokens=300)
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": "x"})))
        tasks = srv.post("/tasks", ask("draw x")).json()
        assert tasks[0]["task"] == "text-to-image"
        assert "prompt" in llm.requests[-1]["body"] and "messages" not in llm.requests[-1]["body"]
        assert llm.stage_requests("parse_task")[-1]["body"]["max_tokens"] == 300  # the planner's cap, not 2048
    finally:
        stop_server(srv)


def test_request_deadline_reports_what_finished(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    # wide margins for a busy machine: the quick task has 8 s; the slow one never answers until the test ends
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, request_timeout=8, semantic_ranking=False)
    srv = start_server(config, tmp_path)
    slow = models.gates["stabilityai/stable-diffusion-xl-base-1.0"] = threading.Event()
    try:
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": "slow"}),
                                  ("token-classification", [-1], {"text": "Anna"})))
        resp = srv.post("/results", ask("go"))
        assert resp.status_code == 200, (resp.text, [(r["stage"], r["time"]) for r in llm.requests])
        results = resp.json()
        assert "deadline" in results["0"]["inference result"]["error"]["message"]
        assert "error" not in results["1"]["inference result"]
    finally:
        slow.set()
        stop_server(srv)
        deadline = time.monotonic() + 10  # the held call ends here, not in the next test's records
        while not any(c["model"].startswith("stabilityai") for c in models.calls) and time.monotonic() < deadline:
            time.sleep(0.05)


def test_past_max_concurrent_requests_a_client_gets_429_not_a_queue(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          max_concurrent_requests=2)
    srv = start_server(config, tmp_path)
    try:
        sd = "stabilityai/stable-diffusion-xl-base-1.0"
        held = models.gates[sd] = threading.Event()  # both requests stay in their model until the test says
        llm.on("parse_task", plan(("text-to-image", [-1], {"text": "slow"})))
        answers: list[requests.Response] = []

        def go():
            answers.append(srv.post("/results", ask("draw slowly")))

        busy = [threading.Thread(target=go) for _ in range(2)]
        [t.start() for t in busy]
        wait_until(lambda: models.arrivals.count(sd) == 2, what="both requests reaching their model")
        started = time.monotonic()
        third = srv.post("/results", ask("draw slowly"), timeout=10)  # queued, it would wait for the gate
        assert time.monotonic() - started < 5  # answered while both are held: refused, not queued
        assert third.status_code == 429 and third.headers["Retry-After"] == "1"
        assert "max_concurrent_requests" in third.json()["error"]["message"]
        held.set()
        [t.join() for t in busy]
        assert [a.status_code for a in answers] == [200, 200]
        # slots come back, also from a stream the client left early
        with requests.post(srv.url + "/tasks", json=ask("go", stream=True), stream=True, timeout=10) as resp:
            next(resp.iter_lines())
        wait_until(lambda: "hugginggpt_requests_in_flight 0.0" in requests.get(srv.url + "/metrics", timeout=5).text,
                   what="the server noticing the client left")
        answers.clear()
        again = [threading.Thread(target=go) for _ in range(2)]
        [t.start() for t in again]
        [t.join() for t in again]
        assert [a.status_code for a in answers] == [200, 200]  # both slots were free again
        # and from requests refused as bad (the slot is taken before the body is read)
        for _ in range(3):
            assert srv.post("/results", {"messages": []}).status_code == 400
        answers.clear()
        again = [threading.Thread(target=go) for _ in range(2)]
        [t.start() for t in again]
        [t.join() for t in again]
        assert [a.status_code for a in answers] == [200, 200]
    finally:
        stop_server(srv)
