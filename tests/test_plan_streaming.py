"""The streaming planner: a task starts while the LLM is still writing the rest of the plan."""

from __future__ import annotations

import json
import threading
import time

import requests

from hugginggpt.planstream import EarlyTasks, ObjectStream
from hugginggpt.request import ChatRequest, RequestState
from tests.conftest import start_server, stop_server, write_config

SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
PLAN = [
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox in the snow at dawn"}},
    {"task": "token-classification", "id": 1, "dep": [-1], "args": {"text": "Anna lives in Berlin and works in Paris"}},
    {"task": "image-to-text", "id": 2, "dep": [0], "args": {"image": "<GENERATED>-0"}},
]


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def test_the_object_stream_finds_each_task_when_its_brace_closes():
    stream = ObjectStream()
    text = "Here you go: " + json.dumps(PLAN) + " done"
    found = [obj for i in range(0, len(text), 7) for obj in stream.feed(text[i:i + 7])]
    assert [json.loads(o)["id"] for o in found] == [0, 1, 2]
    structured = ObjectStream().feed(json.dumps({"tasks": PLAN}))
    assert [json.loads(o)["task"] for o in structured] == ["text-to-image", "token-classification", "image-to-text"]
    tricky = ObjectStream().feed('[{"task": "text-to-image", "id": 0, "args": {"text": "a } and a { and \\" quote"}}]')
    assert json.loads(tricky[0])["args"]["text"] == 'a } and a { and " quote'


def test_only_final_tasks_start_early():
    started = []
    early = EarlyTasks(started.append)
    early.feed(json.dumps(PLAN[:1])[:-1] + ", ")
    assert [t.id for t in started] == [0]
    forward = {"task": "image-to-text", "id": 5, "dep": [6], "args": {"image": "<GENERATED>-6"}}
    early.feed(json.dumps(PLAN[2]) + ", " + json.dumps(forward) + ", " + json.dumps(PLAN[1]) + "]")
    assert [t.id for t in started] == [0, 2]  # a forward reference stops early starts: the full plan decides
    assert started[1].dep == [0]


def run_streamed(srv, llm, models) -> tuple[list[dict], float]:
    models.delays[SDXL] = 0.3
    llm.stream_delay = 0.04  # about 2.5 s to write the whole plan
    llm.on("parse_task", json.dumps(PLAN))
    with requests.post(srv.url + "/hugginggpt", json=ask("draw a fox, tag the names, caption the fox", stream=True),
                       stream=True, timeout=60) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: {\"")]
    planner = llm.stage_requests("parse_task")[-1]
    stream_end = planner.get("stream_end", planner["time"])  # a plan asked without streaming comes at once
    first_model_call = min(c["start"] for c in models.calls if c["model"] == SDXL)
    return events, first_model_call - stream_end


def test_task_zero_starts_before_the_last_plan_token(server, llm, models):
    events, lead = run_streamed(server, llm, models)
    assert lead < -0.5, f"task 0 began {lead:.2f}s after the plan's last token"
    names = [e["event"] for e in events]
    assert names[0] == "plan" and names.index("plan") < names.index("task_started")  # same order as before
    assert len([e for e in events if e["event"] == "plan"]) == 1
    assert {e["id"] for e in events if e["event"] == "task_finished"} == {0, 1, 2}
    assert "answer" in names
    # /tasks output is the plan, as before
    llm.stream_delay = 0
    assert server.post("/tasks", ask("plan only")).json() == PLAN


def test_without_streaming_the_first_task_waits_for_the_whole_plan(tmp_path, llm, models, models_server,
                                                                  public_dir):
    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                    stream_plan=False), tmp_path)
    try:
        _, lead = run_streamed(srv, llm, models)
        assert lead > 0
    finally:
        stop_server(srv)


def test_held_events_go_out_before_any_event_that_comes_while_they_are_released():
    """Tasks may start (and finish) while the held events are still being delivered: order must hold."""
    seen: list[str] = []
    calls = iter(range(1000))

    def sink(name: str, event: dict) -> None:
        if next(calls) == 0:
            time.sleep(0.3)  # a slow first delivery: the release is still going on
        seen.append(name)

    state = RequestState(ChatRequest.from_body({"messages": [{"role": "user", "content": "x"}]}), None, sink, 30)
    state.hold_events()
    state.emit("task_started", {"id": 0})
    state.emit("model_selected", {"id": 1})
    late = threading.Thread(target=lambda: (time.sleep(0.1), state.emit("task_finished", {"id": 0})))
    late.start()
    state.release_events()
    late.join()
    assert seen == ["task_started", "model_selected", "task_finished"]
