"""The Gradio app keeps what is a visitor's to that visitor (issue 29.5) and runs on the engine's admission.

- The LLM settings (the key above all) live in the session on the server: nothing the browser keeps holds them.
- A file in Gradio's folders (an upload, a run's output) is served to the browser it belongs to only, and
  only that browser may send it as input; a request's text may name only the session's own public files.
- An in-process run holds one of the engine's `max_concurrent_requests` slots until its work has ended;
  past the limit a visitor is refused at once in one line.

One app (in-process, max_concurrent_requests 1) in a subprocess; visitors through gradio_client, plain HTTP
and a real browser.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from PIL import Image

from hugginggpt.admission import Busy, local_slots
from hugginggpt.gradio_ui.orchestrators import InProcess, UserError, VisitorLLM
from tests.conftest import write_config
from tests.test_gradio_app import CHROMIUM, SLOW_MODEL, plan_on_upload, start_app, stop_app, sync_playwright, texts

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

BUSY = "⚠️ the server is running 1 requests (max_concurrent_requests); retry shortly"


@pytest.fixture(scope="module")
def one_slot_app(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("gradio-sessions")
    config = write_config(folder, llm_server.base_url, models_server[1], public_dir, semantic_ranking=False,
                          url_allowlist=["127.0.0.1"], max_concurrent_requests=1)
    running = start_app(folder, "--config", str(config))
    yield running
    stop_app(running)


def raw_client(app) -> Client:
    """A visitor whose outputs stay on the server (their paths and URLs, as a browser gets them)."""
    return Client(app.url + "/", verbose=False, download_files=False)


def browser_of(client: Client) -> requests.Session:
    """Plain HTTP with that visitor's cookies (what their browser sends when it loads a file)."""
    session = requests.Session()
    session.cookies.update(client.cookies)
    return session


def stranger(app) -> requests.Session:
    """Another browser: it has loaded the app (so it has a visitor cookie of its own)."""
    session = requests.Session()
    assert session.get(app.url + "/config", timeout=10).status_code == 200
    return session


def file_parts(chat: list[dict]) -> list[dict]:
    return [part for m in chat for part in m["content"] if part.get("type") == "file"]


def call_chat(session: requests.Session, app, message: dict) -> list[dict]:
    """The chat event over Gradio's plain HTTP API (`/gradio_api/call/chat`), as any script may send it."""
    posted = session.post(app.url + "/gradio_api/call/chat", json={"data": [message]}, timeout=10)
    assert posted.status_code == 200, posted.text
    stream = session.get(f"{app.url}/gradio_api/call/chat/{posted.json()['event_id']}", timeout=30).text
    event, data = re.findall(r"^event: (\w+)\ndata: (.*)$", stream, re.MULTILINE)[-1]
    assert event == "complete", stream
    return json.loads(data)[0]


def private_picture(folder: Path) -> Path:
    picture = folder / "private.png"
    Image.new("RGB", (48, 32), (201, 17, 99)).save(picture)
    return picture


def test_a_visitors_upload_and_outputs_are_served_to_that_visitor_only(one_slot_app, llm, models, public_dir,
                                                                        tmp_path):
    app = one_slot_app
    llm.on("parse_task", plan_on_upload, contains="my private picture")
    picture = private_picture(tmp_path)
    owner = raw_client(app)
    chat, plan, _ = owner.predict({"text": "my private picture", "files": [handle_file(str(picture))]},
                                  api_name="/chat")
    assert [r[4] for r in plan["data"]] == ["done", "done", "done"]
    shown = file_parts(chat)
    upload = next(p for p in shown if p["alt_text"].startswith("/uploads/"))
    made = [p for p in shown if p["alt_text"].startswith("/images/")]
    assert len(made) == 2
    urls = [app.url + p["file"]["url"][p["file"]["url"].index("/gradio_api/"):] for p in [upload, *made]]

    mine = browser_of(owner)
    got = mine.get(urls[0], timeout=10)
    assert got.status_code == 200 and got.content == picture.read_bytes()  # the owner's browser sees all three
    for url, part in zip(urls[1:], made, strict=True):
        assert mine.get(url, timeout=10).content == (public_dir / part["alt_text"].split()[0].lstrip("/")).read_bytes()

    other = stranger(app)
    for url in urls:  # another browser that knows the URL (the content hash and the name) gets nothing
        assert other.get(url, timeout=10).status_code == 404
        assert requests.get(url, timeout=10).status_code == 404  # nor a client without any cookie
    stored = public_dir / upload["alt_text"].lstrip("/")
    assert stored.read_bytes() == picture.read_bytes()
    direct = other.get(f"{app.url}/gradio_api/file={stored}", timeout=10)  # public/ itself is not served
    assert direct.status_code in (403, 404) and direct.content != picture.read_bytes()

    # what the app shows everyone still loads for anyone: the examples
    config = other.get(app.url + "/config", timeout=10).json()
    example = re.search(r'"path": ?"([^"]+/chelsea\.jpg)"', json.dumps(config)).group(1)
    assert other.get(f"{app.url}/gradio_api/file={example}", timeout=10).status_code == 200
    # nothing left that hands a session's values, or an outside URL, to whoever asks
    assert other.get(app.url + "/gradio_api/deep_link", params={"session_hash": "x"}, timeout=10).status_code == 404
    assert other.get(app.url + "/gradio_api/file=http://127.0.0.1:1/a.png", timeout=10).status_code == 404


def test_a_visitor_may_not_send_another_visitors_file_as_input(one_slot_app, llm, models, public_dir, tmp_path):
    app = one_slot_app
    llm.on("parse_task", plan_on_upload, contains="my private picture")
    owner = raw_client(app)
    chat, *_ = owner.predict({"text": "my private picture", "files": [handle_file(str(private_picture(tmp_path)))]},
                             api_name="/chat")
    upload = next(p for p in file_parts(chat) if p["alt_text"].startswith("/uploads/"))
    gradio_path, public_path = upload["file"]["path"], upload["alt_text"]
    asked = len(llm.requests)

    other = stranger(app)
    sent = call_chat(other, app, {"text": "what is in this picture",
                                  "files": [{"path": gradio_path, "meta": {"_type": "gradio.FileData"}}]})
    assert texts(sent) == ["⚠️ Upload refused: private.png was not uploaded from this browser; attach the file again."]
    named = call_chat(other, app, {"text": f"describe {public_path} please", "files": []})
    assert texts(named) == [f"⚠️ {public_path} is not a file of this session: attach it again (a session may use "
                            "only the files it uploaded or its requests made)."]
    spelled = call_chat(other, app, {"text": "describe public" + public_path.replace("/", "%2F"), "files": []})
    assert texts(spelled)[0].startswith(f"⚠️ {public_path} is not a file of this session")
    assert len(llm.requests) == asked  # nothing of it reached the LLM, so no model ever read the file

    # the owner's own session may name its file again ("make it brighter")
    chat, *_ = owner.predict({"text": f"make {public_path} brighter", "files": []}, api_name="/chat")
    assert not any(t.startswith("⚠️") for t in texts(chat))
    assert public_path in llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]


def test_the_app_keeps_no_run_history_in_the_browser(one_slot_app):
    config = requests.get(one_slot_app.url + "/config", timeout=10).json()
    assert config["run_history"] is False  # Gradio's run history records every event's inputs in localStorage
    assert requests.get(one_slot_app.url + "/gradio_api/runs", timeout=10).status_code == 404


def test_past_max_concurrent_requests_a_run_is_refused_at_once(one_slot_app, llm, models):
    app = one_slot_app
    gate = models.gates[SLOW_MODEL] = threading.Event()
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a held fox"}}]),
           contains="held fox")
    holder, other = app.client(), app.client()
    try:
        job = holder.submit({"text": "draw a held fox", "files": []}, api_name="/chat")
        deadline = time.monotonic() + 20
        while not any(row[4] == "running" for out in job.outputs() for row in out[1]["data"]):
            # the run holds the one slot, its model waiting at the gate
            assert time.monotonic() < deadline and not job.done(), "the held run never reached its model"
            time.sleep(0.05)
        asked = time.monotonic()
        chat, plan, box = other.submit({"text": "hello while busy", "files": []}, api_name="/chat").result(timeout=10)
        assert time.monotonic() - asked < 5  # at once, not after the held run
        assert texts(chat) == ["hello while busy", BUSY]
        assert box == {"text": "hello while busy", "files": []}  # kept, to send again
        assert not any("hello while busy" in json.dumps(r["body"]) for r in llm.requests)
    finally:
        gate.set()
    assert texts(job.result(timeout=30)[0])[-1].startswith("ANSWER based on:")
    chat, *_ = other.predict({"text": "hello while busy", "files": []}, api_name="/chat")  # the slot came back
    assert texts(chat)[-1] == "CHITCHAT: hello while busy"
    assert "Traceback" not in app.logs()


# -- InProcess on an engine of plain Python: when the slot is taken and given back -------------------------------------

class HeldEngine:
    """An engine whose run ends only when the test says so (a cancelled run takes time to wind down too)."""

    def __init__(self) -> None:
        self.admission = local_slots(1)
        self.finish = threading.Event()
        self.fail = False
        self.bad_settings = False

    def llm_for(self, request):
        if self.bad_settings:
            from hugginggpt.errors import BadRequest

            raise BadRequest("api_endpoint must be an http(s) URL")

    def run(self, request, mode, on_event, state_ready):
        state_ready(SimpleNamespace(cancel=lambda: None))
        on_event("plan", {"event": "plan", "tasks": []})
        self.finish.wait(10)
        if self.fail:
            raise RuntimeError("the engine broke")
        return {"message": "done"}


def slot_free(engine: HeldEngine) -> bool:
    if engine.admission.acquire(blocking=False):
        engine.admission.release()
        return True
    return False


def wait_free(engine: HeldEngine) -> None:
    deadline = time.monotonic() + 5
    while not slot_free(engine):
        assert time.monotonic() < deadline, "the slot never came back"
        time.sleep(0.01)


def in_process(tmp_path) -> tuple[InProcess, HeldEngine]:
    engine = HeldEngine()
    config = SimpleNamespace(public_dir=tmp_path, upload_quota_bytes=1 << 20, max_image_pixels=1 << 20,
                             max_body_bytes=1 << 20, max_concurrent_requests=1,
                             llm=SimpleNamespace(api_type="openai", api_key="k"))
    return InProcess(engine, config), engine


def test_an_in_process_run_holds_its_slot_until_its_work_has_ended(tmp_path):
    orchestrator, engine = in_process(tmp_path)
    hello = [{"role": "user", "content": "hello"}]
    run = orchestrator.start(hello, VisitorLLM())
    assert not slot_free(engine)
    with pytest.raises(Busy, match=r"^the server is running 1 requests \(max_concurrent_requests\); retry shortly$"):
        orchestrator.start(hello, VisitorLLM())
    run.cancel()
    assert [e["event"] for e in run][-1] == "cancelled"  # the visitor is free at once...
    time.sleep(0.2)
    assert not slot_free(engine)  # ...the slot is not, while the work still winds down
    engine.finish.set()
    wait_free(engine)

    engine.finish.clear()
    engine.fail = True
    run = orchestrator.start(hello, VisitorLLM())
    engine.finish.set()
    assert [e["event"] for e in run] == ["plan", "error"]  # a run that fails gives its slot back too
    wait_free(engine)

    engine.bad_settings = True  # refused before it takes a slot
    with pytest.raises(UserError, match="api_endpoint must be an http"):
        orchestrator.start(hello, VisitorLLM(api_endpoint="ftp://x"))
    assert slot_free(engine)


# -- a real browser ----------------------------------------------------------------------------------------------------

@pytest.mark.skipif(sync_playwright is None or not Path(CHROMIUM).exists(),
                    reason=f"browser test needs playwright and Chromium at {CHROMIUM}")
def test_in_a_browser_the_visitors_key_stays_out_of_everything_the_browser_keeps(one_slot_app, llm):
    key = "sk-visitor-secret-" + "q7" * 12
    llm.on("parse_task", "[]", contains="hello from a browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(one_slot_app.url + "/")
            page.locator("#settings .label-wrap").first.click()
            page.locator("#api_type input").click()
            page.locator("[data-testid=dropdown-option][aria-label=local]").click()
            page.wait_for_function("document.querySelector('#api_type input').value === 'local'", timeout=5000)
            page.locator("#api_key input").fill(key)
            page.locator("#api_endpoint input, #api_endpoint textarea").first.fill(llm.base_url + "/v1")
            page.locator("#save").click()
            page.wait_for_function("document.querySelector('#settings-status').innerText.includes('Saved')",
                                   timeout=15000)
            assert "local" in page.locator("#settings-status").inner_text()
            assert page.locator("#api_key input").input_value() == ""  # emptied on Save
            page.locator("#input textarea").fill("hello from a browser")
            page.locator("#input textarea").press("Enter")
            page.wait_for_function("[...document.querySelectorAll('#chat .message')].some("
                                   "m => m.innerText.includes('CHITCHAT: hello from a browser'))", timeout=30000)
            # the run used the visitor's key...
            used = [r for r in llm.requests if "hello from a browser" in json.dumps(r["body"])]
            assert used and {r["headers"].get("Authorization") for r in used} == {f"Bearer {key}"}
            # ...and nothing the browser keeps holds it: storage, cookies readable by scripts, the address
            kept = page.evaluate("""async () => JSON.stringify({
                local: Object.entries(localStorage), session: Object.entries(sessionStorage),
                cookie: document.cookie, url: location.href,
                idb: indexedDB.databases ? (await indexedDB.databases()).map(d => d.name) : []})""")
            assert key not in kept and "q7q7q7" not in kept, kept
            assert all(c["value"] != key for c in page.context.cookies())
            page.reload()
            page.locator("#settings .label-wrap").first.click()
            assert page.locator("#api_key input").input_value() == ""
            assert key not in page.evaluate("JSON.stringify([Object.entries(localStorage), "
                                            "Object.entries(sessionStorage)])")
        finally:
            browser.close()


# -- the pieces, with plain data ---------------------------------------------------------------------------------------

def test_the_files_a_request_text_names_are_found_however_they_are_spelled():
    from hugginggpt.gradio_ui.app import named_files

    name = "3ff5a1813d8c4517ba60196964538108.png"
    assert named_files(f"describe /uploads/{name} and public\\images\\{name.upper()}, then "
                       f"uploads%2F{name} again") == [f"/uploads/{name}", f"/images/{name}"]
    assert named_files("draw https://example.com/images/cat.png and /examples/a.jpg") == []  # not ours to police


def test_visitor_files_are_each_visitors_own_and_the_public_ones_everyones(tmp_path):
    from hugginggpt.gradio_ui.sessions import VisitorFiles

    files = VisitorFiles([tmp_path / "gradio"])
    upload, example = tmp_path / "gradio" / "ab" / "mine.png", tmp_path / "gradio" / "cd" / "cat.jpg"
    files.own("alice", upload)
    files.public_from_config({"components": [{"props": {"samples": [[{"path": str(example)}]]}}]})
    assert files.allowed("alice", upload) and not files.allowed("bob", upload) and not files.allowed(None, upload)
    assert files.allowed("bob", example) and files.may_read(None, str(example))
    assert files.may_read("bob", str(tmp_path / "elsewhere.png"))  # outside Gradio's folders: Gradio's own rules
    assert not files.may_read("bob", str(tmp_path / "gradio" / "ab" / ".." / "ab" / "mine.png"))
    assert not files.may_read("alice", "https://example.com/a.png")
