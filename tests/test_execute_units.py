"""Stage 3 alone (execute.py): a task run on its chosen model, the fallback to the next candidate, `<GENERATED>-N`
resolved from earlier results, and a round of tasks with its events, deadline and cancellation. Each behaviour is
pinned where a user would notice it broken (mutation audit: docs/TESTING.md).

Models are the fake local models server (tests/fakes/models_server.py), the fake Hugging Face router with the real
hosted backend (tests/fakes/router_server.py), or, where a failure must be shaped exactly, a scripted backend."""

from __future__ import annotations

import sqlite3
import threading
import time
from concurrent.futures import Future

import pytest
from flask import Flask, Response

from hugginggpt.backends import CUT_OFF, HostedFailure, TaskInputs
from hugginggpt.backends.hosted import HostedInference
from hugginggpt.backends.local import LocalModelsServer
from hugginggpt.catalog.health import Health
from hugginggpt.choose import Choice
from hugginggpt.config import load_config
from hugginggpt.errors import BackendError
from hugginggpt.execute import Executor
from hugginggpt.llm import LLMClient
from hugginggpt.plan import Task
from hugginggpt.request import ChatRequest, RequestState, collect_result
from hugginggpt.resources import Resource
from hugginggpt.scheduler import CANCELLED, DONE, FAILED, TIMEOUT, TaskFailed
from hugginggpt.select import Selection
from hugginggpt.urlpolicy import UrlPolicy
from tests.conftest import wait_until, write_config
from tests.fakes.llm_server import ThreadedServer
from tests.fakes.router_server import FakeRouter, Served

LOOPBACK = UrlPolicy.from_entries(["127.0.0.1"])
TOKEN = "hf_execute_test_token"


# -- the parts -------------------------------------------------------------------------------------------------


class Scripted:
    """A backend answering each model as told: a result dict, an exception to raise, or a callable(inputs).
    Records every call; `gate`: every call waits for it; `delay`: seconds each call takes."""

    def __init__(self, name: str = "local", answers: dict | None = None, delay: float = 0.0):
        self.name = name
        self.answers = answers or {}
        self.delay = delay
        self.gate: threading.Event | None = None
        self.calls: list[tuple[str, TaskInputs]] = []
        self.threads: list[threading.Thread] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()

    def is_available(self, model_id: str) -> bool:
        return True

    def infer(self, model_id: str, inputs: TaskInputs) -> dict:
        with self.lock:
            self.calls.append((model_id, inputs))
            self.threads.append(threading.current_thread())
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                self.gate.wait(10)
            time.sleep(self.delay)
            answer = self.answers.get(model_id, {"generated text": f"{model_id} ran"})
            if isinstance(answer, BaseException):
                raise answer
            return answer(inputs) if callable(answer) else dict(answer)
        finally:
            with self.lock:
                self.in_flight -= 1

    def models_called(self) -> list[str]:
        return [m for m, _ in self.calls]


@pytest.fixture
def config(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    return load_config(write_config(tmp_path, llm.base_url, models_url, public_dir))


def configured(tmp_path, llm, public_dir, **extra):
    return load_config(write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, **extra))


def new_state(config, events: list | None = None, timeout: float = 30.0, text: str = "draw a fox") -> RequestState:
    request = ChatRequest.from_body({"messages": [{"role": "user", "content": text}]})
    listener = (lambda name, e: events.append((name, e))) if events is not None else None
    return RequestState(request, LLMClient(config.llm), listener, timeout)


def task(tid: int, kind: str = "image-to-text", dep=(-1,), error: str | None = None, **args) -> Task:
    return Task(tid, kind, list(dep), dict(args), error=error)


def selection(t: Task, model: str | None, hosted_on: str | None = "local", reason: str = "the best for it",
              error: str | None = None, **available: list[str]) -> Selection:
    if not available and model is not None and hosted_on in ("local", "huggingface"):
        available = {hosted_on: [model]}
    return Selection(t.id, t.task, model, hosted_on, reason, available=available, error=error)


def settled(sel: Selection) -> Future:
    future: Future = Future()
    future.set_result(sel)
    return future


def choose(state: RequestState, t: Task, model: str | None, hosted_on: str | None = "local", **kw) -> None:
    state.selections[t.id] = settled(selection(t, model, hosted_on, **kw))


def store() -> Health:
    return Health(sqlite3.connect(":memory:", check_same_thread=False))


def named(events: list, name: str, tid: int | None = None) -> list[dict]:
    return [e for n, e in events if n == name and (tid is None or e.get("id") == tid)]


@pytest.fixture(scope="module")
def file_server(public_dir):
    """A loopback web server with one image, and how often it was asked for it."""
    app = Flask("files")
    hits: list[str] = []

    @app.get("/red.png")
    def red() -> Response:
        hits.append("red.png")
        return Response((public_dir / "examples" / "red.png").read_bytes(), mimetype="image/png")

    server = ThreadedServer(app).start()
    yield server.url, hits
    server.stop()


@pytest.fixture(scope="module")
def router_server():
    fake = FakeRouter()
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def router(router_server):
    fake, url = router_server
    fake.reset()
    fake.models.clear()
    for name in ("org/a", "org/b", "org/c"):
        fake.serve(name, "text-to-image", Served("replicate", name, "text-to-image"))
    fake.serve("org/flux", "text-to-image", Served("fal-ai", "fal-ai/flux", "text-to-image"),
               Served("replicate", "org/flux", "text-to-image"))
    fake.preferences[TOKEN] = ["fal-ai", "replicate"]
    return fake, url


def hosted(router, public_dir) -> HostedInference:
    _, url = router
    return HostedInference(TOKEN, public_dir, router_url=url, hub_url=url, status_ttl=0)


# -- one task on its model -------------------------------------------------------------------------------------


def test_a_task_runs_on_its_chosen_model_with_its_inputs_and_leaves_the_plan_alone(config, public_dir):
    backend = Scripted(answers={"org/cap": {"generated text": "a red square"}}, delay=0.02)
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    planned = task(0, text="what is it", image="/examples/red.png", audio="/examples/hello.wav")
    choose(state, planned, "org/cap", reason="it captions best")
    record = executor.run_task(state, planned)
    assert record == {"task": planned.to_dict(), "inference result": {"generated text": "a red square"},
                      "choose model result": {"id": "org/cap", "reason": "it captions best"}}
    [(model, inputs)] = backend.calls
    red = (public_dir / "examples" / "red.png").read_bytes()
    hello = (public_dir / "examples" / "hello.wav").read_bytes()
    assert model == "org/cap"
    assert inputs == TaskInputs("image-to-text", text="what is it",
                                image=Resource(red, "image/png", "/examples/red.png", "/examples/red.png"),
                                audio=Resource(hello, inputs.audio.mime, "/examples/hello.wav", "/examples/hello.wav"))
    assert inputs.audio.mime.startswith("audio/")
    assert 0.02 <= state.model_seconds[0] < 2  # the time the model took, not the time since some other moment


def test_an_empty_argument_is_no_input_at_all(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-classification", text="fine weather", image="", audio="")
    choose(state, planned, "org/cls")
    assert executor.run_task(state, planned)["inference result"] == {"generated text": "org/cls ran"}
    assert backend.calls[0][1] == TaskInputs("text-classification", text="fine weather")


def test_the_local_models_server_is_sent_the_image_and_its_answer_comes_back(config, models, public_dir):
    models.models = {"org/captioner": "image-to-text"}
    local = LocalModelsServer(config.models_server_url, public_dir, policy=LOOPBACK)
    executor = Executor(config, {"local": local}, LOOPBACK)
    state = new_state(config)
    planned = task(0, image="/examples/red.png")
    choose(state, planned, "org/captioner")
    record = executor.run_task(state, planned)
    assert record["inference result"] == {"generated text": "a picture of 80x60 pixels"}
    assert [c["model"] for c in models.calls] == ["org/captioner"]
    assert models.calls[0]["body"]["img_url"].startswith("data:image/png;base64,")


def test_a_model_call_ends_at_the_requests_deadline(config, models, public_dir):
    models.models = {"org/slow": "image-to-text"}
    models.gates["org/slow"] = gate = threading.Event()
    local = LocalModelsServer(config.models_server_url, public_dir, task_timeout=60, policy=LOOPBACK)
    executor = Executor(config, {"local": local}, LOOPBACK)
    state = new_state(config, timeout=0.5)
    planned = task(0, image="/examples/red.png")
    choose(state, planned, "org/slow")
    records: list[dict] = []
    worker = threading.Thread(target=lambda: records.append(executor.run_task(state, planned)), daemon=True)
    worker.start()
    worker.join(4)
    gate.set()  # only now does the model answer
    worker.join(10)
    assert records, "the task did not end at the request's deadline"
    assert "error" in records[0]["inference result"]
    assert records[0]["inference result"]["error"]["message"].startswith("every candidate failed: org/slow (local): ")


def test_a_url_input_is_fetched_under_the_executors_url_policy(config, file_server, public_dir):
    url, hits = file_server
    hits.clear()
    planned = task(0, image=f"{url}/red.png")
    backend = Scripted()
    state = new_state(config)
    choose(state, planned, "org/cap")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert "error" not in record["inference result"], record
    assert backend.calls[0][1].image.data == (public_dir / "examples" / "red.png").read_bytes()
    assert hits == ["red.png"]
    # the same URL under the default policy (no loopback): refused before anything is fetched or run
    strict = Executor(config, {"local": backend}, UrlPolicy()).run_task(new_state(config), planned, choice=settled(
        selection(planned, "org/cap")))
    assert strict["inference result"]["error"]["message"].startswith("refusing ")
    assert strict["choose model result"] == {"id": "org/cap", "reason": "the best for it"}
    assert hits == ["red.png"] and len(backend.calls) == 1


def test_url_inputs_go_through_the_configured_proxy(tmp_path, llm, public_dir, file_server):
    url, hits = file_server
    hits.clear()
    config = configured(tmp_path, llm, public_dir, proxy="http://127.0.0.1:9")  # nothing listens there
    backend = Scripted()
    state = new_state(config)
    planned = task(0, image=f"{url}/red.png")
    choose(state, planned, "org/cap")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert "error" in record["inference result"]
    assert hits == [] and backend.calls == []


def test_an_input_over_max_fetch_bytes_fails_the_task_before_any_model_runs(tmp_path, llm, public_dir):
    config = configured(tmp_path, llm, public_dir, max_fetch_bytes=100)
    backend = Scripted()
    state = new_state(config)
    planned = task(0, image="/examples/red.png")
    choose(state, planned, "org/cap")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert record == collect_result(planned, {"id": "org/cap", "reason": "the best for it"}, {"error": {
        "message": "'/examples/red.png' is larger than the 0 MiB limit"}})
    assert backend.calls == [] and state.model_seconds == {}


def test_an_input_that_cannot_be_read_is_the_tasks_error(config):
    backend = Scripted()
    state = new_state(config)
    planned = task(0, image="/examples/missing.png")
    choose(state, planned, "org/cap")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert record["choose model result"] == {"id": "org/cap", "reason": "the best for it"}
    assert list(record["inference result"]) == ["error"]
    assert record["inference result"]["error"] == {
        "message": "file not found: '/examples/missing.png' (paths are relative to public/, e.g. /examples/a.jpg)"}
    assert backend.calls == []


def test_a_selection_that_failed_is_the_tasks_error_and_nothing_runs(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    planned = task(0)
    choose(state, planned, None, None, reason="", error="no model in the catalog does image-to-text")
    assert executor.run_task(state, planned) == collect_result(
        planned, "", {"error": {"message": "no model in the catalog does image-to-text"}})
    choose(state, planned, None, None, reason="")
    assert executor.run_task(state, planned) == collect_result(planned, "", {"error": {"message": "no model selected"}})
    assert backend.calls == []


def test_the_round_s_own_choice_is_the_one_the_task_runs_on(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    planned = task(0)
    choose(state, planned, "org/replacement")  # the request's choice now (a newer plan's task 0)
    record = executor.run_task(state, planned, settled(selection(planned, "org/own")))
    assert record["choose model result"]["id"] == "org/own" and backend.models_called() == ["org/own"]


def test_a_text_task_for_the_llm_is_answered_by_the_llm_with_the_task_and_request_in_its_prompt(config, llm):
    llm.on("text_task", "  Un café, en bref.  ")
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config, text="summarize: café au lait")
    planned = task(0, "summarization", text="café au lait")
    choose(state, planned, "ChatGPT", "llm", reason="the LLM does text tasks")
    record = executor.run_task(state, planned)
    assert record["choose model result"] == {"id": "ChatGPT", "reason": "the LLM does text tasks"}
    assert record["inference result"] == {"response": "  Un café, en bref.  "}
    [asked] = llm.stage_requests("text_task")
    assert asked["body"]["messages"] == [{"role": "user", "content": (
        'The request [ summarize: café au lait ] contains this task in JSON: {"task": "summarization", "id": 0, '
        '"dep": [-1], "args": {"text": "caf\\u00e9 au lait"}}. Act as a summarization system with the arguments '
        '{"text": "café au lait"} and give only the result, as plain text without URLs.')}]
    assert backend.calls == []


# -- the fallback to the next candidate ------------------------------------------------------------------------


def test_failed_candidates_fall_back_in_order_and_each_failure_is_reported(config, models, public_dir, caplog):
    models.models = {m: "image-to-text" for m in ("org/a", "org/b", "org/c", "org/d")}
    models.broken |= {"org/a", "org/b", "org/d"}
    local = LocalModelsServer(config.models_server_url, public_dir, policy=LOOPBACK)
    observed: list[tuple] = []
    executor = Executor(config, {"local": local}, LOOPBACK, observe_model=lambda *call: observed.append(call))
    executor.health = health = store()
    state = new_state(config)
    planned = task(0, image="/examples/red.png")
    choose(state, planned, "org/a", local=["org/a", "org/b", "org/d", "org/c"])
    with caplog.at_level("WARNING", logger="hugginggpt.execute"):
        record = executor.run_task(state, planned)
    tried = [{"model": m, "hosted_on": "local", "error": f"{m} crashed (scripted)"} for m in ("org/a", "org/b", "org/d")]
    assert record == collect_result(planned, {"id": "org/c", "reason": "fallback after org/d failed"},
                                    {"generated text": "a picture of 80x60 pixels", "fallback": {"tried": tried}})
    assert [(m, b, ok) for m, b, ok, _ in observed] == [
        ("org/a", "local", False), ("org/b", "local", False), ("org/d", "local", False), ("org/c", "local", True)]
    assert all(0 < seconds < 5 for *_, seconds in observed)
    assert health.get("org/a").failed == 1 and health.get("org/a").last_error == "org/a crashed (scripted)"
    assert health.get("org/c").ok == 1 and health.get("org/c").last_error is None
    assert health.get("org/c").ewma_seconds == observed[-1][3]
    assert state.failed_models == {"org/a", "org/b", "org/d"}
    rid = state.request.request_id
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.execute"] == [
        f"[{rid}] task 0: {m} on local failed: {m} crashed (scripted)" for m in ("org/a", "org/b", "org/d")]


def test_when_every_candidate_fails_the_error_names_each_with_its_reason(config):
    backend = Scripted(answers={"org/a": BackendError("the models server is unreachable"),
                                "org/b": {"error": "out of memory"}, "org/c": {"error": {"code": 7}}})
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a", local=["org/a", "org/b", "org/c"])
    record = executor.run_task(state, planned)
    tried = [{"model": "org/a", "hosted_on": "local", "error": "the models server is unreachable"},
             {"model": "org/b", "hosted_on": "local", "error": "out of memory"},
             {"model": "org/c", "hosted_on": "local", "error": "{'code': 7}"}]
    assert record == collect_result(planned, {"id": "org/a", "reason": "the best for it"}, {"error": {
        "message": "every candidate failed: org/a (local): the models server is unreachable; org/b (local): out of "
                   "memory; org/c (local): {'code': 7}", "tried": tried}})


def test_candidates_on_a_backend_this_server_lacks_are_passed_over(config):
    hub = Scripted("huggingface", answers={"org/h1": BackendError("overloaded")})
    executor = Executor(config, {"huggingface": hub}, LOOPBACK)  # no local models server here
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/h1", "huggingface", local=["org/l1"], huggingface=["org/h1", "org/h2"])
    record = executor.run_task(state, planned)
    assert record["choose model result"] == {"id": "org/h2", "reason": "fallback after org/h1 failed"}
    assert record["inference result"] == {"generated text": "org/h2 ran", "fallback": {"tried": [
        {"model": "org/h1", "hosted_on": "huggingface", "error": "overloaded"}]}}
    assert hub.models_called() == ["org/h1", "org/h2"]
    choose(state, planned, "org/l1", "local")
    assert executor.run_task(state, planned)["inference result"]["error"] == {
        "message": "every candidate failed: no backend", "tried": []}


def test_a_hosted_model_reports_its_provider_and_the_providers_that_failed_before_it(config, router, public_dir):
    fake, _ = router
    fake.failures["fal-ai"] = 503
    local = Scripted(answers={"org/l1": {"error": {"message": "l1 crashed"}}})
    executor = Executor(config, {"local": local, "huggingface": hosted(router, public_dir)}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-to-image", text="a fox")
    choose(state, planned, "org/l1", local=["org/l1"], huggingface=["org/flux"])
    record = executor.run_task(state, planned)
    assert record["choose model result"] == {"id": "org/flux", "reason": "fallback after org/l1 failed",
                                             "hosted_on": "huggingface", "provider": "replicate"}
    inference = record["inference result"]
    assert set(inference) == {"generated image", "fallback"}  # who served it is in the choice, not the output
    [first, second] = inference["fallback"]["tried"]
    assert first == {"model": "org/l1", "hosted_on": "local", "error": "l1 crashed"}
    assert (second["model"], second["hosted_on"], second["provider"]) == ("org/flux", "huggingface", "fal-ai")
    assert "503" in second["error"]
    assert [c["provider"] for c in fake.calls] == ["fal-ai", "replicate"]


def test_a_hosted_model_served_by_its_first_provider_has_no_fallback(config, router, public_dir):
    executor = Executor(config, {"huggingface": hosted(router, public_dir)}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-to-image", text="a fox")
    choose(state, planned, "org/flux", "huggingface", reason="the best painter")
    record = executor.run_task(state, planned)
    assert record["choose model result"] == {"id": "org/flux", "reason": "the best painter",
                                             "hosted_on": "huggingface", "provider": "fal-ai"}
    assert list(record["inference result"]) == ["generated image"]


def test_a_local_models_own_provider_field_is_its_output(config):
    backend = Scripted(answers={"org/who": {"generated text": "ACME", "provider": "ACME Corp"}})
    state = new_state(config)
    planned = task(0, "question-answering", text="who makes it?")
    choose(state, planned, "org/who")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert record["inference result"] == {"generated text": "ACME", "provider": "ACME Corp"}
    assert record["choose model result"] == {"id": "org/who", "reason": "the best for it"}


def test_a_refused_account_is_not_tried_again_and_says_nothing_of_the_models_health(config, router, public_dir):
    fake, _ = router
    fake.failures["replicate"] = 402  # no credits left
    local = Scripted(answers={"org/l1": {"error": {"message": "l1 crashed"}}})
    observed: list[tuple] = []
    executor = Executor(config, {"local": local, "huggingface": hosted(router, public_dir)}, LOOPBACK,
                        observe_model=lambda *call: observed.append(call))
    executor.health = health = store()
    state = new_state(config)
    planned = task(0, "text-to-image", text="a fox")
    choose(state, planned, "org/l1", local=["org/l1"], huggingface=["org/a", "org/b", "org/c"])
    record = executor.run_task(state, planned)
    error = record["inference result"]["error"]
    [local_failure, refused] = error["tried"]
    assert local_failure == {"model": "org/l1", "hosted_on": "local", "error": "l1 crashed"}
    assert (refused["model"], refused["provider"]) == ("org/a", "replicate") and "402" in refused["error"]
    assert error["message"] == (f"every candidate failed: org/l1 (local): l1 crashed; org/a (huggingface, replicate): "
                                f"{refused['error']}; 2 more huggingface candidate(s) not tried for the same reason")
    assert [c["provider"] for c in fake.calls] == ["replicate"]  # org/b and org/c were not asked
    assert [(m, b, ok) for m, b, ok, _ in observed] == [("org/l1", "local", False), ("org/a", "huggingface", False)]
    assert health.get("org/l1").failed == 1 and health.get("org/a") is None
    assert state.failed_models == {"org/l1", "org/a"}


def test_refusals_by_two_backends_are_named_together(config):
    def refusal(model: str, backend: str) -> HostedFailure:
        return HostedFailure("refused", [{"model": model, "hosted_on": backend, "provider": "p", "error": "no credits"}],
                             final=True)

    local = Scripted(answers={"org/l1": refusal("org/l1", "local")})
    hub = Scripted("huggingface", answers={"org/h1": refusal("org/h1", "huggingface")})
    executor = Executor(config, {"local": local, "huggingface": hub}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/l1", local=["org/l1", "org/l2"], huggingface=["org/h1", "org/h2"])
    message = executor.run_task(state, planned)["inference result"]["error"]["message"]
    assert message == ("every candidate failed: org/l1 (local, p): no credits; org/h1 (huggingface, p): no credits; "
                       "2 more huggingface and local candidate(s) not tried for the same reason")
    assert local.models_called() == ["org/l1"] and hub.models_called() == ["org/h1"]


def test_a_cancelled_request_runs_no_model_and_no_further_candidate(config, caplog):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    executor.health = health = store()
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a", local=["org/a", "org/b"])
    state.cancel()
    assert executor.run_task(state, planned)["inference result"]["error"] == {
        "message": "cancelled: the client left", "tried": []}
    assert backend.calls == []

    def leaves(inputs):  # the client goes away while org/a runs, and org/a fails because of it
        later.cancel()
        return {"error": {"message": "connection closed"}}

    backend.answers["org/a"] = leaves
    caplog.set_level("INFO", logger="hugginggpt")
    later = new_state(config)
    choose(later, planned, "org/a", local=["org/a", "org/b"])
    error = executor.run_task(later, planned)["inference result"]["error"]
    assert error == {"message": "cancelled: the client left",  # stopped, not failed, and no fallback after it
                     "tried": [{"model": "org/a", "hosted_on": "local", "error": "cancelled: the client left"}]}
    assert backend.models_called() == ["org/a"]
    assert health.get("org/a") is None  # a run cut short by the client says nothing about the model
    said = [r.getMessage() for r in caplog.records if "org/a" in r.getMessage()]
    assert said and all("cancelled: the client left" in m and "failed" not in m for m in said), said


def test_a_model_that_answered_as_the_client_left_is_still_recorded_healthy(config):
    executor = Executor(config, {"local": Scripted(answers={"org/a": lambda inputs: state.cancel() or {
        "generated text": "done"}})}, LOOPBACK)
    executor.health = health = store()
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a")
    assert executor.run_task(state, planned)["inference result"] == {"generated text": "done"}
    assert health.get("org/a").ok == 1


# -- health records --------------------------------------------------------------------------------------------


def test_a_long_error_is_kept_in_the_health_record_cut_to_300_characters(config):
    backend = Scripted(answers={"org/a": {"error": {"message": "e" * 299 + "fg" + "h" * 100}}})
    executor = Executor(config, {"local": backend}, LOOPBACK)
    executor.health = health = store()
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a")
    executor.run_task(state, planned)
    assert health.get("org/a").last_error == "e" * 299 + "f"


def test_models_the_catalog_does_not_know_get_no_health_record(config):
    executor = Executor(config, {"local": Scripted()}, LOOPBACK)
    executor.health = health = store()
    executor.records_health_of = lambda model_id: model_id != "someone/unknown"
    state = new_state(config)
    for tid, model in enumerate(("someone/unknown", "org/known")):
        planned = task(tid, "text-classification", text="hi")
        choose(state, planned, model)
        executor.run_task(state, planned)
    assert health.get("someone/unknown") is None and health.get("org/known").ok == 1


def test_without_a_catalog_store_models_run_and_no_health_error_is_logged(config, caplog):
    executor = Executor(config, {"local": Scripted()}, LOOPBACK)
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a")
    with caplog.at_level("DEBUG", logger="hugginggpt.execute"):
        assert executor.run_task(state, planned)["inference result"] == {"generated text": "org/a ran"}
    assert [r for r in caplog.records if r.name == "hugginggpt.execute"] == []


def test_a_store_that_cannot_record_does_not_fail_the_task(config, caplog):
    executor = Executor(config, {"local": Scripted()}, LOOPBACK)
    executor.health = health = store()
    health.conn.close()  # a full disk, a file gone: the record fails
    state = new_state(config)
    planned = task(0, "text-classification", text="hi")
    choose(state, planned, "org/a")
    with caplog.at_level("ERROR", logger="hugginggpt.execute"):
        assert executor.run_task(state, planned)["inference result"] == {"generated text": "org/a ran"}
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.execute"] == [
        "recording the health of org/a failed"]


# -- <GENERATED>-N ---------------------------------------------------------------------------------------------


def with_result(state: RequestState, tid: int, inference: dict, **args: str) -> None:
    state.results[tid] = collect_result(Task(tid, "some-task", [-1], dict(args)), {"id": "m", "reason": ""}, inference)


@pytest.mark.parametrize("key, inference, own, expected", [
    ("text", {"generated text": "gt", "text": "t", "response": "r", "answer": "a"}, {}, "gt"),
    ("text", {"text": "t", "response": "r", "answer": "a"}, {}, "t"),
    ("text", {"response": "r", "answer": "a"}, {}, "r"),
    ("text", {"answer": "a"}, {}, "a"),
    ("text", {"generated text": ["not", "text"], "text": "", "answer": "42"}, {}, "42"),
    ("text", {"predicted": [{"word": "été"}]}, {}, '[{"word": "été"}]'),
    ("text", {"predicted": None, "generated image": "/images/x.png"}, {"text": "a fox"}, "a fox"),
    ("image", {"generated image": "/images/x.png", "generated text": "no"}, {}, "/images/x.png"),
    ("image", {"predicted": [{"label": "cat"}]}, {"image": "/examples/red.png"}, "/examples/red.png"),
    ("audio", {"generated audio": "/audios/x.wav", "text": "no"}, {}, "/audios/x.wav"),
])
def test_a_reference_takes_the_dependencys_output_of_the_arguments_kind(config, key, inference, own, expected):
    state = new_state(config)
    with_result(state, 0, inference, **own)
    planned = task(1, dep=[0], **{key: "<GENERATED>-0"})
    Executor(config, {}, LOOPBACK).resolve_refs(state, planned)
    assert planned.args == {key: expected}


def test_every_reference_in_every_argument_is_replaced(config):
    state = new_state(config)
    with_result(state, 0, {"generated text": "a fox"})
    with_result(state, 3, {"generated image": "/images/fox.png"})
    planned = task(4, dep=[0, 3], audio="/examples/hello.wav", text="compare <GENERATED>-0 with <GENERATED>-0!",
                   image="<GENERATED>-3")
    Executor(config, {}, LOOPBACK).resolve_refs(state, planned)
    assert planned.args == {"audio": "/examples/hello.wav", "text": "compare a fox with a fox!",
                            "image": "/images/fox.png"}


@pytest.mark.parametrize("args, inference, own, message", [
    ({"text": "<GENERATED>-7"}, None, {}, "argument text needs the output of task 7, which has none"),
    ({"image": "<GENERATED>-0"}, {"generated text": "a fox"}, {}, "argument image needs a image from task 0, which "
                                                                  "produced none"),
    ({"text": "<GENERATED>-0"}, {}, {"text": "<GENERATED>-5"}, "argument text needs a text from task 0, which "
                                                               "produced none"),
    ({"audio": "<GENERATED>-0"}, {"generated audio": ""}, {"text": "hi"}, "argument audio needs a audio from task "
                                                                          "0, which produced none"),
])
def test_a_reference_to_nothing_fails_the_task_saying_what_is_missing(config, args, inference, own, message):
    state = new_state(config)
    if inference is not None:
        with_result(state, 0, inference, **own)
    with pytest.raises(TaskFailed) as failed:
        Executor(config, {}, LOOPBACK).resolve_refs(state, task(1, dep=[0], **args))
    assert str(failed.value) == message


def test_a_task_whose_reference_fails_reports_it_with_no_model_chosen(config):
    backend = Scripted()
    state = new_state(config)
    planned = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, planned, "org/a")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert record == collect_result(planned, "", {"error": {
        "message": "argument text needs the output of task 0, which has none"}})
    assert backend.calls == []


def test_the_record_shows_the_arguments_as_they_ran(config):
    backend = Scripted()
    state = new_state(config)
    with_result(state, 0, {"generated text": "a red fox"})
    planned = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, planned, "org/a")
    record = Executor(config, {"local": backend}, LOOPBACK).run_task(state, planned)
    assert record["task"]["args"] == {"text": "a red fox"} and backend.calls[0][1].text == "a red fox"
    assert planned.args == {"text": "<GENERATED>-0"}  # the plan itself keeps its reference


# -- a round of tasks ------------------------------------------------------------------------------------------


def test_a_round_runs_each_task_after_its_dependency_and_tells_each_step(config):
    backend = Scripted(answers={"org/paint": {"generated image": "/examples/red.png"},
                                "org/cap": {"generated text": "a red square"}}, delay=0.01)
    executor = Executor(config, {"local": backend}, LOOPBACK)
    events: list = []
    state = new_state(config, events)
    paint = task(0, "text-to-image", text="a red square")
    caption = task(1, dep=[0], image="<GENERATED>-0")
    choose(state, paint, "org/paint")
    choose(state, caption, "org/cap")
    outcomes = executor.execute(state, [paint, caption])
    assert {tid: o.state for tid, o in outcomes.items()} == {0: DONE, 1: DONE}
    assert state.outcomes == outcomes
    assert state.results[1] == collect_result(task(1, dep=[0], image="/examples/red.png"), {
        "id": "org/cap", "reason": "the best for it"}, {"generated text": "a red square"})
    assert [(e["id"], e["task"]) for e in named(events, "task_started")] == [(0, "text-to-image"), (1, "image-to-text")]
    finished = named(events, "task_finished")
    assert [(e["id"], e["task"]) for e in finished] == [(0, "text-to-image"), (1, "image-to-text")]
    for e in finished:
        record = state.results[e["id"]]
        assert e["result"] == record["inference result"] and e["args"] == record["task"]["args"]
        assert e["model_seconds"] == round(state.model_seconds[e["id"]], 4) and 0.01 <= e["model_seconds"] < 2
        assert "provider" not in e
    names = [(n, e.get("id")) for n, e in events]
    assert names.index(("task_finished", 0)) < names.index(("task_started", 1))


def test_a_task_the_plan_made_impossible_fails_and_its_dependents_are_skipped(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    events: list = []
    state = new_state(config, events)
    summary = task(1, "text-classification", text="hi")
    choose(state, summary, "org/cls")
    executor.execute(state, [summary])  # round 1: task 1 ran once
    events.clear()
    teleport = task(0, "teleport", error="teleport is not a task this server knows")
    again = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    pending = Choice()  # the LLM is still choosing task 1's model
    pending.offer(selection(again, "org/ranked", reason="top-ranked candidate"))
    state.selections[1] = pending
    outcomes = executor.execute(state, [teleport, again])  # round 2: task 1 depends on an impossible task
    assert {tid: o.state for tid, o in outcomes.items()} == {0: FAILED, 1: "skipped"}
    assert state.results[0] == collect_result(teleport, "", {"error": {
        "message": "teleport is not a task this server knows"}})
    skipped = "skipped: task 0 it depends on did not finish (teleport is not a task this server knows)"
    assert state.results[1] == collect_result(again, "", {"error": {"message": skipped}})
    assert backend.models_called() == ["org/cls"]
    [failed, dependent] = named(events, "task_failed")
    assert failed["id"] == 0 and failed["task"] == "teleport" and failed["error"] == teleport.error
    assert not {"skipped", "result", "model_seconds"} & set(failed)
    assert dependent["id"] == 1 and dependent["task"] == "text-classification" and dependent["skipped"] is True
    assert dependent["error"] == skipped and "model_seconds" not in dependent  # round 1's time is not this one's
    assert named(events, "task_skipped") == [] and named(events, "model_selected") == []
    assert not pending.done()  # a skipped task takes no model


def test_a_task_whose_model_failed_fails_with_its_record_and_skips_its_dependents(config):
    backend = Scripted(answers={"org/a": {"error": {"message": "boom"}}})
    executor = Executor(config, {"local": backend}, LOOPBACK)
    events: list = []
    state = new_state(config, events)
    first = task(0, "text-classification", text="hi")
    second = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, first, "org/a")
    choose(state, second, "org/b")
    outcomes = executor.execute(state, [first, second])
    assert outcomes[0].state == FAILED and outcomes[0].error == "every candidate failed: org/a (local): boom"
    assert state.results[0]["inference result"]["error"]["message"] == outcomes[0].error
    assert state.results[0]["choose model result"] == {"id": "org/a", "reason": "the best for it"}
    [failed] = named(events, "task_failed", 0)
    assert failed["error"] == outcomes[0].error and failed["result"] == state.results[0]["inference result"]
    assert failed["args"] == {"text": "hi"} and failed["model_seconds"] == round(state.model_seconds[0], 4)
    assert outcomes[1].state == "skipped" and backend.models_called() == ["org/a"]


def test_model_seconds_in_events_have_four_decimals(config):
    backend = Scripted(delay=0.003)
    events: list = []
    state = new_state(config, events)
    tasks = [task(i, "text-classification", text="hi") for i in range(6)]
    for t in tasks:
        choose(state, t, f"org/m{t.id}")
    Executor(config, {"local": backend}, LOOPBACK).execute(state, tasks)
    seconds = [e["model_seconds"] for e in named(events, "task_finished")]
    assert len(seconds) == 6 and all(s == round(s, 4) and s > 0 for s in seconds)


def test_a_task_served_by_an_inference_provider_says_which_in_its_event(config):
    hub = Scripted("huggingface", answers={"org/h": {"generated text": "hi", "provider": "replicate"}})
    events: list = []
    state = new_state(config, events)
    t = task(0, "text-generation", text="hi")
    choose(state, t, "org/h", "huggingface")
    Executor(config, {"huggingface": hub}, LOOPBACK).execute(state, [t])
    [finished] = named(events, "task_finished")
    assert (finished["model"], finished["hosted_on"], finished["provider"]) == ("org/h", "huggingface", "replicate")
    assert finished["result"] == {"generated text": "hi"}


def test_a_streamed_round_takes_the_rest_of_the_plan_and_finishes_as_one(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    first = task(0, "text-classification", text="hi")
    second = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, first, "org/a")
    choose(state, second, "org/b")
    streamed = executor.begin(state)
    streamed.add(first)  # the planner streamed task 0 and it started
    outcomes = executor.execute(state, [second], streamed)
    assert {tid: o.state for tid, o in outcomes.items()} == {0: DONE, 1: DONE}
    assert state.results[1]["task"]["args"] == {"text": "org/a ran"}


def test_each_task_runs_on_the_choice_made_when_it_joined_the_round(config):
    backend = Scripted()
    backend.gate = threading.Event()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    state = new_state(config)
    first = task(0, "text-classification", text="hi")
    second = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, first, "org/a")
    choose(state, second, "org/own")
    round_ = executor.begin(state)
    round_.add(first)
    round_.add(second)
    choose(state, second, "org/replacement")  # a newer plan's task 1 (the full plan replacing the streamed one)
    backend.gate.set()
    round_.finish()
    assert backend.models_called() == ["org/a", "org/own"]


def test_a_ready_task_takes_the_rankings_pick_while_the_llm_still_chooses(config):
    backend = Scripted()
    backend.gate = threading.Event()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    events: list = []
    state = new_state(config, events, timeout=3)
    first = task(5, "text-classification", text="hi")
    waiting = task(0, "text-classification", dep=[5], text="<GENERATED>-5")
    choose(state, first, "org/first")
    choice = Choice()
    choice.offer(selection(waiting, "org/ranked", reason="top-ranked candidate"))
    state.selections[0] = choice
    round_ = executor.begin(state)
    round_.add(first)
    round_.add(waiting)
    del state.selections[0]  # replaced meanwhile: the round keeps its own
    started = time.monotonic()
    backend.gate.set()
    outcomes = round_.finish()
    assert outcomes[0].state == DONE and time.monotonic() - started < 1.5  # not held until the LLM answers
    assert backend.models_called() == ["org/first", "org/ranked"]
    names = [(n, e.get("id")) for n, e in events]
    assert names.index(("model_selected", 0)) < names.index(("task_started", 0))
    [announced] = named(events, "model_selected", 0)
    assert announced["model"] == "org/ranked" and "inputs were ready before its answer" in announced["reason"]


def test_a_task_is_said_to_start_once_its_model_is_chosen(config):
    backend = Scripted()
    at: dict[str, float] = {}
    events: list = []

    def listen(name, e):
        events.append((name, e))
        at.setdefault(name, time.monotonic())

    state = new_state(config)
    state.on_event = listen
    t = task(0, "text-classification", text="hi")
    pending: Future = Future()
    state.selections[0] = pending

    def choose_later():
        at["chosen"] = time.monotonic()
        pending.set_result(selection(t, "org/late"))

    threading.Timer(0.3, choose_later).start()
    outcomes = Executor(config, {"local": backend}, LOOPBACK).execute(state, [t])
    assert outcomes[0].state == DONE and backend.models_called() == ["org/late"]
    assert at["task_started"] >= at["chosen"]


def test_a_choice_that_comes_after_the_deadline_runs_no_model(config):
    backend = Scripted()
    born = time.monotonic()
    state = new_state(config, timeout=0.3)
    t = task(0, "text-classification", text="hi")
    pending: Future = Future()
    state.selections[0] = pending
    threading.Timer(0.8, lambda: pending.set_result(selection(t, "org/late"))).start()
    outcomes = Executor(config, {"local": backend}, LOOPBACK).execute(state, [t])
    assert not outcomes[0].ok and "error" in state.results[0]["inference result"]
    time.sleep(max(0.0, born + 1.4 - time.monotonic()))
    assert pending.done() and backend.calls == []  # the request is over: nobody is served by that call


def test_at_the_deadline_the_round_ends_and_a_late_result_is_dropped(config):
    backend = Scripted()
    backend.gate = threading.Event()
    state = new_state(config, timeout=0.4)
    t = task(0, "text-classification", text="hi")
    choose(state, t, "org/slow")
    started = time.monotonic()
    outcomes = Executor(config, {"local": backend}, LOOPBACK).execute(state, [t])
    took = time.monotonic() - started
    assert 0.3 <= took < 1.0
    assert outcomes[0].state == TIMEOUT and outcomes[0].error == "deadline passed before the task finished"
    timed_out = collect_result(t, {"id": "org/slow", "reason": "the best for it"}, {"error": {
        "message": "deadline passed before the task finished", "tried": [
            {"model": "org/slow", "hosted_on": "local", "error": CUT_OFF}]}})  # the call the deadline cut off, by its choice
    assert state.results[0] == timed_out
    backend.gate.set()  # the model answers after all
    wait_until(lambda: backend.in_flight == 0, 5, "the late call to end")
    time.sleep(0.1)
    assert state.results[0] == timed_out


def test_cancelling_the_request_ends_its_round_and_runs_nothing_more(config):
    backend = Scripted()
    backend.gate = threading.Event()
    state = new_state(config)
    first = task(0, "text-classification", text="hi")
    second = task(1, "text-classification", dep=[0], text="<GENERATED>-0")
    choose(state, first, "org/a")
    choose(state, second, "org/b")

    def leave():
        wait_until(lambda: backend.in_flight == 1, 5, "task 0 to start")
        state.cancel()

    threading.Thread(target=leave, daemon=True).start()
    started = time.monotonic()
    outcomes = Executor(config, {"local": backend}, LOOPBACK).execute(state, [first, second])
    assert time.monotonic() - started < 3
    assert {tid: o.state for tid, o in outcomes.items()} == {0: CANCELLED, 1: CANCELLED}
    assert state.results[1] == collect_result(second, "", {"error": {"message": "cancelled by the client"}})
    backend.gate.set()
    wait_until(lambda: backend.in_flight == 0, 5, "the cut call to end")
    time.sleep(0.05)
    assert backend.models_called() == ["org/a"]


def test_a_round_begun_after_the_client_left_runs_nothing(config):
    backend = Scripted()
    state = new_state(config)
    t = task(0, "text-classification", text="hi")
    choose(state, t, "org/a")
    state.cancel()
    outcomes = Executor(config, {"local": backend}, LOOPBACK).execute(state, [t])
    assert outcomes[0].state == CANCELLED and backend.calls == []
    assert state.results[0] == collect_result(t, "", {"error": {"message": "cancelled by the client"}})


# -- task threads ----------------------------------------------------------------------------------------------


def test_a_round_runs_at_most_max_workers_tasks_at_once(tmp_path, llm, public_dir):
    for workers in (1, 2):
        config = configured(tmp_path, llm, public_dir, max_workers=workers)
        backend = Scripted()
        backend.gate = threading.Event()
        state = new_state(config)
        tasks = [task(i, "text-classification", text="hi") for i in range(2)]
        for t in tasks:
            choose(state, t, f"org/m{t.id}")
        runner = threading.Thread(target=Executor(config, {"local": backend}, LOOPBACK).execute, args=(state, tasks))
        runner.start()
        try:
            wait_until(lambda: backend.in_flight == workers, 5, f"{workers} task(s) running")
            time.sleep(0.1)  # room for one more to start, if the round let it
            assert backend.most_in_flight == workers
        finally:
            backend.gate.set()
            runner.join(10)
        assert len(backend.calls) == 2


def test_every_admitted_request_gets_its_max_workers_tasks_running_at_once(tmp_path, llm, public_dir):
    config = configured(tmp_path, llm, public_dir, max_workers=2, max_concurrent_requests=17)  # 34 tasks at once
    backend = Scripted()
    backend.gate = threading.Event()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    rounds = []
    for _ in range(17):
        state = new_state(config)
        round_ = executor.begin(state)
        for i in range(2):
            t = task(i, "text-classification", text="hi")
            choose(state, t, f"org/m{i}")
            round_.add(t)
        rounds.append(round_)
    try:
        wait_until(lambda: backend.in_flight == 34, 3, "34 tasks running at once")
    finally:
        backend.gate.set()
    assert all(r.finish()[0].state == DONE for r in rounds)


def test_requests_share_the_task_threads_instead_of_starting_their_own(config):
    backend = Scripted()
    executor = Executor(config, {"local": backend}, LOOPBACK)
    for _ in range(5):
        state = new_state(config)
        t = task(0, "text-classification", text="hi")
        choose(state, t, "org/a")
        executor.execute(state, [t])
        time.sleep(0.05)  # the thread goes back to the pool
    assert len(set(backend.threads)) <= 2
    # a thread dump of the server (py-spy, faulthandler) names them as the request's tasks, not as some pool
    assert all(thread.name.startswith("task_") for thread in backend.threads)


def test_a_deadline_that_cuts_a_task_off_keeps_what_it_tried(config, router, public_dir):
    """The first candidate's providers failed, the second model's first provider failed, and its second provider was
    still answering when the request's deadline passed: the record lists all of it (a provider silent past the
    deadline is the one it was waiting for)."""
    fake, _ = router
    fake.serve("org/a", "text-to-image", Served("fal-ai", "org/a", "text-to-image"))
    fake.serve("org/b", "text-to-image", Served("replicate", "org/b", "text-to-image"),
               Served("fal-ai", "org/b-fal", "text-to-image"))
    fake.preferences[TOKEN] = ["replicate", "fal-ai"]
    fake.failures["fal-ai"], fake.hangs["replicate"] = 503, 0.2
    slow = Scripted("huggingface", delay=5)  # a backend that only the deadline stops waiting for
    real = hosted(router, public_dir)

    class Both:  # org/a and org/b on the real hosted backend, then org/c on one that never answers in time
        name = "huggingface"

        def is_available(self, model_id: str) -> bool:
            return True

        def infer(self, model_id: str, inputs: TaskInputs) -> dict:
            return (slow if model_id == "org/c" else real).infer(model_id, inputs)

    state = new_state(config, timeout=2.5)
    t = task(0, "text-to-image", text="a fox")
    fake.failures["replicate"] = 500
    choose(state, t, "org/a", "huggingface", huggingface=["org/a", "org/b", "org/c"])
    outcomes = Executor(config, {"huggingface": Both()}, LOOPBACK).execute(state, [t])
    assert outcomes[0].state == TIMEOUT
    tried = state.results[0]["inference result"]["error"]["tried"]
    assert [(e["model"], e.get("provider")) for e in tried] == [
        ("org/a", "fal-ai"), ("org/b", "replicate"), ("org/b", "fal-ai"), ("org/c", None)]
    assert "503" in tried[0]["error"] and "500" in tried[1]["error"] and tried[-1]["error"] == CUT_OFF
    # and the record says which model was chosen for it, as a finished task's does
    assert state.results[0]["choose model result"]["id"] == "org/a"


def test_a_refusal_holds_for_the_rest_of_the_request_and_the_local_server_still_runs(config):
    """402 from hosted inference in the first round: a later round (a replan) sends nothing there, the local models
    server's candidates still run (hybrid)."""
    refusal = HostedFailure("no credits", [{"model": "org/h1", "hosted_on": "huggingface", "provider": "fal-ai",
                                            "error": "no credits (402)"}], final=True)
    hub = Scripted("huggingface", answers={"org/h1": refusal})
    local = Scripted()
    executor = Executor(config, {"local": local, "huggingface": hub}, LOOPBACK)
    state = new_state(config)
    first = task(0, "text-to-image", text="a fox")
    choose(state, first, "org/h1", "huggingface", huggingface=["org/h1"])
    executor.execute(state, [first])
    assert state.refused == {"huggingface": "no credits"}
    second = task(1, "text-to-image", text="a fox, again")
    choose(state, second, "org/h2", "huggingface", huggingface=["org/h2"], local=["org/l1"])
    executor.execute(state, [second])
    assert hub.models_called() == ["org/h1"] and local.models_called() == ["org/l1"]
    assert state.results[1]["choose model result"] == {
        "id": "org/l1", "reason": "fallback: huggingface refused the account earlier in this request"}
    third = task(2, "text-to-image", text="only hosted")
    choose(state, third, "org/h3", "huggingface", huggingface=["org/h3"])
    executor.execute(state, [third])
    assert hub.models_called() == ["org/h1"]
    assert state.results[2]["inference result"]["error"]["message"] == (
        "every candidate failed: 1 huggingface candidate(s) not tried: the account was refused earlier in this "
        "request (no credits)")


def test_a_deadline_that_ends_a_hosted_model_ends_the_task_but_refuses_no_account(config):
    """Timed out at the deadline: the task ends there (no later candidate has time, nor is charged a failure), but the
    account was not refused: nothing is remembered as refused for the request."""
    late = HostedFailure("late", [{"model": "org/h1", "hosted_on": "huggingface", "provider": "fal-ai",
                                   "error": "fal-ai timed out (the deadline passed)"}], final=True, account=False)
    hub = Scripted("huggingface", answers={"org/h1": late})
    executor = Executor(config, {"huggingface": hub}, LOOPBACK)
    state = new_state(config)
    t = task(0, "text-to-image", text="a fox")
    choose(state, t, "org/h1", "huggingface", huggingface=["org/h1", "org/h2"])
    record = executor.run_task(state, t)
    assert state.refused == {} and hub.models_called() == ["org/h1"]
    assert record["inference result"]["error"]["message"] == (
        "every candidate failed: org/h1 (huggingface, fal-ai): fal-ai timed out (the deadline passed)")


def test_no_candidate_is_asked_once_the_requests_deadline_has_passed(config):
    hub = Scripted("huggingface", answers={"org/h1": BackendError("slow"), "org/h2": BackendError("slow")}, delay=0.3)
    executor = Executor(config, {"huggingface": hub}, LOOPBACK)
    state = new_state(config, timeout=0.2)
    t = task(0, "text-to-image", text="a fox")
    choose(state, t, "org/h1", "huggingface", huggingface=["org/h1", "org/h2"])
    executor.run_task(state, t)
    assert hub.models_called() == ["org/h1"]  # org/h2 would only fail at once, and be counted as failing
