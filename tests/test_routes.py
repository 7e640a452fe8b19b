"""The three JARVIS routes, return_decisions and health, end to end over HTTP."""

from __future__ import annotations

import json

from PIL import Image

PLAN_CAPTION_TTS = json.dumps([
    {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
    {"task": "text-to-speech", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
])


def ask(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}]}


def test_tasks_returns_the_plan(server, llm, models):
    llm.on("parse_task", PLAN_CAPTION_TTS)
    resp = server.post("/tasks", ask("caption /examples/red.png and read it aloud"))
    assert resp.status_code == 200, resp.text
    tasks = resp.json()
    assert [t["task"] for t in tasks] == ["image-to-text", "text-to-speech"]
    assert tasks[1]["dep"] == [0] and tasks[1]["args"]["text"] == "<GENERATED>-0"
    assert models.calls == []  # planning only: nothing ran


def test_results_runs_the_dag_and_resolves_generated(server, llm, models, public_dir):
    llm.on("parse_task", PLAN_CAPTION_TTS)
    resp = server.post("/results", ask("caption /examples/red.png and read it aloud"))
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert set(results) == {"0", "1"}
    caption = results["0"]["inference result"]["generated text"]
    assert caption == "a picture of 80x60 pixels"
    assert results["0"]["choose model result"]["id"] in (
        "Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning")
    # The dependent task received the caption, not the placeholder.
    assert results["1"]["task"]["args"]["text"] == caption
    audio = results["1"]["inference result"]["generated audio"]
    assert audio.startswith("/audios/") and (public_dir / audio.lstrip("/")).is_file()
    assert [c["model"] for c in models.calls][-1] == "microsoft/speecht5_tts"


def test_hugginggpt_answers_from_the_execution_log(server, llm, models):
    llm.on("parse_task", PLAN_CAPTION_TTS)
    resp = server.post("/hugginggpt", ask("caption /examples/red.png and read it aloud"))
    assert resp.status_code == 200, resp.text
    message = resp.json()["message"]
    assert message.startswith("ANSWER based on:")
    assert "a picture of 80x60 pixels" in message and "/audios/" in message
    # the response stage saw the user's request
    assert "caption /examples/red.png" in json.dumps(llm.stage_requests("response_results")[0]["body"])


def test_return_decisions_selects_without_running(server, llm, models):
    llm.on("parse_task", PLAN_CAPTION_TTS)
    body = {**ask("caption /examples/red.png and read it aloud"), "return_decisions": True}
    resp = server.post("/hugginggpt", body)
    assert resp.status_code == 200, resp.text
    decisions = resp.json()["decisions"]
    assert decisions["input"] == "caption /examples/red.png and read it aloud"
    assert len(decisions["planned_tasks"]) == 2
    sel = decisions["model_selections"]
    assert sel["1"]["selected_model"] == "microsoft/speecht5_tts"
    assert sel["1"]["hosted_on"] == "local" and sel["1"]["status"] == "selected_not_executed"
    assert sel["1"]["reason"] == "Only one model available."
    assert sorted(sel["0"]["available_candidates"]["local"]) == [
        "Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning"]
    assert decisions["summary"] == {"total_tasks": 2, "tasks_with_selections": 2, "tasks_unavailable": 0}
    assert "raw_results" in resp.json()
    assert models.calls == []


def test_object_detection_draws_boxes_on_a_copy(server, llm, models, public_dir):
    llm.on("parse_task", json.dumps([{"task": "object-detection", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    results = server.post("/results", ask("what is in /examples/red.png")).json()
    inf = results["0"]["inference result"]
    assert inf["predicted"][0]["label"] == "cat"
    drawn = public_dir / inf["generated image"].lstrip("/")
    with Image.open(drawn) as img:
        assert img.size == (80, 60)
        assert img.getpixel((2, 10)) != (200, 30, 30)  # a box edge was drawn
    with Image.open(public_dir / "examples" / "red.png") as original:
        assert original.getpixel((2, 10)) == (200, 30, 30)  # the input is untouched


def test_generated_files_are_served(server, llm, models):
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]))
    results = server.post("/results", ask("draw a fox")).json()
    path = results["0"]["inference result"]["generated image"]
    import requests

    resp = requests.get(server.url + path, headers={"Origin": "http://localhost:3000"}, timeout=5)
    assert resp.status_code == 200 and resp.headers["Content-Type"] == "image/png"
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"  # a local dev page may read it
    foreign = requests.get(server.url + path, headers={"Origin": "https://evil.example"}, timeout=5)
    assert "Access-Control-Allow-Origin" not in foreign.headers


def test_health(server):
    import requests

    data = requests.get(server.url + "/health", timeout=5).json()
    assert data["status"] == "ok" and data["models_server"] == "up"
    assert data["llm"]["api_type"] == "local"
