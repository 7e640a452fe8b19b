"""Issue 21, "the first hour": what a new user trips on, each as a test (the page: test_web.py; the CLI on a
terminal: test_cli_pty.py; the demo end to end: test_demo.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from flask import Flask

from tests.conftest import ROOT, free_port, start_server, stop_server, write_config
from tests.fakes.llm_server import ThreadedServer
from tools.demo_planner import plan

# -- 1. "ready" only for a server that is ours, a taken port is one line at once -----------------------------


@pytest.fixture(params=["socket", "old-demo"])
def taken_port(request):
    """A port held by another program: a bare listener, or an HTTP server answering /health like an old demo."""
    if request.param == "socket":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]
        sock.close()
        return
    app = Flask("old-demo")
    app.get("/health")(lambda: {"status": "ok", "model_ranking": "semantic"})
    server = ThreadedServer(app).start()
    yield server.port
    server.stop()


@pytest.mark.parametrize("script,via,hint", [
    ("tools/demo.py", "make demo", "`make demo PORT=9000`"),
    ("tools/demo.py", None, "`python tools/demo.py --port 9000`"),
    ("tools/start.py", "make run", "`make run PORT=9000`"),
    ("tools/start.py", None, "`python tools/start.py --port 9000`"),
])
def test_a_taken_port_is_one_line_at_once_never_ready(taken_port, script, via, hint, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HUGGINGGPT_VIA", "OPENAI_API_KEY")}
    if via:
        env["HUGGINGGPT_VIA"] = via
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(ROOT / script), "--port", str(taken_port)], capture_output=True,
                         text=True, timeout=120, env=env, cwd=ROOT)
    took = time.monotonic() - started
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert "ready" not in run.stdout and "building tiny models" not in run.stdout  # nothing slow was started
    errors = [line for line in run.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "error: error:" not in run.stderr, run.stderr
    assert f"port {taken_port} is already in use" in errors[0] and hint in errors[0], errors[0]
    assert took < 15, took


def test_the_server_checks_its_port_before_building_anything(taken_port, tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=True,
                          cache_dir=str(tmp_path / "cache"))
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "server",
                          "--host", "127.0.0.1", "--port", str(taken_port)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"error: 127.0.0.1:{taken_port} is already in use; choose another with --port "
                                  "(or http_listen.port in the config)"), run.stderr
    assert not (tmp_path / "cache").exists()  # the ranker was never loaded


# -- 2. the demo's scripted planner reads the request ----------------------------------------------------------

def tasks_of(request: str) -> list[tuple[str, dict]]:
    return [(t["task"], t["args"]) for t in plan(request)]


def test_the_demo_planner_follows_the_words_and_the_files():
    assert tasks_of("Caption /examples/chelsea.jpg and read the caption aloud") == [
        ("image-to-text", {"image": "/examples/chelsea.jpg"}), ("text-to-speech", {"text": "<GENERATED>-0"})]
    assert tasks_of("Detect the objects in /examples/coffee.jpg") == [
        ("object-detection", {"image": "/examples/coffee.jpg"})]
    assert tasks_of("Transcribe /examples/speech.wav") == [
        ("automatic-speech-recognition", {"audio": "/examples/speech.wav"})]
    assert tasks_of("Draw a rocket over the sea and show its edges") == [
        ("text-to-image", {"text": "a rocket over the sea"}), ("canny-control", {"image": "<GENERATED>-0"})]
    assert [t for t, _ in tasks_of("What kind of picture is /examples/astronaut.jpg? Classify it and estimate its "
                                   "depth")] == ["image-classification", "depth-estimation"]
    assert tasks_of("Find the names in 'Anna lives in Berlin' and read them aloud") == [
        ("token-classification", {"text": "Anna lives in Berlin"}), ("text-to-speech", {"text": "Anna lives in Berlin"})]
    # an uploaded photo is what the image tasks run on; with no rule, it is captioned and classified
    upload = "/uploads/3f2a9c1b4e7d0a5b.png"
    assert tasks_of(f"{upload}") == [("image-to-text", {"image": upload}), ("image-classification", {"image": upload})]
    assert tasks_of(f"how many cats are in {upload}?")[0][0] == "visual-question-answering"
    assert [t for t, _ in tasks_of("segment /uploads/a.jpg")] == ["image-segmentation"]
    assert [t for t, _ in tasks_of("what sound is /uploads/b.wav")] == ["audio-classification"]
    assert [t for t, _ in tasks_of("translate 'good morning' into German and summarize it")] == [
        "translation", "summarization"]
    assert [t for t, _ in tasks_of("is 'a great movie' positive or negative?")] == ["text-classification"]
    assert plan("hello") == []  # a greeting is a chat
    assert tasks_of("a red fox") == [("text-to-image", {"text": "a red fox"})]  # words alone are drawn


# -- 5. an LLM that is down: fast one-line errors, start-up checks, /health degraded ------------------------------

def closed_port() -> int:
    return free_port()  # nothing listens there once the probe socket is closed


def test_text_mode_with_the_llm_down_is_one_line_at_once(tmp_path, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, f"http://127.0.0.1:{closed_port()}", models_url, public_dir, semantic_ranking=True,
                          cache_dir=str(tmp_path / "cache"), llm_max_retries=3)
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                          "--input", "draw a fox"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1 and len(lines) == 1, run.stderr  # no "loading the model ranker" first
    assert lines[0].startswith("error: the LLM at http://127.0.0.1:") and "unreachable (connection refused" in lines[0]
    assert str(config) in lines[0]  # where to fix it
    assert took < 8, took


def test_a_refused_connection_is_not_retried():
    from hugginggpt.config import LLMSettings
    from hugginggpt.errors import LLMError
    from hugginggpt.llm import LLMClient

    client = LLMClient(LLMSettings(api_type="local", endpoint=f"http://127.0.0.1:{closed_port()}/v1", model="m",
                                   max_retries=3))
    started = time.monotonic()
    with pytest.raises(LLMError, match="unreachable"):
        client.chat([{"role": "user", "content": "hi"}])
    assert time.monotonic() - started < 2  # three retries with back-off would take 3.5 s


def test_start_checks_and_health_say_what_is_down(tmp_path, public_dir):
    config = write_config(tmp_path, f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}",
                          public_dir, semantic_ranking=False)
    srv = start_server(config, tmp_path)
    try:
        health = requests.get(srv.url + "/health", timeout=10).json()
        assert health["status"] == "degraded" and health["down"] == ["llm", "models_server"], health
        assert health["models_server"] == "down" and health["llm"]["reachable"] is False
        assert "127.0.0.1" not in json.dumps(health)  # /health is open: it names no endpoint
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and srv.logs().count("warning:") < 2:
            time.sleep(0.1)
        logs = srv.logs()
    finally:
        stop_server(srv)
    start = next(line for line in logs.splitlines() if line.startswith("HuggingGPT server on"))
    assert "no API key" in start and "'api_key'" not in start, start
    warnings = [line for line in logs.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2, logs
    assert any("the LLM at http://127.0.0.1:" in w and "unreachable" in w for w in warnings)
    assert any("the models server at http://127.0.0.1:" in w and "down" in w for w in warnings)


def test_start_checks_and_health_when_all_is_up(server):
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["down"] == [] and health["llm"]["reachable"] is True
    assert health["llm"]["api_key"] == "unset"  # a local LLM with no key is not said to have one
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and server.logs().count("check:") < 2:
        time.sleep(0.1)
    checks = [line for line in server.logs().splitlines() if line.startswith("check:")]
    assert any(line.startswith("check: the LLM (local at http://127.0.0.1:") for line in checks), checks
    assert any(line.startswith("check: the models server at http://127.0.0.1:") for line in checks), checks


# -- 7. config messages ------------------------------------------------------------------------------------------

def test_config_messages_keep_the_line_name_nested_typos_and_list_the_configs(tmp_path):
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text("model: gpt-4o\nhttp_listen:\n  host: 0.0.0.0\n port: 8004\n")
    with pytest.raises(ConfigError) as yaml_error:
        load_config(bad, env={})
    assert str(yaml_error.value).startswith(f"{bad}:4:2: not valid YAML: ")
    typo = tmp_path / "typo.yaml"
    typo.write_text("dev: true\nlocal:\n  endpiont: http://localhost:8006/v1\n")
    with pytest.raises(ConfigError) as nested:
        load_config(typo, env={})
    assert "`local.endpoint` is required" in str(nested.value)
    assert "`local.endpiont` (did you mean `local.endpoint`?)" in str(nested.value)
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", "configs/config.defualt.yaml",
                          "--mode", "text", "--input", "x"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "did you mean configs/config.default.yaml?" in run.stderr
    for name in ("config.azure.yaml", "config.default.yaml", "config.lite.yaml", "config.local.yaml"):
        assert name in run.stderr


# -- 8. README examples as pasted; event times in order; `done` names the request -------------------------------

def readme_curls() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### HTTP API", 1)[1].split("\n### ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if (line.startswith("#") or not line.strip()) and not current:
            continue
        current += line.split("   #", 1)[0].rstrip() + "\n"
        if current.count("'") % 2 == 0 and current.strip():
            commands.append(current.strip())
            current = ""
    return commands


def test_the_readme_http_examples_run_as_pasted(server, llm):
    commands = readme_curls()
    assert len(commands) >= 5 and all("[...]" not in c and "{...}" not in c for c in commands), commands
    host = server.url.removeprefix("http://")
    for command in commands:
        assert command.startswith("curl ") and "localhost:8004" in command, command
        argv = shlex.split(command.replace("localhost:8004", host))
        run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, (command, run.stderr)
        data = json.loads(run.stdout)
        assert not (isinstance(data, dict) and "error" in data), (command, data)


def test_stream_times_never_go_back_and_done_names_the_request(server, llm, models):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 0.3
    llm.on("parse_task", json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
        {"task": "token-classification", "id": 2, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
    ]))
    llm.stream_delay = 0.02  # the plan streams: its first tasks start before the plan event
    resp = requests.post(server.url + "/hugginggpt", json={"messages": [{"role": "user", "content": "go"}],
                                                          "stream": True}, stream=True, timeout=60)
    events = []
    for block in resp.text.split("\n\n"):
        name = re.search(r"^event: (.*)$", block, re.M)
        data = re.search(r"^data: (.*)$", block, re.M)
        if name and data:
            events.append((name.group(1), json.loads(data.group(1))))
    names = [n for n, _ in events]
    assert names[0] == "plan" and names[-1] == "done", names
    times = [e["t"] for n, e in events if "t" in e]
    assert times == sorted(times), [(n, e.get("t")) for n, e in events]
    ids = {e["request_id"] for _, e in events}
    assert len(ids) == 1 and events[-1][1] == {"event": "done", "request_id": ids.pop()}
    for tid in (0, 1, 2):  # each task: model chosen, then started
        order = [n for n, e in events if e.get("id") == tid and n in ("model_selected", "task_started")]
        assert order == ["model_selected", "task_started"], (tid, names)


# -- 9. ray is an extra; download sizes and a total --------------------------------------------------------------

def test_make_run_does_not_install_ray_but_make_test_does():
    run = subprocess.run(["make", "-B", "-n", "run"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    test = subprocess.run(["make", "-B", "-n", "test"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    cli = subprocess.run(["make", "-B", "-n", "cli"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert run.returncode == 0 and "requirements.txt" in run.stdout and "ray" not in run.stdout, run.stdout
    assert "-r requirements-ray.txt" in test.stdout
    assert 'HUGGINGGPT_VIA="make cli"' in cli.stdout and "--mode cli" in cli.stdout and "ray" not in cli.stdout


def test_download_dry_run_gives_sizes_and_a_total(tmp_path):
    run = subprocess.run([sys.executable, "-m", "hugginggpt.modelhost.download", "--config",
                          "configs/config.default.yaml", "--models-dir", str(tmp_path / "none"), "--dry-run"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    fetches = [line for line in lines if "would fetch" in line]
    unknown = [line for line in fetches if "size unknown" in line]
    assert len(fetches) > 30 and len(unknown) <= 2, unknown
    total = re.fullmatch(r"total: (\d+) download\(s\), about ([\d.]+) GB( \((\d+) size\(s\) unknown, not counted\))?",
                         lines[-1])
    assert total and int(total.group(1)) == len(fetches), lines[-1]
    assert 20 < float(total.group(2)) < 200
    assert int(total.group(4) or 0) == len(unknown)


def test_examples_named_on_the_page_and_in_the_readme_exist():
    page = (ROOT / "hugginggpt" / "web" / "index.html").read_text()
    named = set(re.findall(r"/examples/[\w.-]+", page))
    assert len(named) >= 5
    assert all((ROOT / "public" / p.lstrip("/")).is_file() for p in named), named
    assert Path(ROOT / "tools" / "demo_planner.py").is_file()
