"""Front doors (issue 19): the OpenAI chat-completions API driven by the official `openai` client, Prometheus
metrics scraped after real requests, and X-Request-ID carried through headers, events and log lines."""

from __future__ import annotations

import base64
import io
import json
import re
import threading

import openai
import pytest
import requests
from PIL import Image

from tests.conftest import start_server, stop_server, wait_until, write_config

PLAN = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
])
ANSWER = "I drew a red fox, described it, and found Anna and Berlin."


@pytest.fixture
def front(tmp_path, llm, models, models_server, public_dir):
    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                          choose_model="ranking", api_tokens=["tok-front-1"])
    srv = start_server(config, tmp_path)
    yield srv
    stop_server(srv)


def client(srv, key: str = "tok-front-1") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there is none)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def png_data_uri(color=(20, 120, 220)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_openai_client_gets_the_answer_with_the_generated_image_as_an_absolute_markdown_url(front, llm):
    llm.on("parse_task", PLAN)
    llm.on("response_results", ANSWER)
    reply = client(front).chat.completions.create(
        model="hugginggpt", messages=[{"role": "user", "content": "draw a red fox, describe it, and find the "
                                                                  "names in: Anna lives in Berlin"}])
    text = reply.choices[0].message.content
    assert text.startswith(ANSWER) and reply.choices[0].finish_reason == "stop"
    urls = re.findall(r"!\[generated image\]\((http://127\.0\.0\.1:\d+/images/[\w.-]+\.png)\)", text)
    assert len(urls) == 1 and urls[0].startswith(front.url)
    picture = Image.open(io.BytesIO(requests.get(urls[0], timeout=10).content))
    assert picture.size == (64, 48)
    # the scripted LLM reports 1 + 1 tokens for a call it answers whole (the answer); the streamed plan reports none
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (1, 1, 2)


def test_openai_stream_gives_the_same_answer_in_chunks_then_stop(front, llm):
    llm.on("parse_task", PLAN)
    llm.on("response_results", ANSWER)
    stream = client(front).chat.completions.create(
        model="hugginggpt", stream=True, messages=[{"role": "user", "content": "draw a red fox and more"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.startswith(ANSWER)
    assert re.search(r"!\[generated image\]\(http://127\.0\.0\.1:\d+/images/[\w.-]+\.png\)", text)
    assert len([c for c in chunks if c.choices[0].delta.content]) >= 3  # streamed, not one block
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert len({c.id for c in chunks}) == 1


def test_an_image_part_reaches_the_planner_as_a_checked_upload(front, llm, public_dir):
    llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    llm.on("response_results", "It shows a blue rectangle.")
    reply = client(front).chat.completions.create(model="hugginggpt", messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": png_data_uri()}}]}])
    assert reply.choices[0].message.content.startswith("It shows a blue rectangle.")
    asked = json.dumps(llm.stage_requests("parse_task")[-1]["body"]["messages"][-1])
    path = re.search(r"/uploads/[\w.-]+\.png", asked).group(0)
    assert Image.open(public_dir / path.lstrip("/")).size == (32, 24)

    with pytest.raises(openai.BadRequestError, match="not an image|unsupported file type"):
        client(front).chat.completions.create(model="hugginggpt", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no").decode()}}]}])
    with pytest.raises(openai.BadRequestError, match="refusing"):  # the URL policy: no loopback fetches
        client(front).chat.completions.create(model="hugginggpt", messages=[{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {"url": front.url + "/examples/red.png"}}]}])


def test_models_list_plan_model_errors_and_tokens_in_openai_shape(front, llm, models):
    names = [m.id for m in client(front).models.list()]
    assert names == ["hugginggpt", "hugginggpt-plan"]
    llm.on("parse_task", PLAN)
    reply = client(front).chat.completions.create(model="hugginggpt-plan",
                                                  messages=[{"role": "user", "content": "draw a fox and more"}])
    decisions = json.loads(reply.choices[0].message.content)["decisions"]
    assert decisions["model_selections"]["0"]["status"] == "selected_not_executed"
    assert not models.calls  # planned and chosen, nothing run

    with pytest.raises(openai.NotFoundError) as missing:
        client(front).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "model_not_found" and "hugginggpt-plan" in missing.value.body["message"]
    with pytest.raises(openai.PermissionDeniedError):
        client(front, key="wrong").models.list()
    raw = requests.post(front.url + "/v1/chat/completions", json={"model": "hugginggpt", "messages": "x"},
                        headers={"Authorization": "Bearer tok-front-1"}, timeout=10)
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_metrics_move_by_exactly_what_one_three_task_request_did(front, llm, models):
    auth = {"Authorization": "Bearer tok-front-1"}
    assert requests.get(front.url + "/metrics", timeout=10).status_code == 401  # behind the same tokens
    before = requests.get(front.url + "/metrics", headers=auth, timeout=10).text
    llm.on("parse_task", PLAN)
    llm.on("response_results", ANSWER)
    resp = front.post("/hugginggpt", {"messages": [{"role": "user", "content": "draw a fox and more"}]},
                      headers=auth)
    assert resp.status_code == 200
    after = requests.get(front.url + "/metrics", headers=auth, timeout=10).text
    assert resp.headers["Content-Type"].startswith("application/json")

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert moved("hugginggpt_http_requests_total", route="/hugginggpt", status="200") == 1
    assert moved("hugginggpt_model_calls_total", outcome="ok") == 3 == len(models.calls)
    assert moved("hugginggpt_model_calls_total", model="dslim/bert-base-NER", backend="local", outcome="ok") == 1
    assert moved("hugginggpt_model_calls_total", outcome="error") == 0
    llm_calls = len(llm.stage_requests("parse_task")) + len(llm.stage_requests("response_results"))
    assert moved("hugginggpt_llm_calls_total", backend="local", outcome="ok") == llm_calls == 2
    assert moved("hugginggpt_llm_tokens_total", kind="prompt") == 1  # the answer's 1; the streamed plan reports none
    for stage, count in (("plan", 1), ("select", 3), ("execute", 1), ("respond", 1)):
        assert moved("hugginggpt_stage_seconds_count", stage=stage) == count, stage
    assert moved("hugginggpt_request_seconds_count", mode="answer", outcome="ok") == 1
    assert metric(after, "hugginggpt_requests_in_flight") == 0
    assert "# TYPE hugginggpt_stage_seconds histogram" in after


def test_a_refused_request_counts_as_an_admission_rejection(tmp_path, llm, models, models_server, public_dir):
    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                          choose_model="ranking", max_concurrent_requests=1)
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", "[]", delay=4)  # holds its slot long enough for a busy machine to ask twice
        slow = threading.Thread(target=srv.post, args=("/hugginggpt", {"messages": [{"role": "user",
                                                                                      "content": "slow"}]}))
        slow.start()
        wait_until(lambda: llm.stage_requests("parse_task"), what="the slow request reaching the LLM")
        text = requests.get(srv.url + "/metrics", timeout=10).text
        assert metric(text, "hugginggpt_requests_in_flight") == 1
        assert srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "hi"}]}).status_code == 429
        slow.join()
        text = requests.get(srv.url + "/metrics", timeout=10).text
        assert metric(text, "hugginggpt_admission_rejections_total") == 1
        assert metric(text, "hugginggpt_http_requests_total", route="/hugginggpt", status="429") == 1
        assert metric(text, "hugginggpt_requests_in_flight") == 0
    finally:
        stop_server(srv)


def test_the_request_id_is_echoed_and_in_every_event_and_log_line_of_the_request(front, llm, models):
    models.broken.update({"Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning"})
    llm.on("parse_task", PLAN)
    llm.on("response_results", ANSWER)
    auth = {"Authorization": "Bearer tok-front-1"}
    resp = requests.post(front.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "fox"}],
                                                          "stream": True},
                         headers={**auth, "X-Request-ID": "trace-42.a"}, stream=True, timeout=30)
    assert resp.headers["X-Request-ID"] == "trace-42.a"
    events = [json.loads(line[5:]) for line in resp.iter_lines(decode_unicode=True) if line.startswith("data:")
              and line[5:].strip().startswith("{\"event\"")]
    assert len(events) > 5 and {e["request_id"] for e in events} == {"trace-42.a"}
    lines = [line for line in front.logs().splitlines() if "trace-42.a" in line]
    assert any("failed" in line and "image-captioning" in line for line in lines)  # written on a task thread
    assert all(" [trace-42.a]: " in line for line in lines)

    other = requests.post(front.url + "/tasks", json={"messages": [{"role": "user", "content": "fox"}]},
                          headers={**auth, "X-Request-ID": "bad id; drop"}, timeout=30)
    assert re.fullmatch(r"[0-9a-f]{12}", other.headers["X-Request-ID"])  # not a plain token: a fresh one


def test_a_browser_page_may_send_and_read_the_request_id(front):
    page = "http://localhost:5173"  # a loopback page: allowed by the default cors_origins
    pre = requests.options(front.url + "/hugginggpt", headers={
        "Origin": page, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization, x-request-id, mcp-protocol-version"},
        timeout=10)
    allowed = {h.strip().lower() for h in pre.headers.get("Access-Control-Allow-Headers", "").split(",")}
    assert {"x-request-id", "mcp-protocol-version", "authorization"} <= allowed
    resp = requests.get(front.url + "/v1/models", headers={"Origin": page, "Authorization": "Bearer tok-front-1"},
                        timeout=10)
    assert "x-request-id" in resp.headers.get("Access-Control-Expose-Headers", "").lower()


def test_only_the_files_tasks_generated_are_handed_back():
    """What the OpenAI answer links and the MCP tool returns as media: `generated ...` outputs that are plain
    public/ output paths, once each, in task order; never an input a result names, nor text that looks like a path."""
    from hugginggpt.request import generated_files

    results = {
        2: {"inference result": {"generated audio": "/audios/b.wav", "image": "/images/input.png"}},
        0: {"inference result": {"generated image": "/images/a.png", "generated text": "/etc/passwd"}},
        1: {"inference result": {"generated image": "/images/a.png", "generated video": "/videos/../x.mp4"}},
        3: {"inference result": "an error string"},
    }
    assert generated_files(results) == ["/images/a.png", "/audios/b.wav"]
