"""The web page in headless Chromium: plan graph, live states, rendered results, answer, multi-turn."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    sync_playwright is None or not os.path.exists(CHROMIUM),
    reason=f"browser test needs playwright and Chromium at {CHROMIUM} (Debian packages chromium)")

DAG = json.dumps([
    {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a red fox in the snow"}},
    {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
])


@pytest.fixture
def page():
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        pg = browser.new_page(viewport={"width": 1280, "height": 800})
        yield pg
        browser.close()


def test_page_shows_plan_states_results_and_answer(server, llm, models, page):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 1.5
    llm.on("parse_task", DAG, contains="draw a fox", times=1)
    page.goto(server.url + "/")
    page.fill("#input", "draw a fox, caption it, and find names in 'Anna lives in Berlin'")
    page.keyboard.press("Enter")
    page.wait_for_selector('#graph .node[data-id="0"][data-state="running"]', timeout=15000)
    page.screenshot(path=str(ARTIFACTS / "web-mid-run.png"))
    page.wait_for_selector("#chat .assistant[data-done='1']", timeout=30000)
    states = page.eval_on_selector_all("#graph .node", "ns => ns.map(n => n.dataset.state)")
    assert states == ["done", "done", "done"]
    assert page.locator("#graph .edge").count() == 1  # 0 -> 1
    img = page.locator('.task[data-id="0"] img')
    src = img.get_attribute("src")
    assert src.startswith("/images/")
    try:  # the image is in the page before it has loaded
        page.wait_for_function("s => { const i = document.querySelector(`img[src='${s}']`);"
                               " return i && i.complete && i.naturalWidth > 0; }", arg=src, timeout=10000)
    except PlaywrightTimeout:
        pass  # a broken image never loads: the assertion says so
    assert page.evaluate("s => document.querySelector(`img[src='${s}']`).naturalWidth", src) == 64
    assert requests.get(server.url + src, timeout=5).headers["Content-Type"] == "image/png"
    assert "stabilityai/stable-diffusion-xl-base-1.0" in page.inner_text('.task[data-id="0"]')
    assert "a picture of 64x48 pixels" in page.inner_text('.task[data-id="1"]')
    answer = page.inner_text("#chat .assistant")
    assert answer.startswith("ANSWER based on:")
    page.screenshot(path=str(ARTIFACTS / "web-done.png"), full_page=True)

    # Multi-turn: "that image" resolves because the history names the generated file.
    llm.on("parse_task", json.dumps([{"task": "image-to-image", "id": 0, "dep": [-1], "args": {"image": src}}]),
           contains="black and white", times=1)
    page.fill("#input", "now make that image black and white")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat .assistant >> nth=1", timeout=15000)
    page.wait_for_function("document.querySelectorAll('#chat .msg[data-done]').length >= 2", timeout=30000)
    prompt = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    assert "black and white" in prompt and src in prompt


def test_upload_makes_a_resource(server, page, tmp_path):
    from PIL import Image

    pic = tmp_path / "mine.png"
    Image.new("RGB", (20, 10), (1, 2, 3)).save(pic)
    page.goto(server.url + "/")
    page.set_input_files("#file", str(pic))
    page.wait_for_function("document.querySelector('#input').value.includes('/uploads/')", timeout=10000)
    path = page.input_value("#input").strip()
    data = requests.get(server.url + path, timeout=5)
    assert data.status_code == 200 and data.content == pic.read_bytes()


def test_upload_rejects_non_media(server):
    resp = requests.post(server.url + "/upload", files={"file": ("x.txt", b"hello")}, timeout=5)
    assert resp.status_code == 400 and "unsupported file type" in resp.json()["error"]["message"]
    resp = requests.post(server.url + "/upload", data={"nofile": "1"}, timeout=5)
    assert resp.status_code == 400 and "`file`" in resp.json()["error"]["message"]


def test_settings_key_is_sent_but_never_echoed(server, llm, page):
    llm.on("parse_task", "[]")
    page.goto(server.url + "/")
    page.click("#settings summary")
    page.fill("#api_key", "sk-browser-secret-123456")
    page.fill("#input", "hello")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelectorAll('#chat .msg[data-done]').length >= 1", timeout=15000)
    assert "sk-browser-secret-123456" not in page.content().replace('value="sk-browser-secret-123456"', "")
    assert "sk-browser-secret-123456" not in server.logs()
    assert Path(server.log).exists()


def test_the_page_sends_the_server_token_from_its_settings(tmp_path, llm, models, models_server, public_dir, page):
    """With api_tokens on, the page says what is wrong without a token and works once one is entered."""
    from tests.conftest import start_server, stop_server, write_config

    _, models_url = models_server
    srv = start_server(write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                    api_tokens=["web-token-42"]), tmp_path)
    try:
        llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]))
        page.goto(srv.url + "/")
        page.fill("#input", "draw a fox")
        page.keyboard.press("Enter")
        page.wait_for_selector("#chat .msg.error", timeout=15000)
        assert "Bearer" in page.inner_text("#chat .msg.error")
        assert page.locator("#settings").get_attribute("open") is not None  # settings opened for the token
        assert llm.requests == []
        page.fill("#server_token", "web-token-42")
        page.fill("#input", "draw a fox")
        page.keyboard.press("Enter")
        page.wait_for_selector("#chat .assistant[data-done='1']", timeout=30000)
        src = page.locator('.task[data-id="0"] img').get_attribute("src")
        assert src.startswith("/images/")
        assert page.evaluate("s => fetch(s).then(r => r.status)", src) == 200
    finally:
        stop_server(srv)


RESULTS_DAG = json.dumps([
    {"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
    {"task": "object-detection", "id": 1, "dep": [-1], "args": {"image": "/examples/red.png"}},
    {"task": "token-classification", "id": 2, "dep": [-1],
     "args": {"text": "Anna lives in Berlin /images/" + "0123456789abcdef" * 4 + ".png"}},  # a long unbroken word
    {"task": "image-to-text", "id": 3, "dep": [-1], "args": {"image": "/examples/missing.png"}},
])
HOSTILE_ANSWER = ("**Done.** The cat is in `/examples/red.png`.\n- first\n- second\n"
                  "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>"
                  "[click](javascript:window.pwned=3) [home](//evil.example/x)")


def run_results_page(server, llm, page, width: int):
    llm.on("parse_task", RESULTS_DAG, contains="show results")
    llm.on("response_results", HOSTILE_ANSWER)
    page.set_viewport_size({"width": width, "height": 800})
    page.goto(server.url + "/")
    page.fill("#input", "show results")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat .assistant[data-done='1']", timeout=30000)


@pytest.mark.parametrize("width", [390, 1280])
def test_results_render_for_people_at_phone_and_desktop_width(server, llm, models, page, width):
    run_results_page(server, llm, page, width)
    page.screenshot(path=str(ARTIFACTS / f"web-results-{width}.png"), full_page=True)
    # nothing overflows sideways; the text box stays usable on a phone
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert page.evaluate("document.querySelector('#input').getBoundingClientRect().width") >= min(300, width * 0.7)
    # labels as ranked bars, best first; boxes drawn on the picture; entities as chips
    bars = page.locator('.task[data-id="0"] .bar .lbl').all_inner_texts()
    assert bars == ["tabby cat", "dog"]
    assert page.locator('.task[data-id="1"] img').count() == 1 and page.locator('.task[data-id="1"] .bar').count() == 1
    assert "Anna · PER" in page.inner_text('.task[data-id="2"] .chips')
    # JSON only behind the raw toggle
    raw = page.locator('.task[data-id="0"] details.raw')
    assert raw.count() == 1 and raw.get_attribute("open") is None
    assert '"score"' not in page.locator('.task[data-id="0"]').inner_text()
    # a failed task's error is shown once
    failed = page.inner_text('.task[data-id="3"]')
    assert failed.count("file not found") == 1
    # the answer is Markdown, rendered without letting model output inject HTML or scripts
    bubble = page.locator("#chat .assistant")
    assert bubble.locator("strong").inner_text() == "Done." and bubble.locator("li").count() == 2
    assert bubble.locator("img, script").count() == 0
    assert page.evaluate("window.pwned") is None
    assert "<img src=x" in bubble.inner_text()  # shown as text
    hrefs = bubble.locator("a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert not any(h.startswith("javascript") or h.startswith("//") for h in hrefs)


def test_the_page_thinks_visibly_and_has_a_favicon(server, llm, models, page):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 1.5
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]),
           contains="slow fox")
    page.goto(server.url + "/")
    page.fill("#input", "draw a slow fox")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat .assistant.thinking", timeout=5000)
    # while the picture is drawn the bubble says so, not only "thinking"
    page.wait_for_function("() => (document.querySelector('#chat .assistant.thinking') || {dataset: {}})"
                           ".dataset.status === 'running #0 text-to-image'", timeout=10000)
    said = page.evaluate("getComputedStyle(document.querySelector('#chat .assistant.thinking'), '::after').content")
    assert said == '"running #0 text-to-image"'
    page.wait_for_selector("#chat .assistant[data-done='1']", timeout=30000)
    assert page.locator("#chat .assistant.thinking").count() == 0
    icon = requests.get(server.url + "/favicon.ico", timeout=5)
    assert icon.status_code == 200 and icon.headers["Content-Type"].startswith("image/svg+xml")


def test_the_models_box_searches_the_catalog_and_shows_cards_safely(server, page):
    """The planner's choices, browsable: the Models box lists cards best first; ids are text, never markup."""
    page.goto(server.url + "/")
    page.click("#catalog summary")
    page.fill("#catalog-q", "translate English into German")
    page.fill("#catalog-task", "translation")
    page.click("#catalog-search button")
    page.wait_for_selector("#catalog-results .card", timeout=15000)
    ids = page.locator("#catalog-results .card b").all_inner_texts()
    expected = [c["id"] for c in requests.get(server.url + "/models/search", params={
        "task": "translation", "q": "translate English into German", "limit": 20}, timeout=10).json()]
    assert ids == expected and "Helsinki-NLP/opus-mt-en-de" in ids
    assert "downloads" in page.locator("#catalog-results .card .meta").first.inner_text()
    page.fill("#catalog-task", "<img src=x onerror=alert(1)>")
    page.click("#catalog-search button")
    page.wait_for_function("document.querySelector('#catalog-results').textContent.includes('unknown task')")
    assert page.locator("#catalog-results img").count() == 0  # the error is shown as text
    # a card from a hostile Hub listing: its id and task are shown as text, never run as markup
    hostile = '<img src=x onerror="document.title=1">'
    page.route("**/models/search*", lambda route: route.fulfill(json=[
        {"id": hostile, "task": hostile, "downloads": 1, "likes": 1, "score": 0.5}]))
    page.fill("#catalog-task", "")
    page.click("#catalog-search button")
    page.wait_for_selector("#catalog-results .card", timeout=5000)
    assert page.locator("#catalog-results img").count() == 0
    assert page.locator("#catalog-results .card b").inner_text() == hostile


@pytest.fixture
def with_examples(public_dir):
    """The shipped example files in the test server's public/ (the page's example requests name them)."""
    for example in (ROOT / "public" / "examples").iterdir():
        target = public_dir / "examples" / example.name
        if not target.exists():
            target.write_bytes(example.read_bytes())
    return public_dir


@pytest.mark.parametrize("width", [1280, 360])
def test_first_hour_page_examples_graph_uploads_clips_and_a_failure(server, llm, models, page, with_examples, tmp_path,
                                                                    width):
    """Issue 21: a compact page with clickable examples before the first request, a readable graph at phone
    width, clip lengths, uploads shown as pictures, and a failed request that clears the last graph."""
    from PIL import Image

    from tools.demo_planner import plan_reply

    llm.on("parse_task", plan_reply)  # the offline demo's planner: the example's words decide the tasks
    page.set_viewport_size({"width": width, "height": 800})
    page.goto(server.url + "/")
    # before the first request: a compact header, examples with their pictures, a hint in the empty graph
    assert page.evaluate("document.querySelector('header').getBoundingClientRect().height") <= 56
    examples = page.locator("#examples button.example")
    assert examples.count() >= 5
    page.wait_for_function("[...document.querySelectorAll('#examples img')].every(i => i.complete && i.naturalWidth)")
    assert page.locator("#graph-hint").is_visible() and "task graph" in page.inner_text("#graph-hint")
    # the file button says what it does, whole; the placeholder fits its box
    attach = page.locator("#attach")
    assert attach.inner_text().strip() == "Attach file"
    assert page.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#attach'))")
    assert page.evaluate("""(() => {
        const t = document.querySelector('#input'), s = getComputedStyle(t), probe = document.createElement('div');
        probe.style.cssText = `position:absolute;visibility:hidden;white-space:pre-wrap;font:${s.font};` +
            `width:${t.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)}px;` +
            `letter-spacing:${s.letterSpacing};line-height:${s.lineHeight}`;
        probe.textContent = t.placeholder; document.body.appendChild(probe);
        const fits = probe.offsetHeight <= t.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom) + 1;
        probe.remove(); return fits; })()""")
    page.screenshot(path=str(ARTIFACTS / f"web-first-hour-start-{width}.png"), full_page=True)

    # an example, clicked: planned from its words, its picture shown in the request, the graph readable
    page.locator("#examples button.example", has_text="Caption /examples/chelsea.jpg").click()
    page.wait_for_selector("#chat .assistant[data-done='1']", timeout=30000)
    assert page.locator("#examples").is_hidden()
    assert page.eval_on_selector_all("#graph .node", "ns => ns.map(n => n.dataset.state)") == ["done", "done"]
    assert page.locator("#graph-hint").is_hidden()
    label = page.evaluate("document.querySelector('#graph .node text').getBoundingClientRect().height")
    assert label >= 13, label  # drawn 1:1 (12 px type); at 360 px it was scaled to about 6 px
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert page.locator("#chat .user img[src='/examples/chelsea.jpg']").count() == 1
    page.wait_for_function("document.querySelector('.task[data-id=\"1\"] .clip .dur').textContent !== ''")
    assert page.inner_text('.task[data-id="1"] .clip .dur') == "0.10 s"  # the player alone says 0:00 / 0:00
    page.screenshot(path=str(ARTIFACTS / f"web-first-hour-done-{width}.png"), full_page=True)

    # an upload is shown as the picture it is
    pic = tmp_path / "mine.png"
    Image.new("RGB", (30, 20), (250, 200, 10)).save(pic)
    page.set_input_files("#file", str(pic))
    page.wait_for_selector("#attachments img", timeout=10000)
    page.wait_for_function("document.querySelector('#attachments img').naturalWidth === 30")
    assert page.locator("#attachments img").get_attribute("src").startswith("/uploads/")

    # a request that fails leaves no graph of the one before
    llm.fail(500, 500, 500, 500)
    page.fill("#input", "this one fails")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat .msg.error", timeout=30000)
    assert page.locator("#graph .node").count() == 0 and page.locator("#tasks .task").count() == 0
    assert page.locator("#graph-hint").is_visible()
