"""cli.py in-process: what a person at the terminal sees, line by line, and how a session starts and ends.

The PTY and subprocess tests (test_cli_pty.py, test_config_cli.py, test_first_hour.py, test_progress.py) drive the
real program and are too slow to run once per mutant; these drive each function of the module directly, in
milliseconds, and pin its exact output:

- `progress_printer`: each pipeline event's line (times, the plan, the model chosen, started / done / failed /
  skipped), the files and failures it collects, and on a terminal the one progress line per running task rewritten
  in place (cursor up, clear below, redraw), cut to the terminal's width, gone when its task ends; nothing once muted;
- `answer_once`: the request on its own thread, its answer, files and failures, errors handed to the caller, Ctrl-C
  cancelling the request (and muting it) within a poll;
- `warm_up`, `llm_down`, `quiet_libraries` and `Turn.history_entry`;
- `run_text`: stdout (the answer, rendered), stderr (progress, errors, failed tasks) and the exit status;
- `run_cli`: the welcome, the prompt (flushed before input is read), history between turns, what ends a session
  (EOF, `exit`/`quit`, Ctrl-C at the prompt), a failed or cancelled turn leaving no trace, colours on a terminal and
  SIGINT restored when started with it ignored;
- `render_markdown`: the answer's Markdown as plain or styled terminal text, control characters dropped.

The engine is the real `HuggingGPT` on the scripted LLM and the fake models server (both on loopback, from
tests/conftest.py); a small stand-in engine passed as the `engine` argument covers what the fakes cannot script on
cue (a ranker still warming, Ctrl-C at an exact moment, events in a chosen order)."""

from __future__ import annotations

import _thread
import io
import json
import os
import re
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import urllib3

from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT
from hugginggpt.cli import (
    Turn,
    answer_once,
    llm_down,
    progress_printer,
    quiet_libraries,
    render_markdown,
    run_cli,
    run_text,
    warm_up,
)
from hugginggpt.config import load_config
from hugginggpt.errors import BadRequest, LLMError
from tests.conftest import free_port, write_config

WELCOME = "Welcome to HuggingGPT. Ask for anything; type `exit` to quit, Ctrl-C cancels a running request.\n"
SD = "stabilityai/stable-diffusion-xl-base-1.0"
ONE_IMAGE = json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}])
IMAGE_THEN_CAPTION = json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}},
                                 {"task": "image-to-text", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}}])


class Screen(io.StringIO):
    """A terminal: what is written stays readable, and isatty() says yes."""

    def isatty(self) -> bool:
        return True


class Buffered(io.StringIO):
    """A stream that shows what was written only once it is flushed, as a real terminal's buffered stdout does."""

    def __init__(self) -> None:
        super().__init__()
        self.shown = ""

    def flush(self) -> None:
        self.shown = self.getvalue()


class Keyboard:
    """stdin: one line per readline; `before[k]` runs just before line k is read; KeyboardInterrupt as a line raises it."""

    def __init__(self, lines: list[Any], tty: bool = False, before: dict[int, Any] | None = None):
        self.lines, self.tty, self.before, self.read = list(lines), tty, before or {}, 0

    def isatty(self) -> bool:
        return self.tty

    def readline(self) -> str:
        if self.read in self.before:
            self.before[self.read]()
        self.read += 1
        line = self.lines.pop(0) if self.lines else ""
        if line is KeyboardInterrupt:
            raise KeyboardInterrupt
        return line


def interrupt_main_once_it_waits() -> None:
    """Ctrl-C as Python delivers it to the main thread, once that thread waits on the request's worker."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + 5
    while sys._current_frames()[main].f_code.co_name not in ("join", "_wait_for_tstate_lock") \
            and time.monotonic() < deadline:
        time.sleep(0.002)
    _thread.interrupt_main()


class StandIn:
    """An engine whose run emits `events` to the CLI and answers `answer` (or Ctrl-C, or raises `error`)."""

    def __init__(self, answer: str = "ok", events: list[tuple[str, dict[str, Any]]] = (), ranking: str = "keyword",
                 interrupt: bool = False, ready: bool = True, error: BaseException | None = None,
                 after_cancel: list[tuple[str, dict[str, Any]]] = ()):
        self.answer, self.events, self.ranking = answer, list(events), ranking
        self.interrupt, self.ready, self.error, self.after_cancel = interrupt, ready, error, list(after_cancel)
        self.requests: list[Any] = []
        self.modes: list[str] = []
        self.threads: list[threading.Thread] = []
        self.cancelled = threading.Event()
        self.warmed: list[str] = []
        self.out: Any = None  # what warm() sees already written, when set

    def warm(self) -> None:
        self.warmed.append(self.out.getvalue() if self.out is not None else "")

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self, request, mode, on_event, state_ready):
        self.requests.append(request)
        self.modes.append(mode)
        self.threads.append(threading.current_thread())
        if self.ready:
            state_ready(self)
        for name, event in self.events:
            on_event(name, event)
        if self.error is not None:
            raise self.error
        if self.interrupt:
            self.interrupt = False  # once: the next turn answers
            interrupt_main_once_it_waits()
            self.cancelled.wait(5)
            for name, event in self.after_cancel:
                on_event(name, event)
            return {"message": "too late"}
        return {"message": self.answer}


def times_out(text: str) -> str:
    """Progress lines with their clock readings as `T` and durations as `S`: those vary from run to run."""
    text = re.sub(r"\[\s*\d+\.\d\ds\]", "[T]", text)
    return re.sub(r"(chosen in|model ran) \d+\.\d\ds", r"\1 S", text)


@pytest.fixture
def engine(tmp_path, llm, models, models_server, public_dir) -> HuggingGPT:
    config = load_config(write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False))
    return HuggingGPT(config, ranker=KeywordRanker())


@pytest.fixture
def down(tmp_path, models_server, public_dir) -> tuple[HuggingGPT, int, Path]:
    """An engine whose LLM is a loopback port nothing listens on; with that port and the config's path."""
    port = free_port()
    path = write_config(tmp_path, f"http://127.0.0.1:{port}", models_server[1], public_dir, semantic_ranking=False)
    return HuggingGPT(load_config(path), ranker=KeywordRanker()), port, path


@pytest.fixture
def sigint():
    """SIGINT handled by Python (as outside pytest), and put back as it was after the test."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def color(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "")
    monkeypatch.delenv("NO_COLOR")


# -- Turn and quiet_libraries ------------------------------------------------------------------------------------


def test_a_turn_without_files_is_kept_in_history_as_its_answer():
    assert Turn(answer="It is a fox.").history_entry() == "It is a fox."
    assert Turn().history_entry() == "" and Turn().files == [] and Turn().failed == []


def test_a_turn_with_files_names_them_in_history_for_follow_ups():
    turn = Turn(answer="Here it is.", files=["/images/a.png", "/audios/b.wav"])
    assert turn.history_entry() == "Here it is.\nGenerated files: /images/a.png, /audios/b.wav"


def test_turns_do_not_share_their_lists():
    first, second = Turn(), Turn()
    first.files.append("/images/a.png")
    first.failed.append(0)
    assert second.files == [] and second.failed == []


def test_quiet_libraries_turns_off_progress_bars_and_warnings_but_keeps_what_the_user_set(monkeypatch):
    for name in ("HF_HUB_DISABLE_PROGRESS_BARS", "TQDM_DISABLE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(name, "unset below")
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")  # the user's own choice stays
    with warnings.catch_warnings(record=True) as seen:
        quiet_libraries()
        warnings.warn("library noise", UserWarning, stacklevel=1)
        warnings.warn("unverified HTTPS request", urllib3.exceptions.InsecureRequestWarning, stacklevel=1)
        assert warnings.filters[0][:3] == ("ignore", None, urllib3.exceptions.HTTPWarning)  # urllib3's own switch
        assert warnings.filters[1][:3] == ("ignore", None, Warning)
    assert seen == []
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert os.environ["TQDM_DISABLE"] == "1"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY")
    quiet_libraries()
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"


# -- progress_printer: the lines of each event --------------------------------------------------------------------


def test_the_plan_line_names_each_task_with_the_time_in_a_six_wide_column():
    out = io.StringIO()
    show = progress_printer(out, Turn(), threading.Event())
    show("plan", {"t": 1.5, "tasks": [{"id": 0, "task": "text-to-image"}, {"id": 1, "task": "image-to-text"}]})
    show("plan", {"t": 123.456, "tasks": [{"id": 2, "task": "summarization"}]})
    show("plan", {"t": 1234.5, "tasks": []})
    show("plan", {"tasks": [{"id": 0, "task": "translation"}]})  # no time: zero
    assert out.getvalue() == ("  [  1.50s] plan: #0 text-to-image, #1 image-to-text\n"
                              "  [123.46s] plan: #2 summarization\n"
                              "  [1234.50s] plan: \n"
                              "  [  0.00s] plan: #0 translation\n")


def test_the_model_chosen_is_named_with_where_it_runs_and_how_long_choosing_took():
    out = io.StringIO()
    show = progress_printer(out, Turn(), threading.Event())
    show("model_selected", {"t": 0.25, "id": 0, "task": "text-to-image", "model": SD, "hosted_on": "local",
                            "seconds": 0.126})
    show("model_selected", {"t": 0.5, "id": 1, "task": "image-to-text", "model": "Salesforce/blip",
                            "hosted_on": "huggingface"})
    show("model_selected", {"t": 0.75, "id": 2, "task": "depth-estimation", "model": None,
                            "error": "no model in the catalog for this task", "seconds": 2})
    assert out.getvalue() == (
        f"  [  0.25s] #0 text-to-image: model {SD} (local), chosen in 0.13s\n"
        "  [  0.50s] #1 image-to-text: model Salesforce/blip (huggingface), chosen in 0.00s\n"
        "  [  0.75s] #2 depth-estimation: no model: no model in the catalog for this task, chosen in 2.00s\n")


def test_started_done_failed_and_skipped_lines():
    out, turn = io.StringIO(), Turn()
    show = progress_printer(out, turn, threading.Event())
    show("task_started", {"t": 1, "id": 0, "task": "text-to-image"})
    show("task_finished", {"t": 2.5, "id": 0, "task": "text-to-image", "result": {}, "seconds": 1.4,
                           "model_seconds": 1.234})  # the model's own time, not the task's
    show("task_finished", {"t": 3, "id": 1, "task": "summarization", "result": {"text": "short"}, "seconds": 0.5})
    show("task_finished", {"t": 3, "id": 2, "task": "translation", "result": None})
    show("task_failed", {"t": 4, "id": 3, "task": "image-to-text", "error": "the model crashed"})
    show("task_failed", {"t": 4, "id": 4, "task": "object-detection", "error": "its input #3 failed",
                         "skipped": True})
    show("task_started", {"t": 5, "id": 5})  # an event without its task's name
    assert out.getvalue() == ("  [  1.00s] #0 text-to-image started\n"
                              "  [  2.50s] #0 text-to-image done: model ran 1.23s\n"
                              "  [  3.00s] #1 summarization done: model ran 0.50s\n"
                              "  [  3.00s] #2 translation done: model ran 0.00s\n"
                              "  [  4.00s] #3 image-to-text failed: the model crashed\n"
                              "  [  4.00s] #4 object-detection skipped: its input #3 failed\n"
                              "  [  5.00s] #5  started\n")
    assert turn.failed == [3, 4] and turn.files == []


def test_events_the_cli_does_not_show_print_nothing():
    out = io.StringIO()
    show = progress_printer(out, Turn(), threading.Event())
    for name in ("answer", "replan", "results", "request_started", "task_queued"):
        show(name, {"t": 1, "id": 0, "task": "x", "tasks": []})
    assert out.getvalue() == ""


def test_generated_files_are_collected_once_each_and_only_public_outputs():
    turn = Turn()
    show = progress_printer(io.StringIO(), turn, threading.Event())
    show("task_finished", {"id": 0, "task": "a", "result": {
        "generated image": "/images/fox-1.png", "generated audio": "/audios/say_2.wav",
        "generated video": "/videos/clip.mp4", "text": "a fox", "count": 3, "boxes": ["/images/in-a-list.png"],
        "input": "/examples/red.png", "nested": "/images/sub/x.png", "relative": "images/y.png",
        "spaced": "/images/a b.png", "url": "http://host/images/z.png"}})
    show("task_finished", {"id": 1, "task": "b", "result": {"generated image": "/images/fox-1.png"}})  # again
    show("task_finished", {"id": 2, "task": "c", "result": {"generated image": "/images/fox-2.png"}})
    assert turn.files == ["/images/fox-1.png", "/audios/say_2.wav", "/videos/clip.mp4", "/images/fox-2.png"]


def test_a_muted_printer_prints_nothing_but_still_collects_files_and_failures():
    out, turn, muted = Screen(), Turn(), threading.Event()
    show = progress_printer(out, turn, muted)
    muted.set()
    show("plan", {"t": 0, "tasks": [{"id": 0, "task": "text-to-image"}]})
    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 1, "steps": 5})
    show("task_finished", {"id": 0, "task": "text-to-image", "result": {"generated image": "/images/a.png"}})
    show("task_failed", {"id": 1, "task": "image-to-text", "error": "x"})
    assert out.getvalue() == ""
    assert turn.files == ["/images/a.png"] and turn.failed == [1]


def test_each_line_is_flushed_as_it_is_written():
    out = Buffered()
    show = progress_printer(out, Turn(), threading.Event())
    show("task_started", {"t": 0, "id": 0, "task": "text-to-image"})
    assert out.shown == "  [  0.00s] #0 text-to-image started\n"


# -- progress_printer: the live progress lines on a terminal -----------------------------------------------------


def test_a_pipe_or_log_gets_no_progress_lines_and_no_escape_codes(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    show = progress_printer(out, Turn(), threading.Event())
    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 1, "steps": 25})
    show("task_finished", {"t": 1, "id": 0, "task": "text-to-image", "result": {}, "model_seconds": 1})
    assert out.getvalue() == "  [  1.00s] #0 text-to-image done: model ran 1.00s\n"


def test_each_running_task_has_one_line_rewritten_in_place_and_gone_when_it_ends(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = Screen()
    show = progress_printer(out, Turn(), threading.Event())
    seen = 0

    def new() -> str:
        nonlocal seen
        text, seen = out.getvalue()[seen:], len(out.getvalue())
        return text

    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 10, "steps": 25,
                           "fraction": 0.4, "eta": 3.2})
    assert new() == "  #0 text-to-image: step 10 of 25 · about 4 s left\n"  # nothing to take off yet
    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 11, "steps": 25,
                           "fraction": 0.44, "eta": 2.9})
    assert new() == "\x1b[1F\x1b[J  #0 text-to-image: step 11 of 25 · about 3 s left\n"  # up one line, clear, redraw
    show("task_progress", {"id": 1, "task": "text-to-speech", "phase": "loading"})
    assert new() == ("\x1b[1F\x1b[J  #0 text-to-image: step 11 of 25 · about 3 s left\n"
                     "  #1 text-to-speech: loading the model\n")
    show("task_started", {"t": 1, "id": 2, "task": "object-detection"})  # a line above both progress lines
    assert new() == ("\x1b[2F\x1b[J  [  1.00s] #2 object-detection started\n"
                     "  #0 text-to-image: step 11 of 25 · about 3 s left\n"
                     "  #1 text-to-speech: loading the model\n")
    show("task_finished", {"t": 2, "id": 0, "task": "text-to-image", "result": {}, "model_seconds": 1.5})
    assert new() == ("\x1b[2F\x1b[J  [  2.00s] #0 text-to-image done: model ran 1.50s\n"
                     "  #1 text-to-speech: loading the model\n")
    show("task_failed", {"t": 3, "id": 1, "task": "text-to-speech", "error": "out of memory"})
    assert new() == "\x1b[1F\x1b[J  [  3.00s] #1 text-to-speech failed: out of memory\n"
    show("plan", {"t": 4, "tasks": []})
    assert new() == "  [  4.00s] plan: \n"  # no progress line left: nothing to take off
    assert "40" not in out.getvalue() and "%" not in out.getvalue()  # the fraction is not shown, the steps are


def test_a_finished_task_s_line_is_taken_off_even_when_other_tasks_run_on(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = Screen()
    show = progress_printer(out, Turn(), threading.Event())
    show("task_progress", {"id": 0, "task": "a", "phase": "running"})
    show("task_progress", {"id": 1, "task": "b", "phase": "running"})
    show("task_progress", {"id": 2, "task": "c", "phase": "running"})
    mark = len(out.getvalue())
    show("task_finished", {"t": 1, "id": 1, "task": "b", "result": {}})
    assert out.getvalue()[mark:] == ("\x1b[3F\x1b[J  [  1.00s] #1 b done: model ran 0.00s\n"
                                     "  #0 a: running\n  #2 c: running\n")
    mark = len(out.getvalue())
    show("task_progress", {"id": 0, "task": "a", "phase": "running", "step": 1, "steps": 2})
    assert out.getvalue()[mark:] == "\x1b[2F\x1b[J  #0 a: step 1 of 2\n  #2 c: running\n"  # keeps its place


@pytest.mark.parametrize(("columns", "line"), [
    ("100", "  #0 text-to-image: step 10 of 25 · about 4 s left"),
    ("51", "  #0 text-to-image: step 10 of 25 · about 4 s left"),  # 50 characters: one column to spare
    ("50", "  #0 text-to-image: step 10 of 25 · about 4 s lef"),
    ("30", "  #0 text-to-image: step 10 o"),
    ("22", "  #0 text-to-image: s"),
    ("21", "  #0 text-to-image: "),  # 20 characters at least, however narrow the terminal
    ("5", "  #0 text-to-image: "),
])
def test_a_progress_line_is_cut_one_short_of_the_terminal_width(monkeypatch, columns, line):
    monkeypatch.setenv("COLUMNS", columns)
    out = Screen()
    show = progress_printer(out, Turn(), threading.Event())
    show("task_progress", {"id": 0, "task": "text-to-image", "phase": "running", "step": 10, "steps": 25, "eta": 3.2})
    show("task_failed", {"t": 1, "id": 9, "task": "summarization", "error": "a long error that is never cut short"})
    assert out.getvalue() == (f"{line}\n\x1b[1F\x1b[J  [  1.00s] #9 summarization failed: a long error that is "
                              f"never cut short\n{line}\n")


@pytest.mark.parametrize(("progress", "words"), [
    ({"phase": "running", "step": 1, "steps": 25, "eta": 0}, "step 1 of 25"),  # never "about 0 s left"
    ({"phase": "running", "step": 25, "steps": 25, "eta": 0}, "step 25 of 25 · finishing"),  # the steps, not the work
    ({"phase": "running", "step": 3, "steps": 3}, "step 3 of 3 · finishing"),
    ({"phase": "running", "step": 24, "steps": 25, "eta": 0.2}, "step 24 of 25 · about 1 s left"),
    ({"phase": "running", "step": 2, "steps": 25, "eta": 89.5}, "step 2 of 25 · about 90 s left"),
    ({"phase": "running", "step": 2, "steps": 25, "eta": 95}, "step 2 of 25 · about 2 min left"),
    ({"phase": "running", "step": 2, "steps": 25, "eta": 600}, "step 2 of 25 · about 10 min left"),
    ({"phase": "running", "fraction": 0.5}, "running"),
    ({"phase": "downloading", "bytes": 12_000_000, "total_bytes": 40_000_000}, "downloading 12.0 of 40.0 MB"),
    ({"phase": "downloading", "bytes": 5_050_000}, "downloading 5.0 MB"),
    ({"phase": "queued", "waiting": "another model is loading"}, "queued: another model is loading"),
    ({"phase": "loading", "eta": 12.1}, "loading the model · about 13 s left"),
])
def test_a_progress_line_says_where_the_task_is_in_words(monkeypatch, progress, words):
    monkeypatch.setenv("COLUMNS", "200")
    out = Screen()
    progress_printer(out, Turn(), threading.Event())("task_progress", {"id": 3, "task": "text-to-image", **progress})
    assert out.getvalue() == f"  #3 text-to-image: {words}\n"


def test_a_progress_event_without_a_task_name_still_gets_its_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = Screen()
    progress_printer(out, Turn(), threading.Event())("task_progress", {"id": 7, "phase": "queued"})
    assert out.getvalue() == "  #7 : queued\n"


def test_once_muted_nothing_more_is_drawn_or_taken_off(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out, muted = Screen(), threading.Event()
    show = progress_printer(out, Turn(), muted)
    show("task_progress", {"id": 0, "task": "a", "phase": "running"})
    muted.set()
    show("task_progress", {"id": 0, "task": "a", "phase": "running", "step": 1, "steps": 2})
    show("task_finished", {"t": 1, "id": 0, "task": "a", "result": {}})
    assert out.getvalue() == "  #0 a: running\n"


# -- answer_once ------------------------------------------------------------------------------------------------


def test_a_request_prints_its_pipeline_and_returns_the_answer_and_its_files(engine, llm):
    llm.on("parse_task", ONE_IMAGE)
    out = io.StringIO()
    turn = answer_once(engine, [{"role": "user", "content": "draw a fox"}], out)
    assert times_out(out.getvalue()) == ("  [T] plan: #0 text-to-image\n"
                                         f"  [T] #0 text-to-image: model {SD} (local), chosen in S\n"
                                         "  [T] #0 text-to-image started\n"
                                         "  [T] #0 text-to-image done: model ran S\n")
    assert turn.answer.startswith("ANSWER based on: ") and turn.failed == []
    assert len(turn.files) == 1 and re.fullmatch(r"/images/[\w.-]+\.png", turn.files[0])
    assert turn.files[0] in turn.answer


def test_a_chat_request_sends_the_whole_history_and_prints_nothing_when_nothing_runs(engine, llm):
    out = io.StringIO()
    history = [{"role": "user", "content": "draw a fox"},
               {"role": "assistant", "content": "Done.\nGenerated files: /images/fox.png"},
               {"role": "user", "content": "hello again"}]
    turn = answer_once(engine, history, out)
    assert turn.answer == "CHITCHAT: hello again" and turn.files == [] and turn.failed == []
    assert out.getvalue() == ""
    planned = json.dumps(llm.stage_requests("parse_task")[-1]["body"]["messages"])
    assert "Generated files: /images/fox.png" in planned and "draw a fox" in planned


def test_without_a_stream_nothing_is_printed_but_files_and_failures_are_collected(engine, llm, models, capsys):
    models.broken.add(SD)
    llm.on("parse_task", IMAGE_THEN_CAPTION)
    turn = answer_once(engine, [{"role": "user", "content": "draw a fox and say what it shows"}], None)
    assert turn.failed == [0, 1] and turn.files == []
    assert capsys.readouterr() == ("", "")
    models.broken.clear()
    llm.on("parse_task", ONE_IMAGE)
    turn = answer_once(engine, [{"role": "user", "content": "draw a fox"}], None)
    assert len(turn.files) == 1 and turn.failed == []
    assert capsys.readouterr() == ("", "")


def test_an_engine_error_reaches_the_caller(engine, llm):
    llm.failing_stages["chitchat"] = 400
    with pytest.raises(LLMError) as caught:
        answer_once(engine, [{"role": "user", "content": "hello"}], io.StringIO())
    assert str(caught.value) == "the configured LLM (local, model scripted) answered HTTP 400: scripted failure 400"


def test_the_request_runs_in_answer_mode_on_a_daemon_thread_named_for_it():
    stand_in = StandIn(answer="fine")
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
               {"role": "user", "content": "how are you?"}]
    turn = answer_once(stand_in, history, io.StringIO())
    assert turn.answer == "fine"
    request, thread = stand_in.requests[0], stand_in.threads[0]
    assert request.messages == history and stand_in.modes == ["answer"]
    assert thread is not threading.main_thread() and thread.daemon
    assert thread.name == f"cli-{request.request_id}"


def test_any_failure_of_the_worker_is_raised_in_the_caller_s_thread():
    with pytest.raises(ZeroDivisionError, match="division by zero"):
        answer_once(StandIn(error=ZeroDivisionError("division by zero")), [{"role": "user", "content": "x"}], None)


def test_ctrl_c_cancels_the_request_within_a_poll_and_mutes_what_it_says_later(sigint):
    out = io.StringIO()
    stand_in = StandIn(interrupt=True, events=[("task_started", {"t": 0, "id": 0, "task": "text-to-image"})],
                       after_cancel=[("task_finished", {"t": 1, "id": 0, "task": "text-to-image", "result": {}})])
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        answer_once(stand_in, [{"role": "user", "content": "draw a slow fox"}], out)
    assert time.monotonic() - started < 0.6  # the main thread looks every 0.1 s, not when the request ends
    assert stand_in.cancelled.is_set()
    stand_in.threads[0].join(5)
    assert out.getvalue() == "  [  0.00s] #0 text-to-image started\n"  # the late "done" line is not printed


def test_ctrl_c_before_the_request_has_its_state_still_ends_the_call(sigint):
    stand_in = StandIn(interrupt=True, ready=False)
    with pytest.raises(KeyboardInterrupt):
        answer_once(stand_in, [{"role": "user", "content": "x"}], None)
    assert not stand_in.cancelled.is_set()  # nothing to cancel yet
    stand_in.cancelled.set()  # let the worker end


def test_a_bad_message_is_refused_before_anything_runs():
    stand_in = StandIn()
    with pytest.raises(BadRequest, match=r"^the last message is empty: it must hold the request$"):
        answer_once(stand_in, [{"role": "user", "content": "  "}], None)
    assert stand_in.requests == []


# -- warm_up and llm_down ---------------------------------------------------------------------------------------


def test_a_ranker_still_to_load_is_announced_in_one_flushed_line_then_loaded():
    out, stand_in = Buffered(), StandIn(ranking="warming")
    stand_in.out = out
    warm_up(stand_in, out)
    assert out.shown == "loading the model ranker (all-MiniLM-L6-v2)...\n"
    assert stand_in.warmed == ["loading the model ranker (all-MiniLM-L6-v2)...\n"]  # said before the pause


@pytest.mark.parametrize("ranking", ["keyword", "semantic"])
def test_a_ranker_ready_or_not_needed_is_not_loaded_again(ranking):
    out, stand_in = io.StringIO(), StandIn(ranking=ranking)
    warm_up(stand_in, out)
    assert out.getvalue() == "" and stand_in.warmed == []


def test_the_real_keyword_engine_needs_no_warm_up(engine):
    out = io.StringIO()
    warm_up(engine, out)
    assert out.getvalue() == ""


def test_an_llm_that_answers_is_no_problem(engine):
    assert llm_down(engine) is None


def test_an_llm_that_is_down_is_named_with_where_to_fix_it(down):
    engine, port, path = down
    assert llm_down(engine) == (f"the LLM at http://127.0.0.1:{port}/v1 is unreachable (connection refused: nothing "
                                f"listens there); start it, or fix the LLM settings in {path}")


def test_an_engine_without_a_config_is_not_checked():
    assert llm_down(StandIn()) is None


# -- run_text ---------------------------------------------------------------------------------------------------


def test_text_mode_prints_the_answer_on_stdout_and_exits_0(engine, capsys):
    assert run_text(engine, "hello") == 0
    assert capsys.readouterr() == ("CHITCHAT: hello\n", "")


def test_text_mode_shows_progress_on_stderr(engine, llm, capsys):
    llm.on("parse_task", ONE_IMAGE)
    assert run_text(engine, "draw a fox") == 0
    out, err = capsys.readouterr()
    assert times_out(err) == ("  [T] plan: #0 text-to-image\n"
                              f"  [T] #0 text-to-image: model {SD} (local), chosen in S\n"
                              "  [T] #0 text-to-image started\n"
                              "  [T] #0 text-to-image done: model ran S\n")
    assert out.startswith("ANSWER based on: ") and out.endswith("\n") and "/images/" in out


def test_text_mode_without_progress_prints_only_the_answer(engine, llm, capsys):
    llm.on("parse_task", ONE_IMAGE)
    assert run_text(engine, "draw a fox", progress=False) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("ANSWER based on: ")


def test_text_mode_renders_the_answer_s_markdown_without_colours_on_a_pipe(engine, llm, capsys, color):
    llm.on("chitchat", "## Fox\n**Quick** and `brown`, see [docs](http://example.org/fox).\n- one\n- two")
    assert run_text(engine, "tell me about foxes") == 0
    assert capsys.readouterr() == ("Fox\nQuick and brown, see docs (http://example.org/fox).\n  • one\n  • two\n", "")


def test_text_mode_styles_the_answer_when_stdout_is_a_terminal(monkeypatch, color, capsys):
    screen = Screen()
    monkeypatch.setattr(sys, "stdout", screen)
    assert run_text(StandIn(answer="# Fox\n**quick**"), "tell me", progress=False) == 0
    assert screen.getvalue() == "\x1b[1mFox\x1b[0m\n\x1b[1mquick\x1b[0m\n"


def test_text_mode_exits_1_naming_the_failed_and_skipped_tasks_after_the_answer(engine, llm, models, capsys):
    models.broken.add(SD)
    llm.on("parse_task", IMAGE_THEN_CAPTION)
    assert run_text(engine, "draw a fox and say what it shows") == 1
    out, err = capsys.readouterr()
    assert out.startswith("ANSWER based on: ")  # the answer still explains what happened
    lines = times_out(err).splitlines()
    assert lines[0] == "  [T] plan: #0 text-to-image, #1 image-to-text"
    assert lines[-1] == "error: 2 task(s) failed: #0, #1"
    assert any(line.startswith("  [T] #0 text-to-image failed: every candidate failed: ") for line in lines)
    assert any(line.startswith("  [T] #1 image-to-text skipped: ") for line in lines)


def test_text_mode_lists_failed_tasks_in_order_each_once(capsys):
    events = [("task_failed", {"t": 1, "id": 3, "task": "a", "error": "x"}),
              ("task_failed", {"t": 2, "id": 1, "task": "b", "error": "y"})]
    assert run_text(StandIn(answer="partly done", events=events), "do it", progress=False) == 1
    assert capsys.readouterr() == ("partly done\n", "error: 2 task(s) failed: #1, #3\n")


def test_text_mode_with_the_llm_down_says_so_in_one_line_before_loading_anything(down, capsys):
    engine, port, path = down
    assert run_text(engine, "hello") == 1
    assert capsys.readouterr() == ("", f"error: the LLM at http://127.0.0.1:{port}/v1 is unreachable (connection "
                                       f"refused: nothing listens there); start it, or fix the LLM settings in {path}\n")


def test_text_mode_reports_an_llm_error_in_one_line_and_exits_1(engine, llm, capsys):
    llm.failing_stages["chitchat"] = 400
    assert run_text(engine, "hello") == 1
    assert capsys.readouterr() == ("", "error: the configured LLM (local, model scripted) answered HTTP 400: "
                                       "scripted failure 400\n")


def test_text_mode_says_when_it_loads_the_ranker_and_only_with_progress_on(capsys):
    stand_in = StandIn(answer="hi", ranking="warming")
    assert run_text(stand_in, "hello") == 0
    assert capsys.readouterr() == ("hi\n", "loading the model ranker (all-MiniLM-L6-v2)...\n")
    assert len(stand_in.warmed) == 1
    quiet = StandIn(answer="hi", ranking="warming")
    assert run_text(quiet, "hello", progress=False) == 0
    assert capsys.readouterr() == ("hi\n", "") and quiet.warmed == []


def test_ctrl_c_in_text_mode_cancels_and_exits_130(sigint, capsys):
    stand_in = StandIn(interrupt=True)
    assert run_text(stand_in, "draw a slow fox") == 130
    assert stand_in.cancelled.is_set()
    assert capsys.readouterr() == ("", "\ncancelled\n")


# -- run_cli: what starts and ends a session ---------------------------------------------------------------------


def test_end_of_input_at_the_prompt_says_bye_on_a_new_line(engine):
    out = io.StringIO()
    assert run_cli(engine, Keyboard([]), out) == 0
    assert out.getvalue() == WELCOME + "[ User ]: \nbye\n"


@pytest.mark.parametrize("word", ["exit\n", "quit\n", "EXIT\n", "  Quit  \n", "exit"])
def test_exit_or_quit_ends_the_session_and_nothing_after_it_is_read(engine, llm, word):
    out, keys = io.StringIO(), Keyboard([word, "hello\n"])
    assert run_cli(engine, keys, out) == 0
    assert out.getvalue() == WELCOME + "[ User ]: bye\n"
    assert keys.read == 1 and llm.requests == []


def test_ctrl_c_at_the_prompt_ends_the_session(engine):
    out = io.StringIO()
    assert run_cli(engine, Keyboard([KeyboardInterrupt]), out) == 0
    assert out.getvalue() == WELCOME + "[ User ]: \nbye\n"


def test_empty_lines_just_ask_again(engine, llm):
    out = io.StringIO()
    assert run_cli(engine, Keyboard(["\n", "   \n", "\t\n", "exit\n"]), out) == 0
    assert out.getvalue() == WELCOME + "[ User ]: " * 4 + "bye\n"
    assert llm.requests == []


def test_the_prompt_is_on_screen_before_input_is_read():
    out = Buffered()
    shown_when_read: list[str] = []
    keys = Keyboard(["hi\n", "exit\n"], before={0: lambda: shown_when_read.append(out.shown),
                                                 1: lambda: shown_when_read.append(out.shown)})
    run_cli(StandIn(answer="hello"), keys, out)
    assert shown_when_read == [WELCOME + "[ User ]: ", WELCOME + "[ User ]: [ Jarvis ]: hello\n[ User ]: "]


def test_an_llm_that_is_down_is_a_warning_and_the_prompt_still_comes(down):
    engine, port, path = down
    out = io.StringIO()
    assert run_cli(engine, Keyboard([]), out) == 0
    assert out.getvalue() == (WELCOME + f"warning: the LLM at http://127.0.0.1:{port}/v1 is unreachable (connection "
                                        f"refused: nothing listens there); start it, or fix the LLM settings in {path}\n"
                                        "[ User ]: \nbye\n")


def test_the_welcome_is_on_screen_while_the_llm_is_checked():
    out, shown_when_checked = Buffered(), []

    class Checked(StandIn):
        """Notes what the screen shows when the CLI looks up the engine's config to check its LLM (up to 3 s)."""

        @property
        def config(self):
            shown_when_checked.append(out.shown)
            return None

    run_cli(Checked(), Keyboard([]), out)
    assert shown_when_checked == [WELCOME]


def test_the_ranker_is_loaded_after_the_welcome_and_before_the_first_prompt():
    out, stand_in = io.StringIO(), StandIn(ranking="warming")
    stand_in.out = out
    assert run_cli(stand_in, Keyboard([]), out) == 0
    assert out.getvalue() == WELCOME + "loading the model ranker (all-MiniLM-L6-v2)...\n[ User ]: \nbye\n"
    assert stand_in.warmed == [WELCOME + "loading the model ranker (all-MiniLM-L6-v2)...\n"]


# -- run_cli: turns ------------------------------------------------------------------------------------------------


def test_a_chat_turn_prints_the_answer_after_jarvis(engine, llm):
    out = io.StringIO()
    assert run_cli(engine, Keyboard(["  hello there  \n", "exit\n"]), out) == 0
    assert out.getvalue() == WELCOME + "[ User ]: [ Jarvis ]: CHITCHAT: hello there\n[ User ]: bye\n"


def test_a_task_turn_shows_its_progress_then_the_answer_and_keeps_the_files_for_the_next_turn(engine, llm):
    llm.on("parse_task", ONE_IMAGE, contains="draw a fox", times=1)
    out = io.StringIO()
    assert run_cli(engine, Keyboard(["draw a fox\n", "make it bigger\n", "exit\n"]), out) == 0
    text = times_out(out.getvalue())
    first = text.index("[ User ]: ") + len("[ User ]: ")
    assert text[first:].startswith("  [T] plan: #0 text-to-image\n"
                                   f"  [T] #0 text-to-image: model {SD} (local), chosen in S\n"
                                   "  [T] #0 text-to-image started\n"
                                   "  [T] #0 text-to-image done: model ran S\n"
                                   "[ Jarvis ]: ANSWER based on: ")
    assert text.endswith("[ User ]: [ Jarvis ]: CHITCHAT: make it bigger\n[ User ]: bye\n")
    second = llm.stage_requests("parse_task")[-1]["body"]["messages"]
    assert re.search(r"Generated files: /images/[\w.-]+\.png", json.dumps(second))  # "it" can be found


def test_the_history_holds_each_question_and_answer_with_its_files():
    stand_in = StandIn(answer="Here it is.", events=[
        ("task_finished", {"t": 1, "id": 0, "task": "text-to-image", "result": {"generated image": "/images/f.png"}})])
    run_cli(stand_in, Keyboard(["draw a fox\n", "bigger\n", "exit\n"]), io.StringIO())
    assert stand_in.requests[0].messages == [{"role": "user", "content": "draw a fox"}]
    assert stand_in.requests[1].messages == [
        {"role": "user", "content": "draw a fox"},
        {"role": "assistant", "content": "Here it is.\nGenerated files: /images/f.png"},
        {"role": "user", "content": "bigger"}]


def test_a_long_session_keeps_its_newest_turns_and_never_outgrows_a_request():
    """A request carries at most 200 messages: after 99 turns the oldest go, so turn 150 is answered like the
    first (it used to fail from turn 101 on, `messages` has 201 items, until the CLI was restarted)."""
    stand_in = StandIn(answer="fine")
    out = io.StringIO()
    run_cli(stand_in, Keyboard([f"question {n}\n" for n in range(1, 151)] + ["exit\n"]), out)
    assert "sorry" not in out.getvalue() and out.getvalue().count("[ Jarvis ]: fine") == 150
    assert [len(r.messages) for r in stand_in.requests[98:101]] == [197, 199, 199]
    last = stand_in.requests[-1].messages
    assert last[0] == {"role": "user", "content": "question 51"} and last[-1]["content"] == "question 150"
    assert [m["role"] for m in last] == ["user", "assistant"] * 99 + ["user"]


def test_a_long_answer_is_cut_in_history_to_a_message_a_request_may_carry():
    long = Turn(answer="x" * 150_000, files=["/images/a.png"])
    entry = long.history_entry()
    assert len(entry) == 100_000 and entry.endswith("x\nGenerated files: /images/a.png")
    assert Turn(answer="y" * 150_000).history_entry() == "y" * 100_000
    stand_in = StandIn(answer="z" * 120_000)
    out = io.StringIO()
    run_cli(stand_in, Keyboard(["first\n", "second\n", "exit\n"]), out)
    assert "sorry" not in out.getvalue() and len(stand_in.requests) == 2


def test_a_peers_line_breaks_and_escapes_stay_on_one_line(monkeypatch):
    """An error a models server or provider wrote, and a progress event's `waiting`, are shown on one line: a
    line break or an escape sequence in them would throw the live lines' count off or move the cursor."""
    monkeypatch.setenv("COLUMNS", "100")
    screen, turn = Screen(), Turn()
    show = progress_printer(screen, turn, threading.Event())
    show("task_failed", {"t": 1.0, "id": 0, "task": "asr", "error": "bad\naudio\x1b[2J"})
    assert screen.getvalue() == "  [  1.00s] #0 asr failed: bad audio [2J\n"


def test_a_failed_turn_says_why_and_leaves_no_trace_in_the_history(engine, llm):
    llm.failing_stages["chitchat"] = 400
    out = io.StringIO()
    keys = Keyboard(["hello\n", "again\n", "exit\n"], before={1: llm.failing_stages.clear})
    assert run_cli(engine, keys, out) == 0
    assert out.getvalue() == (WELCOME + "[ User ]: [ Jarvis ]: sorry, that failed: the configured LLM (local, model "
                                        "scripted) answered HTTP 400: scripted failure 400\n"
                                        "[ User ]: [ Jarvis ]: CHITCHAT: again\n[ User ]: bye\n")
    answered = [r for r in llm.requests if r["stage"] == "chitchat"][-1]
    assert "hello" not in json.dumps(answered["body"]["messages"])


@pytest.mark.parametrize(("line", "why"), [
    ("\udcff\udcfe\n", "messages[0].content contains invalid Unicode (a lone surrogate at position 0)"),
    ("x" * 100_001 + "\n", "messages[0].content is longer than 100000 characters"),
])
def test_input_the_request_cannot_carry_is_refused_and_the_session_goes_on(engine, llm, line, why):
    out = io.StringIO()
    assert run_cli(engine, Keyboard([line, "hello\n", "exit\n"]), out) == 0
    assert out.getvalue() == (WELCOME + f"[ User ]: [ Jarvis ]: sorry, that failed: {why}\n"
                                        "[ User ]: [ Jarvis ]: CHITCHAT: hello\n[ User ]: bye\n")
    assert [m["content"] for m in llm.stage_requests("chitchat")[-1]["body"]["messages"]][-1] == "hello"


def test_ctrl_c_during_a_turn_cancels_it_and_the_next_turn_forgets_it(sigint):
    stand_in = StandIn(answer="fresh start", interrupt=True)
    out = io.StringIO()
    assert run_cli(stand_in, Keyboard(["draw a slow fox\n", "hello\n", "exit\n"]), out) == 0
    assert stand_in.cancelled.is_set()
    assert out.getvalue() == WELCOME + "[ User ]: \n(cancelled)\n[ User ]: [ Jarvis ]: fresh start\n[ User ]: bye\n"
    assert stand_in.requests[1].messages == [{"role": "user", "content": "hello"}]


def test_the_answer_is_styled_on_a_terminal_and_plain_elsewhere(color, monkeypatch):
    screen = Screen()
    run_cli(StandIn(answer="**Done** and *fast*"), Keyboard(["go\n", "exit\n"]), screen)
    assert "[ Jarvis ]: \x1b[1mDone\x1b[0m and \x1b[3mfast\x1b[0m\n" in screen.getvalue()
    pipe = io.StringIO()
    run_cli(StandIn(answer="**Done** and *fast*"), Keyboard(["go\n", "exit\n"]), pipe)
    assert "[ Jarvis ]: Done and fast\n" in pipe.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    screen = Screen()
    run_cli(StandIn(answer="**Done** and *fast*"), Keyboard(["go\n", "exit\n"]), screen)
    assert "[ Jarvis ]: Done and fast\n" in screen.getvalue()


def test_started_at_a_terminal_with_ctrl_c_ignored_the_cli_takes_it_back():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's background job starts it
    try:
        run_cli(StandIn(), Keyboard([], tty=True), io.StringIO())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        run_cli(StandIn(), Keyboard([], tty=False), io.StringIO())  # no person to press it: left as it is
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN

        def own(signum, frame):
            pass

        signal.signal(signal.SIGINT, own)
        run_cli(StandIn(), Keyboard([], tty=True), io.StringIO())  # a handler of the caller's own: kept
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)


# -- render_markdown ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("markdown", "shown"), [
    ("plain text", "plain text"),
    ("", ""),
    ("# Title", "Title"),
    ("###### Six deep", "Six deep"),
    ("   ## Indented three", "Indented three"),
    ("    # four spaces is not a heading", "    # four spaces is not a heading"),
    ("####### seven is not a heading", "####### seven is not a heading"),
    ("#hashtag", "#hashtag"),
    ("- first", "  • first"),
    ("* second", "  • second"),
    ("+ third", "  • third"),
    ("  - nested", "    • nested"),
    ("-not an item", "-not an item"),
    ("---", "─" * 20),
    ("***", "─" * 20),
    ("___", "─" * 20),
    ("  -----  ", "─" * 20),
    ("--", "--"),
    ("-*-", "-*-"),
    ("**bold** and __bold__", "bold and bold"),
    ("*it* and _it_", "it and it"),
    ("snake_case_name and 2*3*4", "snake_case_name and 2*3*4"),
    ("a * b * c", "a * b * c"),
    ("use `pip install` now", "use pip install now"),
    ("see [the docs](http://example.org/a_b) now", "see the docs (http://example.org/a_b) now"),
    ("[not a link] (x)", "[not a link] (x)"),
    ("- **bold** item with `code`", "  • bold item with code"),
    ("## A **bold** heading", "A bold heading"),
    ("```python\nx = **1**\n# not a heading\n```\nafter", "    x = **1**\n    # not a heading\nafter"),
    ("```\nunclosed\n- stays", "    unclosed\n    - stays"),
    ("one\n\ntwo", "one\n\ntwo"),
])
def test_markdown_reads_as_plain_text_off_a_terminal(markdown, shown):
    assert render_markdown(markdown) == shown
    assert render_markdown(markdown, color=False) == shown


def test_control_characters_from_the_llm_are_dropped_but_tabs_and_newlines_kept(color):
    text = "\x1b[31mred\x1b[0m\a\x00\x08\x7f\x9b2J\r\x0b\x0c\x1f end\tof\nline"
    assert render_markdown(text) == "[31mred[0m2J end\tof\nline"
    assert render_markdown("\x1b]0;title\x07**b**", color=True) == "]0;title\x1b[1mb\x1b[0m"


@pytest.mark.parametrize(("markdown", "shown"), [
    ("**bold**", "\x1b[1mbold\x1b[0m"),
    ("__bold__", "\x1b[1mbold\x1b[0m"),
    ("*it*", "\x1b[3mit\x1b[0m"),
    ("_it_", "\x1b[3mit\x1b[0m"),
    ("`code`", "\x1b[2mcode\x1b[0m"),
    ("# Title", "\x1b[1mTitle\x1b[0m"),
    ("- **b** item", "  • \x1b[1mb\x1b[0m item"),
    ("[docs](http://x.org)", "docs (http://x.org)"),
    ("```\n**raw**\n```", "    **raw**"),
])
def test_markdown_is_styled_on_a_terminal(color, markdown, shown):
    assert render_markdown(markdown, color=True) == shown


def test_no_color_turns_the_styles_off(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert render_markdown("# Title\n**bold** *it* `code`", color=True) == "Title\nbold it code"
    monkeypatch.setenv("NO_COLOR", "")  # set but empty: colours stay (https://no-color.org)
    assert render_markdown("**bold**", color=True) == "\x1b[1mbold\x1b[0m"
