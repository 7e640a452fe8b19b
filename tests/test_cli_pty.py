"""The interactive CLI driven through a pseudo-terminal, as a person at a keyboard would drive it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT, write_config


class Terminal:
    """A child process on a pty: what it prints is read back, keys are typed into it (Ctrl-C included)."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            # as when started from a script in the background, which ignores SIGINT: Ctrl-C must work anyway
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            os.execv(argv[0], argv)
        self.text = ""

    def read_until(self, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{needle!r} did not appear; the terminal shows:\n{self.text[-3000:]}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096).decode(errors="replace")
                except OSError:
                    chunk = ""
                if not chunk:
                    raise AssertionError(f"the program ended before {needle!r}:\n{self.text[-3000:]}")
                self.text += chunk
        return self.text

    def drain(self, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096).decode(errors="replace")
                except OSError:
                    break
                if not chunk:
                    break
                self.text += chunk
        return self.text

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(self.fd)


CAPTIONER = "cli-test/captioner"  # a model id only this module's orchestrator can pick


@pytest.fixture
def terminal(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text(json.dumps({"id": "stabilityai/stable-diffusion-xl-base-1.0", "task": "text-to-image"}) + "\n"
                       + json.dumps({"id": CAPTIONER, "task": "image-to-text"}) + "\n")
    models.models[CAPTIONER] = "image-to-text"
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False, catalog=str(catalog))
    term = Terminal([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "cli"])
    yield term
    term.close()


def test_ctrl_c_cancels_the_running_request_and_history_keeps_files(terminal, llm, models):
    models.delays["stabilityai/stable-diffusion-xl-base-1.0"] = 2.5
    llm.on("parse_task", json.dumps([
        {"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a slow fox"}},
        {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    ]), contains="slow fox")
    terminal.read_until("[ User ]: ")
    terminal.type("draw a slow fox\n")
    terminal.read_until("#0 text-to-image started")
    terminal.type("\x03")  # Ctrl-C
    terminal.read_until("(cancelled)")
    shown = len(terminal.text)
    terminal.read_until("[ User ]: ")
    later = terminal.drain(3.5)[shown:]  # the model call ends meanwhile; nothing more may be printed
    assert "#0" not in later and "#1" not in later and "Jarvis" not in later, later
    assert not any(c["model"] == CAPTIONER for c in models.calls)  # #1 never ran

    # a normal turn: model time and selection time are shown apart, files go into the history
    models.delays.clear()
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]),
           contains="quick fox")
    terminal.type("draw a quick fox\n")
    terminal.read_until("[ Jarvis ]:")
    assert "chosen in" in terminal.text and "done: model ran" in terminal.text
    terminal.read_until("[ User ]: ")
    llm.on("parse_task", "[]", contains="make it bigger")
    terminal.type("make it bigger\n")
    terminal.read_until("CHITCHAT")
    planner = [r for r in llm.stage_requests("parse_task") if "make it bigger" in json.dumps(r["body"])][-1]
    history = json.dumps(planner["body"]["messages"])
    assert "Generated files: /images/" in history  # the follow-up can name the earlier picture
    assert "slow fox" not in history  # the cancelled turn left no trace


def test_text_mode_exits_non_zero_when_a_task_failed(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False)
    models.broken.add("stabilityai/stable-diffusion-xl-base-1.0")
    models.models = {"stabilityai/stable-diffusion-xl-base-1.0": "text-to-image"}
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "x"}}]))
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                          "--input", "draw x"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "ANSWER" in run.stdout  # the answer still explains what happened
    assert "1 task(s) failed: #0" in run.stderr
    models.broken.clear()
    ok = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                         "--input", "draw x"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


def test_the_cli_says_when_it_loads_the_ranker_and_shows_no_library_noise(tmp_path, llm, models, models_server,
                                                                          public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=True,
                          cache_dir=str(tmp_path / "cache"))
    llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 0, "dep": [-1],
                                      "args": {"text": "Anna lives in Berlin"}}]))
    run = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                          "--input", "find names"], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert lines[0] == "loading the model ranker (all-MiniLM-L6-v2)..."
    assert all(line.startswith("  [") for line in lines[1:]), lines  # only our progress lines follow


class BlockingEngine:
    """Stands in for the pipeline: runs until cancelled (or 5 s), so the test sees how fast Ctrl-C lands."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.worker: int | None = None

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self, request, mode, on_event, state_ready):
        self.worker = threading.get_ident()
        state_ready(self)
        self.cancelled.wait(5)
        return {"message": "finished"}


def test_ctrl_c_lands_even_when_the_signal_hits_another_thread():
    """The kernel may deliver SIGINT to any thread; the CLI must still cancel at once, not when the run ends."""
    from hugginggpt.cli import answer_once

    engine = BlockingEngine()

    def interrupt() -> None:
        while engine.worker is None:
            time.sleep(0.01)
        time.sleep(0.2)
        signal.pthread_kill(engine.worker, signal.SIGINT)  # not the main thread

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # pytest may run with SIGINT ignored
    try:
        threading.Thread(target=interrupt, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            answer_once(engine, [{"role": "user", "content": "draw a slow fox"}], None)
        assert time.monotonic() - started < 2 and engine.cancelled.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)


PROGRESS = re.compile(r"\[\s*(\d+\.\d+)s\]")


def test_progress_lines_are_whole_in_order_and_the_answer_reads_as_text(tmp_path, llm, models, models_server,
                                                                        public_dir):
    """Issue 21: twelve tasks at once over two turns: no two progress lines on one line, times never go back, a
    task's model is named before it starts, no urllib3 pool warnings, and the answer's Markdown is rendered."""
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                          choose_model="llm")
    models.delays.update({m: 0.2 for m in ("google/vit-base-patch16-224", "facebook/detr-resnet-50")})
    tasks = [{"task": "image-classification" if i % 2 else "object-detection", "id": i, "dep": [-1],
              "args": {"image": "/examples/red.png"}} for i in range(12)]
    llm.on("parse_task", json.dumps(tasks))
    llm.on("choose_model", lambda body: json.dumps({"id": "google/vit-base-patch16-224" if "classification" in
                                                    json.dumps(body) else "facebook/detr-resnet-50",
                                                    "reason": "scripted"}), delay=0.3)
    llm.on("response_results", "## Result\nThe picture is **red** and `plain`.\n- first\n- second\n"
                               "See [the docs](http://example.org/docs).")
    term = Terminal([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "cli"])
    try:
        for turn in range(2):
            term.read_until("[ User ]: ")
            shown = len(term.text)
            term.type(f"look at the red picture, turn {turn}\n")
            term.read_until("[ Jarvis ]:")
            deadline = time.monotonic() + 30
            while "[ User ]: " not in term.text[shown:] and time.monotonic() < deadline:
                term.drain(0.2)
            out = term.text[shown:].replace("\r\n", "\n")
            lines = [line for line in out.split("\n") if PROGRESS.search(line)]
            assert all(len(PROGRESS.findall(line)) == 1 and line.startswith("  [") for line in lines), lines
            times = [float(PROGRESS.search(line).group(1)) for line in lines]
            assert times == sorted(times), lines
            for i in range(12):
                chosen = next(n for n, line in enumerate(lines) if re.search(rf"\] #{i} [\w-]+: model ", line))
                started = next(n for n, line in enumerate(lines) if re.search(rf"\] #{i} [\w-]+ started", line))
                assert chosen < started, lines
            answer = out.split("[ Jarvis ]:", 1)[1].split("[ User ]:", 1)[0]
            assert "**" not in answer and "##" not in answer and "`" not in answer and "](" not in answer, answer
            assert "  • first" in answer and "the docs (http://example.org/docs)" in answer, answer
            assert "Connection pool is full" not in out and "WARNING" not in out, out
    finally:
        term.close()


def test_make_cli_chats_on_the_demo_stack_offline(tmp_path):
    """`make cli` with no LLM configured (start.py --mode cli) runs the terminal chat on the offline demo."""
    env_key = os.environ.pop("OPENAI_API_KEY", None)
    try:
        term = Terminal([sys.executable, str(ROOT / "tools" / "start.py"), "--config",
                         str(ROOT / "configs" / "config.default.yaml"), "--mode", "cli"])
    finally:
        if env_key is not None:
            os.environ["OPENAI_API_KEY"] = env_key
    try:
        term.read_until("[ User ]: ", timeout=300)
        config = re.search(r"demo config: (\S+)", term.text)
        assert config and os.path.isfile(config.group(1)), term.text
        term.type("Transcribe /examples/speech.wav\n")
        term.read_until("[ Jarvis ]:", timeout=120)
        assert "#0 automatic-speech-recognition: model facebook/wav2vec2-base-960h" in term.text
        assert "offline demo" in term.text and "POST /v1" not in term.text  # no access log of the scripted LLM
        term.read_until("[ User ]: ")
        term.type("exit\n")
        term.read_until("demo stopped", timeout=60)
    finally:
        term.close()


class SlowTerminal:
    """A terminal that takes a moment per write, as a real one under load does (where threads interleave)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        time.sleep(0.0005)
        self.parts.append(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_progress_lines_from_many_threads_are_never_glued():
    from hugginggpt.cli import Turn, progress_printer

    out = SlowTerminal()
    show = progress_printer(out, Turn(), threading.Event())

    def events(tid: int) -> None:
        for n in range(15):
            show("task_started", {"id": tid, "task": "object-detection", "t": n / 100})

    threads = [threading.Thread(target=events, args=(tid,)) for tid in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = "".join(out.parts).split("\n")
    assert lines[-1] == "" and len(lines) == 8 * 15 + 1
    assert all(re.fullmatch(r"  \[\s*\d+\.\d+s\] #\d object-detection started", line) for line in lines[:-1]), lines
