"""Long work you can watch (issue 48): the models server's progress events, and the orchestrator's relay of them.

The real models_server.py runs a tiny Stable Diffusion pipeline and a tiny GPT-2; the real orchestrator runs a
plan from the scripted LLM against it. A client that asks (`Accept: text/event-stream`) gets `progress` events,
then the same result the one-shot answer carries; the orchestrator's stream carries them as `task_progress`.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from tests.conftest import make_public, sse, start_server, stop_server, wait_until, write_config
from tests.test_models_server import start_models_server
from tests.tiny_models import causal_lm, tiny_stable_diffusion

SD = "stable-diffusion-v1-5/stable-diffusion-v1-5"
GPT2 = "openai-community/gpt2"
WATCH = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progress-box")
    models_dir = folder / "models"
    tiny_stable_diffusion(models_dir / SD)
    causal_lm(models_dir / GPT2)
    public = make_public(folder / "public")
    proc, url = start_models_server(folder, models_dir, public, deployment="full")
    yield url, public, proc
    proc.terminate()
    proc.wait(10)


def watch(url: str, model: str, body: dict, **kw) -> requests.Response:
    return requests.post(f"{url}/models/{model}", json=body, headers=WATCH, stream=True, timeout=120, **kw)


def test_a_diffusion_call_streams_each_step_in_order_then_the_one_shot_result(box):
    url, public, _ = box
    resp = watch(url, SD, {"text": "a red square", "steps": 7})
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(resp)
    names = [name for name, _ in events]
    assert names[-1] == "result" and names.count("result") == 1 and "error" not in names
    steps = [e for name, e in events if name == "progress" and "step" in e]
    assert [e["step"] for e in steps] == list(range(1, 8))
    assert all(e["steps"] == 7 and e["phase"] == "running" for e in steps)
    assert [e["fraction"] for e in steps] == [round(k / 7, 4) for k in range(1, 8)]
    assert "eta" not in steps[0]  # no pace yet after one step
    assert all(e["eta"] >= 0 for e in steps[1:]) and steps[-1]["eta"] == 0
    phases = [e["phase"] for name, e in events if name == "progress"]
    assert phases.index("running") == len(phases) - 8  # "running", then its 7 steps, nothing after
    result = events[-1][1]
    assert result["path"].startswith("/images/") and (public / result["path"].lstrip("/")).is_file()
    # the same call without asking: JARVIS's one-shot JSON answer, the same keys
    plain = requests.post(f"{url}/models/{SD}", json={"text": "a red square", "steps": 2}, timeout=120)
    assert plain.status_code == 200 and plain.headers["Content-Type"].startswith("application/json")
    assert set(plain.json()) == set(result)


def test_the_first_use_says_loading_before_it_runs_and_tokens_count_as_steps(box):
    url, _, _ = box
    events = sse(watch(url, GPT2, {"text": "hello there", "max_new_tokens": 6}))
    phases = [e["phase"] for name, e in events if name == "progress"]
    assert phases[:2] == ["loading", "running"], events  # the first use of the model in this server
    steps = [e for name, e in events if name == "progress" and "step" in e]
    assert steps and [e["step"] for e in steps] == list(range(1, len(steps) + 1))
    assert all(e["steps"] == 6 for e in steps)
    assert events[-1][0] == "result" and "generated text" in events[-1][1]
    again = sse(watch(url, GPT2, {"text": "hello there", "max_new_tokens": 6}))
    assert "loading" not in [e.get("phase") for _, e in again]  # in memory now


def test_an_error_during_the_call_is_the_last_event_with_its_status_and_a_refusal_before_it_is_plain_json(box):
    url, _, _ = box
    first = watch(url, SD, {"steps": 3})  # no text: found by the handler, after the load
    assert first.headers["Content-Type"].startswith("text/event-stream"), (first.status_code, first.text[:300])
    events = sse(first)
    assert events[-1][0] == "error" and events[-1][1]["status"] == 400, events
    assert "`text` is required" in events[-1][1]["error"]["message"]
    # a bad option is refused before the stream starts, with the one-shot call's status and words
    for steps in (200, "25", True):
        streamed = watch(url, SD, {"text": "a cat", "steps": steps})
        plain = requests.post(f"{url}/models/{SD}", json={"text": "a cat", "steps": steps}, timeout=60)
        assert streamed.status_code == plain.status_code == 400
        assert streamed.headers["Content-Type"].startswith("application/json")
        assert streamed.json() == plain.json() and "`steps` must be a whole number from 1 to 150" in \
            plain.json()["error"]["message"]
    assert watch(url, GPT2, {"text": "x", "max_new_tokens": 5000}).status_code == 400
    refused = watch(url, "nobody/unknown-model", {"text": "x"})  # nothing to run: refused before any work
    assert refused.status_code == 404 and refused.headers["Content-Type"].startswith("application/json")
    assert "unknown model" in refused.json()["error"]["message"]
    bad = watch(url, SD, {"text": "\ud800"})
    assert bad.status_code == 400 and "lone surrogate" in bad.json()["error"]["message"]


@pytest.mark.parametrize("accept", ["application/json", "*/*", "text/event-stream;q=0"])
def test_a_client_that_does_not_ask_for_events_gets_the_one_shot_answer(box, accept):
    url, _, _ = box
    resp = requests.post(f"{url}/models/{SD}", json={"text": "a cat", "steps": 1}, headers={"Accept": accept},
                         timeout=120)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("application/json")
    assert resp.json()["path"].startswith("/images/")


def test_a_client_that_leaves_stops_the_run_at_its_next_step(box):
    url, _, proc = box
    resp = watch(url, SD, {"text": "a long one", "steps": 150})
    lines = resp.iter_lines(decode_unicode=True)
    for line in lines:
        if line.startswith("data: ") and '"step":2' in line:
            break
    resp.close()  # the client leaves at step 2 of 150
    wait_until(lambda: "stopped: its client left" in proc.log_path.read_text(), timeout=20,
               what="the models server to stop the run")
    # the model is free again at once: a watched call after it is not queued behind 148 more steps
    events = sse(watch(url, SD, {"text": "next", "steps": 2}))
    assert events[-1][0] == "result"
    assert "queued" not in [e.get("phase") for _, e in events]


def one_shot_socket(url: str, model: str, body: dict):
    """A one-shot `POST /models/<id>` sent on a bare socket that the test closes whenever it likes (no events)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((where.hostname, where.port), timeout=30)
    sock.sendall(f"POST /models/{model} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def cancelled_calls(url: str, model: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf'models_server_calls_total{{model="{re.escape(model)}",outcome="cancelled"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_a_one_shot_caller_that_leaves_stops_the_run_and_the_next_caller_runs_at_once(box):
    """A one-shot call (JARVIS's own kind: no events) whose client closes its socket after the run has begun
    stops at its next step, as a streamed one does; B, queued behind it, runs as soon as A stops."""
    url, _, proc = box

    def stopped() -> int:
        return proc.log_path.read_text().count("stopped: its client left")

    before, cancelled = stopped(), cancelled_calls(url, SD)
    a = one_shot_socket(url, SD, {"text": "a long one", "steps": 150})
    time.sleep(0.3)  # A reaches the server first (B, sent with it, could take the model before A)
    b = watch(url, SD, {"text": "next", "steps": 2})
    b_lines = b.iter_lines(decode_unicode=True)
    for line in b_lines:
        if line.startswith("data: ") and '"queued"' in line:
            break  # B waits behind A's run: A is running
    else:
        raise AssertionError("B never heard that it was queued behind A")
    a.close()  # A leaves, its 150 steps barely begun
    left = time.monotonic()
    rest = list(b_lines)
    b_ran = time.monotonic() - left
    assert any(line.startswith("event: result") for line in rest)  # B ran, and answered
    assert stopped() == before + 1  # A was stopped, not run to its end
    assert cancelled_calls(url, SD) == cancelled + 1  # counted as cancelled, not as the model's error
    # B waited for A's next step, not for A's last: a whole run of 150 steps takes far longer than B's 2
    steps = sse(watch(url, SD, {"text": "pace", "steps": 20}))
    per_step = max(e.get("eta", 0) for _, e in steps if "step" in e) / 18 if len(steps) > 3 else 0.05
    assert b_ran < 10 + 40 * per_step, (b_ran, per_step)


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory, llm_server, box):
    url, _, _ = box
    folder = tmp_path_factory.mktemp("progress-orchestrator")
    public = make_public(folder / "public")
    config = write_config(folder, llm_server.base_url, url, public, local_deployment="full",
                          semantic_ranking=False, progress_interval_ms=0, request_timeout=120)
    srv = start_server(config, folder)
    yield srv
    stop_server(srv)


def plan_one_image(llm) -> None:
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1],
                                      "args": {"text": "a red square"}}]))
    llm.on("choose_model", json.dumps({"id": SD, "reason": "the only one"}))
    llm.on("response_results", "Here is your picture.")


def test_the_orchestrator_stream_relays_every_step_as_task_progress(orchestrator, llm, box):
    plan_one_image(llm)
    t0 = time.monotonic()
    resp = orchestrator.post("/hugginggpt", {"messages": [{"role": "user", "content": "draw a red square"}],
                                             "stream": True}, stream=True, timeout=120)
    assert resp.status_code == 200
    events = sse(resp)
    assert time.monotonic() - t0 < 120
    names = [name for name, _ in events]
    progress = [e for name, e in events if name == "task_progress"]
    steps = [e for e in progress if "step" in e]
    assert steps, names
    n = steps[0]["steps"]
    assert [e["step"] for e in steps] == list(range(1, n + 1))  # the default 25 steps, each relayed in order
    assert steps[-1]["t"] - steps[0]["t"] > 0.1  # relayed as the model ran them, not all at once at its end
    assert all(e["id"] == 0 and e["task"] == "text-to-image" and e["model"] == SD and e["hosted_on"] == "local"
               for e in progress)
    first_progress = names.index("task_progress")
    assert names.index("task_started") < first_progress < names.index("task_finished")
    assert max(i for i, name in enumerate(names) if name == "task_progress") < names.index("task_finished")
    allowed = {"event", "request_id", "t", "id", "task", "model", "hosted_on", "phase", "step", "steps",
               "fraction", "eta", "bytes", "total_bytes", "waiting"}
    assert all(set(e) <= allowed for e in progress)
    # the plain answer of the same request carries no progress and still works
    plain = orchestrator.post("/hugginggpt", {"messages": [{"role": "user", "content": "draw a red square"}]},
                              timeout=120)
    assert plain.status_code == 200 and "picture" in plain.json()["message"]


# -- the web page ----------------------------------------------------------------------------------------------

from tests.test_web import ARTIFACTS, CHROMIUM, page, sync_playwright  # noqa: E402, F401 - the browser fixture

needs_browser = pytest.mark.skipif(sync_playwright is None or not __import__("os").path.exists(CHROMIUM),
                                   reason=f"browser test needs playwright and Chromium at {CHROMIUM}")

# The page's own event handler, wrapped: each event is handled as the page handles it, then the task card's
# progress label is read at once (two events can arrive in one read, so a later look would miss the first).
# `hold_at` keeps events from the page once that step has been drawn, so a screenshot shows a run mid-way.
RECORD = """hold_at => {
  window.__labels = []; window.__held = []; window.__holding = false;
  const real = window.onEvent;
  window.__release = () => { window.__holding = false; window.__held.splice(0).forEach(a => window.onEvent(...a)); };
  window.onEvent = (name, e, bubble) => {
    if (window.__holding) { window.__held.push([name, e, bubble]); return; }
    real(name, e, bubble);
    if (name !== "task_progress") return;
    const label = document.querySelector('.task[data-id="0"] .progress .plabel');
    const bar = document.querySelector('.task[data-id="0"] .progress .pfill');
    window.__labels.push([label ? label.textContent : null, bar ? bar.style.width : null]);
    if (e.step === hold_at) window.__holding = true;
  };
}"""


@needs_browser
def test_the_web_page_draws_each_step_on_the_task_card_with_its_eta(orchestrator, llm, page):  # noqa: F811
    plan_one_image(llm)
    page.goto(orchestrator.url + "/")
    page.evaluate(RECORD, 10)
    page.fill("#input", "draw a red square")
    page.keyboard.press("Enter")
    page.wait_for_function("window.__holding", timeout=60000)
    card = page.locator('.task[data-id="0"]')
    assert card.locator(".progress").get_attribute("aria-valuenow") == "40"
    assert card.locator(".progress .plabel").inner_text().startswith("step 10 of 25 · about ")
    assert "running · 40%" in page.text_content('#graph .node[data-id="0"]')  # an SVG node
    page.screenshot(path=str(ARTIFACTS / "progress-1280.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    card.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "progress-390.png"))
    page.evaluate("window.__release()")
    page.wait_for_selector("#chat .assistant[data-done='1']", timeout=60000)
    labels = page.evaluate("window.__labels")
    steps = [label for label, _ in labels if label and label.startswith("step ")]
    assert [s.split(" · ")[0] for s in steps] == [f"step {k} of 25" for k in range(1, 26)]
    # an ETA once there is a pace; the last step says the result is still being made, never "about 0 s left"
    assert all(" · about " in s and s.endswith(" s left") for s in steps[1:-1]), steps
    assert steps[-1] == "step 25 of 25 · finishing"
    widths = [float(w.rstrip("%")) for label, w in labels if label and label.startswith("step ")]
    assert widths == sorted(widths) and widths[-1] == 100.0
    assert card.locator(".progress").count() == 0  # done: the bar gives way to the picture
    assert card.locator("img").count() == 1


# -- the CLI ---------------------------------------------------------------------------------------------------


def test_the_cli_keeps_one_line_per_running_task_rewritten_in_place(tmp_path, llm_server, llm, box):
    import sys

    from tests.conftest import ROOT
    from tests.test_cli_pty import Terminal

    url, _, _ = box
    public = make_public(tmp_path / "public")
    config = write_config(tmp_path, llm_server.base_url, url, public, local_deployment="full",
                          semantic_ranking=False, progress_interval_ms=0, request_timeout=120)
    plan_one_image(llm)
    term = Terminal([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "cli"])
    try:
        term.read_until("[ User ]: ")
        shown = len(term.text)
        term.type("draw a red square\n")
        term.read_until("[ Jarvis ]:", timeout=120)
        text = term.text[shown:]
    finally:
        term.close()
    steps = re.findall(r"#0 text-to-image: (step \d+ of 25)", text)
    assert steps == [f"step {k} of 25" for k in range(1, 26)]
    assert re.search(r"#0 text-to-image: step 25 of 25 · finishing", text) and "about 0 s left" not in text
    # each update first takes the line off the screen (cursor up one line, clear below), then writes it again
    assert text.count("\x1b[1F\x1b[J") >= 25
    # when the task ends its progress line is taken off and the "done" line takes its place; nothing is redrawn
    assert re.search(r"step 25 of 25[^\n]*\n\x1b\[1F\x1b\[J +\[ *[\d.]+s\] #0 text-to-image done: model ran", text)
    assert "text-to-image: step" not in text[text.index("done: model ran"):]
    # the same request from a script: its lines go to a pipe, where a line rewritten in place would be noise
    import subprocess

    plan_one_image(llm)
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                          "--input", "draw a red square"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "#0 text-to-image done: model ran" in run.stderr
    assert "step 1 of 25" not in run.stderr and "\x1b[" not in run.stderr


# -- the Gradio app --------------------------------------------------------------------------------------------


def test_the_gradio_app_shows_each_step_in_the_task_message_the_plan_and_gradio_s_own_bar(tmp_path, llm_server, llm,
                                                                                           box):
    pytest.importorskip("gradio_client")
    from tests.test_gradio_app import start_app, stop_app, texts

    url, _, _ = box
    public = make_public(tmp_path / "public")
    config = write_config(tmp_path, llm_server.base_url, url, public, local_deployment="full",
                          semantic_ranking=False, progress_interval_ms=0, request_timeout=120)
    app = start_app(tmp_path, "--config", str(config))
    try:
        plan_one_image(llm)
        client = app.client()
        bars: list = []
        job = client.submit({"text": "draw a red square", "files": []}, api_name="/chat",
                            result_callbacks=None)
        while not job.done():
            status = job.status()
            if status.progress_data:
                bars.append([(u.index, u.length, u.progress, u.desc) for u in status.progress_data])
            time.sleep(0.01)
        chat, plan, _ = job.result(timeout=60)
        outputs = job.outputs()
    finally:
        stop_app(app)
    # the answer, then the file it did not name, as served (answercheck)
    assert re.fullmatch(r"Here is your picture\.\n\nFiles made: /images/\w+\.png \(task 0, text-to-image\)",
                        texts(chat)[-1])
    said = []
    for out in outputs:
        said += [t for t in texts(out[0]) if t.startswith("running… step ")]
    steps = [int(re.match(r"running… step (\d+) of 25", t).group(1)) for t in said]
    assert steps == sorted(steps) and steps[-1] == 25 and len(set(steps)) >= 20  # the page redraws what it is sent
    statuses = [row[4] for out in outputs for row in out[1]["data"]]
    assert "running 100%" in statuses and statuses[-1] == "done"
    assert any(desc and desc.startswith("#0 text-to-image: step ") for bar in bars for *_, desc in bar), bars


# -- MCP -------------------------------------------------------------------------------------------------------

MCP_TOKEN = "progress-mcp-token"


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_mcp_client_with_a_progress_token_gets_each_step_as_a_rising_notification(tmp_path, llm_server, llm, box,
                                                                                      transport):
    import asyncio
    import sys

    from mcp import Client, StdioServerParameters

    from tests.conftest import ROOT
    from tests.test_mcp import http_client

    url, _, _ = box
    public = make_public(tmp_path / "public")
    config = write_config(tmp_path, llm_server.base_url, url, public, local_deployment="full",
                          semantic_ranking=False, progress_interval_ms=0, request_timeout=120,
                          api_tokens=[MCP_TOKEN])
    server = None
    if transport == "stdio":
        def connect():
            return Client(StdioServerParameters(command=sys.executable, args=["-m", "hugginggpt.mcp", "--config",
                                                                              str(config)], cwd=str(ROOT)))
    else:
        server = start_server(config, tmp_path)

        def connect():
            return http_client(server.url + "/mcp", MCP_TOKEN)
    plan_one_image(llm)
    notes: list[tuple] = []
    answered_at: list[float] = []

    heard_at: list[float] = []

    async def heard(progress, total, message):
        notes.append((progress, total, message))
        heard_at.append(time.monotonic())

    async def go():
        async with connect() as client:
            whole = await client.call_tool("hugginggpt", {"text": "draw a red square"}, progress_callback=heard)
            answered_at.append(time.monotonic())
            quiet = await client.call_tool("hugginggpt", {"text": "draw a red square"})  # no token: no notes
            one = await client.call_tool("run_model", {"task": "text-to-image", "model": SD, "text": "a square"},
                                         progress_callback=heard)
            return whole, quiet, one

    try:
        whole, quiet, one = asyncio.run(asyncio.wait_for(go(), 120))
    except BaseException:
        if server is not None:
            print(server.logs()[-5000:])
        raise
    finally:
        if server is not None:
            stop_server(server)
    assert not whole.is_error and not quiet.is_error and not one.is_error
    first, second = notes[:27], notes[27:]
    # the task's start, each of its 25 steps, its end: rising to 1.0 as the task (and with it the request) ends
    assert first[0] == (0.02, 1.0, "#0 text-to-image: started") and first[-1] == (1.0, 1.0, "#0 text-to-image: done")
    steps = first[1:-1]
    assert [m for _, _, m in steps] == [m for _, _, m in steps if m.startswith("#0 text-to-image: step ")]
    assert [int(re.search(r"step (\d+) of 25", m).group(1)) for _, _, m in steps] == list(range(1, 26))
    assert [p for p, _, _ in steps] == [round(0.02 + 0.96 * k / 25, 4) for k in range(1, 26)]
    assert {t for _, t, _ in first} == {1.0}
    assert steps[-1][2] == "#0 text-to-image: step 25 of 25 · finishing"  # never "about 0 s left"
    assert len(second) == 27 and second[-1][0] == 1.0  # run_model's one task, and nothing from the quiet call
    assert answered_at[0] - heard_at[0] > 0.1  # the first note came while the tool ran, not with its answer



def test_watched_calls_share_one_kept_alive_connection_to_the_models_server(box, tmp_path):
    from hugginggpt import taskprogress
    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer

    url, _, _ = box
    client = LocalModelsServer(url, make_public(tmp_path / "public"))
    heard: list[dict] = []
    with taskprogress.listening(heard.append):
        for _ in range(3):
            out = client.infer(SD, TaskInputs("text-to-image", text="a red square"))
            assert "generated image" in out, out
    assert [e["step"] for e in heard if "step" in e] == list(range(1, 26)) * 3
    pool = client._http.connection_from_url(url)  # noqa: SLF001
    assert pool.num_connections == 1  # each stream read to its end and its connection given back


def test_a_client_that_leaves_while_queued_is_never_run_for(box):
    """B asks while A's run holds the model, hears `queued`, and leaves during that silence: when the model is
    free, B's run stops at its first step instead of running all of its steps for nobody."""
    url, _, proc = box

    def stopped() -> int:
        return proc.log_path.read_text().count("stopped: its client left")

    before = stopped()
    a = watch(url, SD, {"text": "first", "steps": 40})
    a_lines = a.iter_lines(decode_unicode=True)
    for line in a_lines:
        if line.startswith("data: ") and '"step":1,' in line:
            break  # A runs
    b = watch(url, SD, {"text": "second", "steps": 150})
    for line in b.iter_lines(decode_unicode=True):
        if line.startswith("data: ") and '"queued"' in line:
            break
    b.close()  # B leaves while queued: its stream is silent, only the server's polling sees it go
    assert any(line.startswith("event: result") for line in a_lines)  # A runs to its end
    wait_until(lambda: stopped() > before, timeout=30, what="B's run to stop at its first step")
    assert stopped() == before + 1


def test_a_call_of_another_model_waits_its_turn_on_the_cpu_and_says_so(box):
    """On the CPU the models take turns on the cores (modelhost/compute.py: one compute thread by default): a
    call of GPT-2 made while a diffusion run is going hears `queued` with what it waits for, then runs, and
    answers after the run it waited for."""
    import threading

    url, _, _ = box
    assert "generated text" in requests.post(f"{url}/models/{GPT2}", json={"text": "warm", "max_new_tokens": 1},
                                             timeout=120).json()  # loaded: its own load is no part of this
    a = watch(url, SD, {"text": "the long one", "steps": 60})
    a_lines = a.iter_lines(decode_unicode=True)
    for line in a_lines:
        if line.startswith("data: ") and '"step":1,' in line:
            break  # the diffusion run holds the compute thread
    else:
        raise AssertionError("the diffusion run never reached its first step")
    a_rest: list[str] = []
    reader = threading.Thread(target=lambda: a_rest.extend(a_lines))
    reader.start()
    b = sse(watch(url, GPT2, {"text": "hello", "max_new_tokens": 3}))
    reader.join(120)
    progress_events = [e for name, e in b if name == "progress"]
    assert progress_events[0] == {"phase": "queued", "waiting": "behind other models' calls"}
    assert progress_events[1] == {"phase": "running"}
    steps = [e["step"] for e in progress_events if "step" in e]
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) <= 3  # the tiny model may stop early
    assert b[-1][0] == "result" and "generated text" in b[-1][1]
    # B ran after A's whole run: A's every step and its answer (on the one compute thread, B's `running` above
    # comes only once A's call has returned; two client threads' clocks would order the scheduler, not the server)
    a_steps = [int(m) for line in a_rest for m in re.findall(r'"step":(\d+),', line)]
    assert a_steps[-1] == 60 and sum(line.startswith("event: result") for line in a_rest) == 1


def test_with_two_compute_threads_another_models_call_runs_beside_the_diffusion_run(box, tmp_path):
    """`compute_threads: 2` in the models server's config: the GPT-2 call is not queued behind the diffusion
    run, and answers while it still runs."""
    url, public, _ = box
    models_dir = public.parent / "models"
    proc, url2 = start_models_server(tmp_path, models_dir, public, deployment="full", extra=("compute_threads: 2",))
    try:
        requests.post(f"{url2}/models/{GPT2}", json={"text": "warm", "max_new_tokens": 1}, timeout=120)
        a = watch(url2, SD, {"text": "the long one", "steps": 150})
        a_lines = a.iter_lines(decode_unicode=True)
        for line in a_lines:
            if line.startswith("data: ") and '"step":1,' in line:
                break
        else:
            raise AssertionError("the diffusion run never reached its first step")
        b = sse(watch(url2, GPT2, {"text": "hello", "max_new_tokens": 3}))
        assert "queued" not in [e.get("phase") for _, e in b] and b[-1][0] == "result"
        step = max(int(m) for m in re.findall(r'"step":(\d+),', next(line for line in a_lines
                                                                      if line.startswith("data: "))))
        assert step < 150  # the diffusion run was still going when GPT-2 answered
        a.close()
        assert " on cpu, 2 compute threads\n" in proc.log_path.read_text()  # what the start line says
    finally:
        proc.terminate()
        proc.wait(10)
