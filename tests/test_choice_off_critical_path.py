"""`choose_model: auto` keeps the LLM's choice off the critical path (issue 16).

When the ranking does not decide (its lead is below the margin), the LLM is asked only while its answer can
still change what runs: a task ready to run takes the ranking's pick at once; a task waiting for its inputs has
the LLM asked meanwhile and takes its choice if it comes first. `choose_model: llm` always waits (JARVIS's way).
Real servers over HTTP: the orchestrator, the scripted LLM and the fake models server (which records when each
model call started).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import catalog_of, start_server, stop_server, write_config

TOP = "niche/photoreal-diffusion"  # the keyword ranker's pick for REQUEST
LLM_PICK = "mid/sketch-diffusion"  # what the scripted LLM chooses instead
CAPTIONER = "only/captioner"
CARDS = [
    {"id": "mid/watercolor-diffusion", "task": "text-to-image", "likes": 3000, "downloads": 40000,
     "description": "Soft watercolor paintings of landscapes", "tags": ["painting"], "language": ["en"]},
    {"id": LLM_PICK, "task": "text-to-image", "likes": 2000, "downloads": 30000,
     "description": "Pencil sketches and line drawings", "tags": ["sketch"], "language": ["en"]},
    {"id": TOP, "task": "text-to-image", "likes": 3, "downloads": 50,
     "description": "Photorealistic photographs of people, portrait photography of an old fisherman style",
     "tags": ["photorealistic", "photograph", "portrait"], "language": ["en"]},
    {"id": CAPTIONER, "task": "image-to-text", "likes": 10, "downloads": 100,
     "description": "Captions for photographs", "tags": ["captioning"], "language": ["en"]},
]
REQUEST = "a photorealistic portrait photograph of an old fisherman, like the one in /examples/red.png"
ROOT_PLAN = [{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": REQUEST}}]
# the picture is drawn from the caption of another one: the drawing waits for the captioner
CHAIN_PLAN = [{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
              {"task": "text-to-image", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}}]


@pytest.fixture
def server_for(tmp_path, llm, models, models_server, public_dir):
    catalog = catalog_of(tmp_path, models, CARDS)
    _, models_url = models_server
    started = []

    def start(choose: str):
        folder = tmp_path / choose
        folder.mkdir()
        # margin 50: no lead is that large, so the ranking never decides alone and the LLM's choice is wanted
        config = write_config(folder, llm.base_url, models_url, public_dir, semantic_ranking=False,
                              catalog=str(catalog), num_candidate_models=3, choose_model=choose,
                              choose_model_margin=50.0, stream_plan=False)
        started.append(start_server(config, folder))
        return started[-1]

    yield start
    for srv in started:
        stop_server(srv)


def run(srv, llm, models, plan) -> tuple[dict, float, dict[str, float]]:
    """Post the request; return its results, its duration and when each model call started (from the post)."""
    llm.on("parse_task", json.dumps(plan))
    llm.on("response_results", "done")
    models.calls.clear()
    t0 = time.perf_counter()
    resp = srv.post("/results", {"messages": [{"role": "user", "content": REQUEST}]})
    took = time.perf_counter() - t0
    assert resp.status_code == 200, resp.text
    starts = {c["model"]: c["start"] - t0 for c in models.calls}
    return resp.json(), took, starts


def choice_of(results: dict, task_id: int) -> dict:
    return results[str(task_id)]["choose model result"]


def test_a_task_ready_at_once_runs_the_ranked_pick_and_the_llm_is_not_asked(server_for, llm, models):
    srv = server_for("auto")
    llm.on("choose_model", json.dumps({"id": LLM_PICK, "reason": "the LLM's pick"}), delay=3.0)
    results, took, starts = run(srv, llm, models, ROOT_PLAN)
    assert choice_of(results, 0)["id"] == TOP
    assert "inputs were ready" in choice_of(results, 0)["reason"]
    assert llm.stage_requests("choose_model") == []  # its answer could not have changed what ran
    assert list(starts) == [TOP] and starts[TOP] < 2.0 and took < 2.5


def test_a_waiting_task_takes_the_llms_choice_when_it_comes_before_the_inputs(server_for, llm, models):
    srv = server_for("auto")
    models.delays[CAPTIONER] = 1.5  # the drawing's input comes in 1.5 s; the LLM answers in 0.2 s
    llm.on("choose_model", json.dumps({"id": LLM_PICK, "reason": "the LLM's pick"}), delay=0.2)
    results, _, starts = run(srv, llm, models, CHAIN_PLAN)
    assert len(llm.stage_requests("choose_model")) == 1  # asked while the captioner ran
    assert choice_of(results, 1) == {"id": LLM_PICK, "reason": "the LLM's pick"}
    assert LLM_PICK in starts and TOP not in starts


def test_a_ready_task_does_not_wait_for_a_slow_llm_choice(server_for, llm, models):
    srv = server_for("auto")
    models.delays[CAPTIONER] = 0.3  # the input is ready long before the LLM's choice (4 s)
    llm.on("choose_model", json.dumps({"id": LLM_PICK, "reason": "the LLM's pick"}), delay=4.0)
    results, took, starts = run(srv, llm, models, CHAIN_PLAN)
    assert len(llm.stage_requests("choose_model")) == 1
    assert choice_of(results, 1)["id"] == TOP
    assert "before its answer" in choice_of(results, 1)["reason"]
    assert starts[TOP] < 2.5 and took < 3.5  # started on the ranking's pick, not after the LLM's 4 s
    assert LLM_PICK not in starts


def test_choose_model_llm_waits_for_the_llms_choice(server_for, llm, models):
    srv = server_for("llm")
    models.delays[CAPTIONER] = 0.3
    llm.on("choose_model", json.dumps({"id": LLM_PICK, "reason": "the LLM's pick"}), delay=1.5)
    results, _, starts = run(srv, llm, models, CHAIN_PLAN)
    assert choice_of(results, 1) == {"id": LLM_PICK, "reason": "the LLM's pick"}
    assert starts[LLM_PICK] >= 1.5 and TOP not in starts


def test_a_streamed_request_announces_the_choice_once_and_before_the_task_starts(server_for, llm, models):
    srv = server_for("auto")
    models.delays[CAPTIONER] = 0.3
    llm.on("choose_model", json.dumps({"id": LLM_PICK, "reason": "the LLM's pick"}), delay=3.0)
    llm.on("parse_task", json.dumps(CHAIN_PLAN))
    llm.on("response_results", "done")
    resp = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": REQUEST}], "stream": True},
                    stream=True)
    events = [json.loads(line[len("data: "):]) for line in resp.iter_lines(decode_unicode=True)
              if line.startswith("data: ")]
    names = [(e["event"], e.get("id")) for e in events if e.get("id") == 1]
    assert names.count(("model_selected", 1)) == 1
    assert names.index(("model_selected", 1)) < names.index(("task_started", 1))
    selected = next(e for e in events if e["event"] == "model_selected" and e.get("id") == 1)
    assert selected["model"] == TOP and "before its answer" in selected["reason"]
    assert events[-1]["event"] == "done"


def test_a_task_ready_before_the_ranking_waits_for_the_ranking_and_not_for_the_llm():
    """Plain data: the task is ready while its candidates are still being ranked; the ranking's pick comes and
    the task takes it at once (the LLM asked meanwhile is not waited for); the LLM's later answer changes nothing
    and the choice is announced once."""
    import threading
    from dataclasses import replace

    from hugginggpt.choose import Choice, selection_at_start
    from hugginggpt.plan import Task
    from hugginggpt.request import ChatRequest, RequestState
    from hugginggpt.select import Question, Selection

    events: list[tuple[str, dict]] = []
    state = RequestState(ChatRequest(messages=[{"role": "user", "content": REQUEST}]), None,  # type: ignore[arg-type]
                         lambda name, payload: events.append((name, payload)), timeout=30)
    task = Task(task="text-to-image", id=0, dep=[-1], args={"text": REQUEST})
    choice = state.selections[0] = Choice()
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(selection_at_start(state, task)), daemon=True)
    waiter.start()
    time.sleep(0.3)  # the task waits for the ranking
    assert not got
    kept = [(TOP, "local"), (LLM_PICK, "local")]
    pick = Selection(0, "text-to-image", TOP, "local", "top-ranked candidate", available={"local": [TOP, LLM_PICK]},
                     question=Question(kept, [], 0.001))
    choice.offer(pick)
    waiter.join(5)
    try:
        assert got and got[0].model_id == TOP and "before its answer" in got[0].reason
        assert not choice.settle(state, task, replace(pick, model_id=LLM_PICK, question=None))  # the LLM, too late
        assert state.selection_of(task).model_id == TOP
        assert [p["model"] for name, p in events if name == "model_selected"] == [TOP]
    finally:
        choice.settle(state, task, pick)  # never leave the waiter blocked


def test_a_round_runs_each_task_on_the_choice_made_for_it_not_on_a_later_one(tmp_path, public_dir):
    """Plain data: a streamed plan replaced by the full one is chosen again under the same task ids. A task of
    the replaced round that still starts runs on its own choice and leaves the new one alone (taking the new
    choice's ranked pick would cut off the LLM's answer for the task that replaces it)."""
    import threading

    from hugginggpt.choose import Choice
    from hugginggpt.config import load_config
    from hugginggpt.execute import Executor
    from hugginggpt.plan import Task
    from hugginggpt.request import ChatRequest, RequestState
    from hugginggpt.select import Question, Selection
    from hugginggpt.urlpolicy import UrlPolicy

    release, ran = threading.Event(), []

    class Backend:
        name = "local"

        def is_available(self, model_id: str) -> bool:
            return True

        def infer(self, model_id, inputs):
            if model_id == "first/model":
                release.wait(10)
            ran.append(model_id)
            return {"generated text": model_id}

    config = load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public_dir))
    executor = Executor(config, {"local": Backend()}, UrlPolicy())
    state = RequestState(ChatRequest(messages=[{"role": "user", "content": REQUEST}]), None,  # type: ignore[arg-type]
                         None, timeout=30)
    first = Task(id=1, task="image-to-text", dep=[-1], args={"image": "/examples/red.png"})
    second = Task(id=0, task="text-to-image", dep=[1], args={"text": "a fox"})

    def pick(task: Task, model: str) -> Selection:
        return Selection(task.id, task.task, model, "local", "ranked", available={"local": [model]},
                         question=Question([(model, "local")], [], 0.001))

    for task, model in ((first, "first/model"), (second, TOP)):
        choice = state.selections[task.id] = Choice()
        choice.offer(pick(task, model))
    round_ = executor.begin(state)
    round_.add(first)
    round_.add(second)  # the round keeps the choice made for this task
    newer = state.selections[0] = Choice()  # the full plan's task 0, chosen again; its LLM is still thinking
    newer.offer(pick(second, LLM_PICK))
    release.set()
    round_.finish()
    assert ran == ["first/model", TOP]
    assert not newer.done()  # the newer choice is still the LLM's to make
    newer.settle(state, second, pick(second, LLM_PICK))


def test_a_choice_never_made_ends_at_the_requests_deadline():
    """Plain data: a task whose model choice never comes (a selection that hangs) gets an error saying so when
    the request's deadline passes, instead of holding its thread for ever."""
    from hugginggpt.choose import Choice, selection_at_start
    from hugginggpt.plan import Task
    from hugginggpt.request import ChatRequest, RequestState
    from hugginggpt.select import Selection

    state = RequestState(ChatRequest(messages=[{"role": "user", "content": REQUEST}]), None,  # type: ignore[arg-type]
                         None, timeout=0.5)
    task = Task(task="text-to-image", id=0, dep=[-1], args={"text": REQUEST})
    choice = state.selections[0] = Choice()
    choice.ranked.set()  # ranked, but neither settled nor offered: the answer hangs
    import threading

    got: list = []
    waiter = threading.Thread(target=lambda: got.append(selection_at_start(state, task)), daemon=True)
    waiter.start()
    waiter.join(3.0)
    try:
        assert got, "the task still waits for a choice after the request's deadline"
        assert got[0].model_id is None
        assert got[0].error == "no model was chosen before the request's deadline (request_timeout)"
    finally:
        choice.settle(state, task, Selection(0, task.task, None, None, "", error="test over"))  # free the waiter
