"""The Gradio app (run_gradio_demo.py) in a subprocess, driven through gradio_client and a real browser.

The app runs against the scripted LLM and the fake models server: in this process's engine, with a config that
has no LLM (each visitor brings a key), and on a running orchestrator over SSE (`--server`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hugginggpt.gradio_ui.orchestrators import Run, sse_events
from hugginggpt.gradio_ui.progress import Progress, describe, files_of
from tests.conftest import ROOT, free_port, start_server, stop_server, write_config

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

ARTIFACTS = ROOT / "test-artifacts"
READY = re.compile(r"HuggingGPT Gradio app ready: (http://\S+?)/? ")
SLOW_MODEL = "stabilityai/stable-diffusion-xl-base-1.0"


@dataclass
class App:
    url: str
    proc: subprocess.Popen
    log: Path
    seconds: float  # from the command to the printed URL
    reader: threading.Thread | None = None
    output: list[str] | None = None  # what it printed after the URL

    def client(self) -> Client:
        return Client(self.url + "/", verbose=False, download_files=str(self.log.parent / "downloads"))

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def start_app(folder: Path, *args: str, tmpdir: Path | None = None) -> App:
    """run_gradio_demo.py on a free port, without an OpenAI key from the environment; `tmpdir`: its TMPDIR (and
    its children's), to see what it leaves there."""
    log = folder / f"app-{time.monotonic_ns()}.log"
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    proc = subprocess.Popen([sys.executable, str(ROOT / "run_gradio_demo.py"), "--port", str(free_port()),
                             "--verbose", *args], cwd=folder, stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env=env)
    line = proc.stdout.readline()  # printed only once the app answers
    match = READY.match(line)
    if not match:
        proc.kill()
        raise RuntimeError(f"the app did not start: {line!r}\n{log.read_text()}")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout), daemon=True)  # keep the pipe drained
    reader.start()
    return App(match.group(1), proc, log, time.perf_counter() - started, reader, output)


def stop_app(app: App) -> str:
    app.proc.send_signal(signal.SIGTERM)
    try:
        app.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        app.proc.kill()
        raise
    app.reader.join(5)
    return "".join(app.output)


@pytest.fixture(scope="module")
def app(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("gradio")
    config = write_config(folder, llm_server.base_url, models_server[1], public_dir, semantic_ranking=False)
    running = start_app(folder, "--config", str(config))
    print(f"\nin-process app started in {running.seconds:.1f} s")
    yield running
    stop_app(running)


@pytest.fixture(scope="module")
def keyless_app(tmp_path_factory, llm_server, models_server, public_dir):
    """A config with no LLM: each visitor enters their own (here: the scripted LLM, with their own key)."""
    folder = tmp_path_factory.mktemp("gradio-keyless")
    path = write_config(folder, llm_server.base_url, models_server[1], public_dir, semantic_ranking=False,
                        url_allowlist=["127.0.0.1"])
    data = yaml.safe_load(path.read_text())
    del data["local"], data["dev"]
    path.write_text(yaml.safe_dump(data))
    running = start_app(folder, "--config", str(path), "--visitor-keys")
    yield running
    stop_app(running)


def plan_on_upload(body: dict) -> str:
    """Plan three tasks on the image the request names (the app names each upload in the request text)."""
    prompt = body["messages"][-1]["content"]
    found = re.search(r"/uploads/[\w.-]+", prompt)
    image = found.group(0) if found else "/examples/red.png"
    return json.dumps([
        {"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": image}},
        {"task": "object-detection", "id": 1, "dep": [-1], "args": {"image": image}},
        {"task": "text-to-image", "id": 2, "dep": [-1], "args": {"text": "a fox"}},
    ])


SLOW_CHAIN = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a slow fox"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
])


def texts(chat: list[dict]) -> list[str]:
    return [part["text"] for m in chat for part in m["content"] if part.get("type") == "text"]


def files(chat: list[dict]) -> list[dict]:
    return [part for m in chat for part in m["content"] if part.get("type") == "file"]


def test_a_request_with_an_uploaded_image_gets_its_answer_outputs_and_files(app, llm, models, public_dir, tmp_path):
    from PIL import Image

    llm.on("parse_task", plan_on_upload, contains="look at my picture")
    picture = tmp_path / "mine.png"
    Image.new("RGB", (50, 30), (9, 120, 200)).save(picture)
    client = app.client()
    chat, plan, box = client.predict({"text": "look at my picture", "files": [handle_file(str(picture))]},
                                     api_name="/chat")

    # the file was checked and stored as the server's uploads are, and the request named it
    prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    upload = re.search(r"/uploads/[\w.-]+\.png", prompt).group(0)
    assert (public_dir / upload.lstrip("/")).read_bytes() == picture.read_bytes()
    # the plan table, filled in from the events
    assert plan["headers"] == ["task", "id", "deps", "model", "status", "seconds"]
    assert [(r[0], r[1], r[4]) for r in plan["data"]] == [
        ("image-classification", 0, "done"), ("object-detection", 1, "done"), ("text-to-image", 2, "done")]
    assert plan["data"][1][3] == "facebook/detr-resnet-50" and float(plan["data"][1][5]) >= 0
    # outputs readable: labels and boxes as tables, never raw JSON; the answer last
    titles = [(m.get("metadata") or {}).get("title") for m in chat]
    assert "#1 object-detection · facebook/detr-resnet-50" in titles
    shown = texts(chat)
    assert "| tabby cat | 0.90 |" in "\n".join(shown) and "(2, 2) to (25, 15)" in "\n".join(shown)
    assert not any("{" in t for t in shown[:-1])  # no JSON, no Python dicts
    assert shown[-1].startswith("ANSWER based on:")
    # every generated file is shown inline: the uploaded picture, the drawing and the boxes
    shown_files = files(chat)
    assert shown_files[0]["alt_text"] == upload
    made = sorted(f["alt_text"].split()[0] for f in shown_files[1:])
    assert len(made) == 2 and all(p.startswith("/images/") for p in made)
    for f in shown_files[1:]:
        assert Path(f["file"]).read_bytes() == (public_dir / f["alt_text"].split()[0].lstrip("/")).read_bytes()
    assert box == {"text": "", "files": []}
    # the next turn's history names the files made, so "that picture" can be resolved
    client.predict({"text": "make that picture bigger", "files": []}, api_name="/chat")
    follow_up = json.dumps(llm.stage_requests("parse_task")[-1]["body"])
    assert "make that picture bigger" in follow_up and all(p in follow_up for p in made)


def test_a_file_that_is_not_media_is_refused_in_one_line(app, llm, tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture at all")
    chat, *_ = app.client().predict({"text": "what is this", "files": [handle_file(str(fake))]}, api_name="/chat")
    assert texts(chat) == ["⚠️ Upload refused: the uploaded image is not a readable image"]  # decoded, as /upload does
    assert llm.requests == []
    chat, *_ = app.client().predict({"text": "  ", "files": []}, api_name="/chat")
    assert texts(chat) == ["⚠️ Type a request (and attach images or audio if it needs them)."]
    assert llm.requests == []
    assert "Traceback" not in app.logs()


def test_an_audio_upload_is_stored_and_named_in_the_request(app, llm, public_dir):
    sound = public_dir / "examples" / "hello.wav"
    app.client().predict({"text": "what do you hear", "files": [handle_file(str(sound))]}, api_name="/chat")
    prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    stored = re.search(r"\(attached audio: (/uploads/[\w.-]+\.wav)\)", prompt).group(1)
    assert (public_dir / stored.lstrip("/")).read_bytes() == sound.read_bytes()


def test_cancel_stops_the_request_for_real(app, llm, models):
    models.delays[SLOW_MODEL] = 3.0
    llm.on("parse_task", SLOW_CHAIN, contains="slow fox")
    client = app.client()
    job = client.submit({"text": "draw a slow fox and caption it", "files": []}, api_name="/chat")
    deadline = time.monotonic() + 20
    while not any(row[4] == "running" for out in job.outputs() for row in out[1]["data"]):
        assert time.monotonic() < deadline and not job.done(), "task #0 never started"
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    assert client.predict(api_name="/cancel") == "Cancelling…"
    chat, plan, _ = job.result(timeout=10)
    assert time.monotonic() - cancelled_at < 2.5  # the chat is free at once, not when the model finishes
    assert texts(chat)[-1] == "Cancelled." and [r[4] for r in plan["data"]] == ["running", "planned"]
    time.sleep(3.5)  # the slow model has finished by now: its dependent must not start, nor the answer
    assert [c["model"] for c in models.calls] == [SLOW_MODEL]
    assert llm.stage_requests("response_results") == []


def test_two_visitors_never_see_each_others_conversation_or_key(keyless_app, llm):
    llm.on("parse_task", "[]", delay=1.0)
    stranger = keyless_app.client()
    chat, *_ = stranger.predict({"text": "hello", "files": []}, api_name="/chat")
    assert "no LLM of its own" in texts(chat)[-1] and llm.requests == []

    keys = {"alpha": "sk-alpha-" + "a" * 24, "bravo": "sk-bravo-" + "b" * 24}
    clients = {name: keyless_app.client() for name in keys}
    for name, client in clients.items():
        key_box, status = client.predict("local", keys[name], llm.base_url + "/v1", api_name="/save_settings")
        assert key_box == "" and keys[name] not in status and "Saved for this browser session" in status
    jobs = {name: c.submit({"text": f"tell me about {name}", "files": []}, api_name="/chat")
            for name, c in clients.items()}
    time.sleep(0.3)
    assert stranger.predict(api_name="/cancel") == ""  # another visitor's Cancel stops nothing of theirs
    results = {name: job.result(timeout=30) for name, job in jobs.items()}
    assert all(texts(r[0])[-1] == f"CHITCHAT: tell me about {name}" for name, r in results.items())
    firsts = {name: next(r for r in llm.stage_requests("parse_task")
                         if f"about {name}" in r["body"]["messages"][-1]["content"]) for name in keys}
    assert abs(firsts["alpha"]["time"] - firsts["bravo"]["time"]) < 1.0  # both ran at once
    # a second turn each: the history sent to the LLM is the visitor's own
    for name, client in clients.items():
        results[name] = client.predict({"text": f"and more on {name}", "files": []}, api_name="/chat")
    for name, other in (("alpha", "bravo"), ("bravo", "alpha")):
        chat = results[name][0]
        assert [t for t in texts(chat) if t.startswith("CHITCHAT")] == [f"CHITCHAT: tell me about {name}",
                                                                        f"CHITCHAT: and more on {name}"]
        assert not any(other in t for t in texts(chat))
        second = next(r for r in llm.stage_requests("parse_task")
                      if f"and more on {name}" in r["body"]["messages"][-1]["content"])
        assert f"tell me about {name}" in json.dumps(second["body"])  # its own history, and only its own
        own = [r for r in llm.requests if name in json.dumps(r["body"])]
        assert own and {r["headers"].get("Authorization") for r in own} == {f"Bearer {keys[name]}"}
        assert not any(other in json.dumps(r["body"]) for r in own)
        assert keys[name] not in json.dumps(results[name]) and keys[other] not in json.dumps(results[name])
    logs = keyless_app.logs()
    assert "tell me about alpha" in logs  # the log is on, and still holds no key
    assert not any(key in logs for key in keys.values())


@pytest.fixture(scope="module")
def remote_app(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("gradio-remote")
    config = write_config(folder, llm_server.base_url, models_server[1], public_dir, semantic_ranking=False,
                          api_tokens=["remote-token-7"])
    server = start_server(config, folder)
    running = start_app(folder, "--server", server.url, "--token", "remote-token-7")
    yield running, server
    stop_app(running)
    stop_server(server)


def test_on_a_running_orchestrator_the_app_streams_and_cancels_over_sse(remote_app, llm, models, public_dir):
    app, server = remote_app
    llm.on("parse_task", plan_on_upload, contains="remote picture")
    client = app.client()
    chat, plan, _ = client.predict({"text": "remote picture", "files": [handle_file(
        str(public_dir / "examples" / "green.jpg"))]}, api_name="/chat")
    assert [r[4] for r in plan["data"]] == ["done", "done", "done"]
    assert texts(chat)[-1].startswith("ANSWER based on:")
    made = [f for f in files(chat) if f["alt_text"].startswith("/images/")]
    assert len(made) == 2
    for f in made:  # fetched from the orchestrator (with the token), shown from this app
        assert Path(f["file"]).read_bytes() == (public_dir / f["alt_text"].split()[0].lstrip("/")).read_bytes()

    llm.reset()
    models.calls.clear()
    models.delays[SLOW_MODEL] = 3.0
    llm.on("parse_task", SLOW_CHAIN, contains="slow fox")
    job = client.submit({"text": "remote slow fox", "files": []}, api_name="/chat")
    deadline = time.monotonic() + 20
    while not any(row[4] == "running" for out in job.outputs() for row in out[1]["data"]):
        assert time.monotonic() < deadline and not job.done(), "task #0 never started"
        time.sleep(0.05)
    assert client.predict(api_name="/cancel") == "Cancelling…"
    assert texts(job.result(timeout=10)[0])[-1] == "Cancelled."
    deadline = time.monotonic() + 10
    while "client went away; cancelling" not in server.logs():  # the closed stream cancelled the request
        assert time.monotonic() < deadline, server.logs()[-2000:]
        time.sleep(0.1)
    time.sleep(3.5)
    assert [c["model"] for c in models.calls] == [SLOW_MODEL]
    assert llm.stage_requests("response_results") == []


def test_with_no_llm_configured_it_opens_on_the_offline_demo_stack(tmp_path):
    """`python run_gradio_demo.py` on a fresh clone: no key anywhere, so the scripted LLM and tiny models serve it."""
    temp = tmp_path / "tmp"  # its own: other programs' folders in /tmp are no concern of this test's
    temp.mkdir()
    app = start_app(tmp_path, "--config", str(ROOT / "configs" / "config.gradio.yaml"), tmpdir=temp)
    print(f"\noffline demo app started in {app.seconds:.1f} s")
    try:
        ask = 'Draw a red fox, show its edges, classify it and read "a red fox" aloud'  # the demo planner's words
        chat, plan, _ = app.client().predict({"text": ask, "files": []}, api_name="/chat")
        assert [r[0] for r in plan["data"]] == ["text-to-image", "image-classification", "canny-control",
                                                "text-to-speech"]
        assert all(r[4] == "done" for r in plan["data"]), (plan["data"], texts(chat))  # which task, and why
        assert "offline demo" in texts(chat)[-1]
        kinds = sorted(Path(f["file"]).suffix for f in files(chat))
        assert kinds == [".png", ".png", ".wav"]
        assert sorted(p.name.split("-")[1] for p in temp.glob("hugginggpt-*")) == ["demo", "gradio"]  # while it runs
    finally:
        out = stop_app(app)
    assert app.proc.returncode == 0 and "app stopped" in out
    assert sorted(p.name for p in temp.glob("hugginggpt-*")) == []  # the demo stack and the app's downloads: gone


def test_it_will_not_start_on_an_orchestrator_it_cannot_reach(tmp_path):
    port = free_port()
    done = subprocess.run([sys.executable, str(ROOT / "run_gradio_demo.py"), "--server", f"http://127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"error: cannot reach the orchestrator at http://127.0.0.1:{port} "
                                                "(ConnectionError)"]


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        spec = line.split("#")[0].strip()
        if "==" in spec:
            name, version = spec.split("==")
            found[name.lower().replace("_", "-")] = version.strip()
    return found


def test_the_space_folder_matches_the_project():
    front = yaml.safe_load((ROOT / "spaces" / "README.md").read_text().split("---")[1])
    project = pins(ROOT / "requirements.txt")
    assert front["sdk"] == "gradio" and front["sdk_version"] == project["gradio"]
    assert (ROOT / "spaces" / front["app_file"]).is_file()
    space = pins(ROOT / "spaces" / "requirements.txt")
    assert space and {name: project.get(name) for name in space} == space  # the same pins, none drifted
    import importlib.util

    spec = importlib.util.spec_from_file_location("hugginggpt_space_app", ROOT / "spaces" / "app.py")
    space_app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(space_app)
    cpu = space_app.app_args(False, {"GRADIO_SERVER_PORT": "7861"})
    assert cpu[:2] == ["--config", str(ROOT / "configs" / "config.lite.yaml")] and "--visitor-keys" in cpu
    assert cpu[-4:] == ["--host", "0.0.0.0", "--port", "7861"]
    assert space_app.app_args(True, {})[1] == str(ROOT / "configs" / "config.gradio.yaml")


def test_the_space_starts_lite_and_asks_each_visitor_for_a_key(tmp_path):
    """spaces/app.py on this CPU box: hosted inference only, no models server, no LLM of its own."""
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "spaces" / "app.py")], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**{k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"},
                                 "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("HuggingGPT Gradio app ready"):
                break
        assert lines[0] == "HuggingGPT Space on CPU: hosted inference", lines
        assert lines[-1].startswith(f"HuggingGPT Gradio app ready: http://127.0.0.1:{port}/"), lines
        print(f"\nthe Space (lite) started in {time.perf_counter() - started:.1f} s")
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        chat, *_ = client.predict({"text": "hello", "files": []}, api_name="/chat")
        assert "no LLM of its own" in texts(chat)[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


# -- the pieces, with plain data ------------------------------------------------------------------------------------

def test_sse_events_are_parsed_as_the_server_writes_them():
    lines = [": request abc", "", "event: plan", 'data: {"event": "plan", "tasks": []}', "", ": keep-alive", "",
             "event: answer", 'data: {"message": "hi"}', "", "event: done", "data: {}", ""]
    assert list(sse_events(iter(lines))) == [{"event": "plan", "tasks": []}, {"event": "answer", "message": "hi"}]


def test_progress_table_and_outputs_read_as_text():
    progress = Progress()
    progress.update({"event": "plan", "tasks": [{"task": "object-detection", "id": 0, "dep": [-1]},
                                                {"task": "image-to-text", "id": 1, "dep": [0]}]})
    progress.update({"event": "model_selected", "id": 0, "model": "facebook/detr-resnet-50"})
    progress.update({"event": "task_started", "id": 0})
    assert progress.table() == [["object-detection", 0, "-", "facebook/detr-resnet-50", "running", ""],
                                ["image-to-text", 1, "0", "", "planned", ""]]
    progress.update({"event": "task_finished", "id": 0, "seconds": 1.0, "model_seconds": 0.5})
    progress.update({"event": "task_failed", "id": 1, "skipped": True, "error": "dependency failed"})
    assert [r[4:] for r in progress.table()] == [["done", "0.50"], ["skipped", ""]]
    result = {"generated image": "/images/ab.png", "predicted": [
        {"label": "dog", "score": 0.2, "box": {"xmin": 1, "ymin": 2, "xmax": 3, "ymax": 4}},
        {"label": "cat", "score": 0.7, "box": {"xmin": 5, "ymin": 6, "xmax": 7, "ymax": 8}}]}
    assert describe(result) == ("| label | box | score |\n|---|---|---|\n| cat | (5, 6) to (7, 8) | 0.70 |\n"
                                "| dog | (1, 2) to (3, 4) | 0.20 |")
    assert files_of(result) == ["/images/ab.png"] and files_of({"image": "/examples/a.jpg"}) == []
    assert describe({"generated text": "a cat on a mat"}) == "a cat on a mat"
    assert describe({"predicted": [{"entity_group": "PER", "word": "Anna", "score": 0.99}]}) == \
        "| entity_group | word | score |\n|---|---|---|\n| PER | Anna | 0.99 |"


def test_a_cancelled_run_ends_at_once_and_stops_its_work():
    stopped = threading.Event()
    run = Run()
    run._stop = stopped.set
    run.put({"event": "plan", "tasks": []})
    run.cancel()
    run.put({"event": "answer", "message": "too late"})  # the worker's late events are dropped
    assert [e["event"] for e in run] == ["plan", "cancelled"] and stopped.is_set()


# -- a real browser --------------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None


@pytest.mark.skipif(sync_playwright is None or not os.path.exists(CHROMIUM),
                    reason=f"browser test needs playwright and Chromium at {CHROMIUM}")
def test_in_a_browser_an_example_runs_and_its_images_appear(app, llm, models):
    llm.on("parse_task", plan_on_upload)
    llm.on("response_results", "The picture shows a **tabby cat** (0.90). I drew boxes around what I found and made "
                               "a new picture of a fox; both are above.")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(app.url + "/")
            page.locator("#examples button, #examples .example, #examples td").first.click()
            page.wait_for_function("document.querySelector('#input textarea').value.length > 0", timeout=10000)
            page.wait_for_selector("#input img, #input .thumbnail-item", timeout=10000)
            page.locator("#input textarea").press("Enter")
            page.wait_for_function("[...document.querySelectorAll('#chat .message')].some("
                                   "m => m.innerText.includes('tabby cat (0.90)'))", timeout=30000)
            # the answer's text shows before its images have loaded: give them time (a broken one never loads,
            # and the assertion below says which)
            try:
                page.wait_for_function("(() => { const is = [...document.querySelectorAll('#chat img')];"
                                       " return is.length >= 3 && is.every(i => i.complete && i.naturalWidth > 0);"
                                       " })()", timeout=15000)
            except PlaywrightTimeout:
                pass
            images = page.locator("#chat img").evaluate_all(
                "is => is.map(i => [i.closest('.message-row')?.className || '', i.naturalWidth])")
            by_row = {who: sorted(w for row, w in images if f"{who}-row" in row) for who in ("user", "bot")}
            # the example photo sent, then the drawing (64 px, the fake model's) and the boxes drawn on the photo
            assert by_row == {"user": [451], "bot": [64, 451]}, images
            assert page.locator("#plan").inner_text().count("done") == 3
            page.screenshot(path=str(ARTIFACTS / "gradio-1280.png"), full_page=True)
            page.set_viewport_size({"width": 360, "height": 800})
            page.wait_for_timeout(500)
            assert page.evaluate("document.documentElement.scrollWidth") <= 360
            page.screenshot(path=str(ARTIFACTS / "gradio-360.png"), full_page=True)
        finally:
            browser.close()
