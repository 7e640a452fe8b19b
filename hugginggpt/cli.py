"""Terminal front ends: an interactive chat with history (`--mode cli`) and one-shot (`--mode text`).

The request runs on a worker thread so that Ctrl-C reaches the terminal at once: it cancels the request
(its scheduler included) and mutes its progress lines, and the prompt comes back clean.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, TextIO

from . import taskprogress
from .chat import ChatRequest, HuggingGPT, RequestState
from .errors import HuggingGPTError
from .request import MAX_CONTENT_CHARS, MAX_MESSAGES
from .textsafe import one_line

FILE_RE = re.compile(r"^/(images|audios|videos)/[\w.-]+$")


def quiet_libraries() -> None:
    """No progress bars or library warnings between our progress lines (`--verbose` keeps them)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    try:
        import urllib3

        urllib3.disable_warnings()
    except ImportError:  # pragma: no cover
        pass


@dataclass
class Turn:
    """What one request produced, for the terminal and for the next turn's history."""

    answer: str = ""
    files: list[str] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)

    def history_entry(self) -> str:
        """The assistant message kept in history; names the files, as the web app does, for follow-ups. A long
        answer is cut so that the entry stays a message a request may carry (MAX_CONTENT_CHARS)."""
        files = "\nGenerated files: " + ", ".join(self.files) if self.files else ""
        return self.answer[:max(0, MAX_CONTENT_CHARS - len(files))] + files


def progress_printer(out: TextIO, turn: Turn, muted: threading.Event):
    """Turn pipeline events into short progress lines; model time and selection time are shown apart.

    Events come from several threads: each line is written whole, under a lock, so two never share a line.

    On a terminal, each running task whose model reports progress has one line below the others, rewritten in
    place (`#0 text-to-image: step 10 of 25 · about 4 s left`) and gone when the task ends; elsewhere (a pipe,
    a log) progress is not printed."""
    lock = threading.Lock()
    live: dict[int, str] = {}  # task id -> its progress line, drawn below the other lines
    drawn = [0]  # progress lines on the screen now
    tty = out.isatty()

    def redraw(text: str | None = None) -> None:
        """Under `lock`: take the progress lines off the screen, print `text` (if any), draw them again."""
        if muted.is_set():
            return
        if drawn[0]:
            out.write(f"\x1b[{drawn[0]}F\x1b[J")  # to the start of the first progress line; clear below
        if text is not None:
            out.write(text + "\n")
        width = max(20, shutil.get_terminal_size().columns - 1)  # a wrapped line would throw the count off
        for line in live.values():
            out.write(line[:width] + "\n")
        drawn[0] = len(live)
        out.flush()

    def say(text: str) -> None:
        with lock:
            redraw(one_line(text))  # a peer's words (an error, a model name) never move the cursor

    def show(name: str, e: dict[str, Any]) -> None:
        if name == "task_progress":
            if tty:
                with lock:
                    live[e["id"]] = f"  #{e['id']} {e.get('task', '')}: {taskprogress.describe(e)}"
                    redraw()
            return
        if name in ("task_finished", "task_failed"):
            with lock:
                live.pop(e.get("id"), None)
        t = f"{e.get('t', 0):6.2f}s"
        if name == "plan":
            steps = ", ".join(f"#{x['id']} {x['task']}" for x in e["tasks"])
            say(f"  [{t}] plan: {steps}")
        elif name == "model_selected":
            chosen = f"model {e['model']} ({e.get('hosted_on')})" if e.get("model") else f"no model: {e.get('error')}"
            say(f"  [{t}] #{e['id']} {e['task']}: {chosen}, chosen in {e.get('seconds', 0):.2f}s")
        elif name == "task_started":
            say(f"  [{t}] #{e['id']} {e.get('task', '')} started")
        elif name == "task_finished":
            for value in (e.get("result") or {}).values():
                if isinstance(value, str) and FILE_RE.match(value) and value not in turn.files:
                    turn.files.append(value)
            seconds = e.get("model_seconds", e.get("seconds", 0))
            say(f"  [{t}] #{e['id']} {e.get('task', '')} done: model ran {seconds:.2f}s")
        elif name == "task_failed":
            turn.failed.append(e["id"])
            say(f"  [{t}] #{e['id']} {e.get('task', '')} {'skipped' if e.get('skipped') else 'failed'}: "
                f"{e.get('error')}")

    return show


def answer_once(engine: HuggingGPT, messages: list[dict[str, str]], out: TextIO | None) -> Turn:
    """Run one request; Ctrl-C (KeyboardInterrupt) cancels it before it is re-raised."""
    request = ChatRequest.from_body({"messages": messages})
    turn, muted = Turn(), threading.Event()
    if out is None:  # still collect files and failures, print nothing
        muted.set()
    holder: dict[str, Any] = {}
    printer = progress_printer(out or sys.stderr, turn, muted)

    def work() -> None:
        try:
            holder["result"] = engine.run(request, "answer", on_event=printer,
                                          state_ready=lambda s: holder.setdefault("state", s))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            holder["error"] = exc

    worker = threading.Thread(target=work, name=f"cli-{request.request_id}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            # Timed: SIGINT may be delivered to any thread, and a main thread blocked in an untimed join
            # would only run Python's handler once the request had finished.
            worker.join(0.1)
    except KeyboardInterrupt:
        muted.set()
        state: RequestState | None = holder.get("state")
        if state is not None:
            state.cancel()
        raise
    if "error" in holder:
        raise holder["error"]
    turn.answer = holder["result"]["message"]
    return turn


def warm_up(engine: HuggingGPT, out: TextIO) -> None:
    """Load the model ranker before the first request, saying so in one line, instead of a silent pause."""
    if engine.ranking == "warming":
        print("loading the model ranker (all-MiniLM-L6-v2)...", file=out, flush=True)
        engine.warm()


def llm_down(engine: HuggingGPT) -> str | None:
    """One line when the configured LLM cannot be reached, before anything slow (the ranker) is loaded."""
    from .checks import llm_problem

    config = getattr(engine, "config", None)
    if config is None:
        return None
    problem = llm_problem(config.llm, config.proxy)
    return f"{problem}; start it, or fix the LLM settings in {config.path}" if problem else None


def run_text(engine: HuggingGPT, text: str, progress: bool = True) -> int:
    """0 when every task succeeded; 1 when the request or one of its tasks failed (the answer is still printed)."""
    down = llm_down(engine)
    if down:
        print(f"error: {down}", file=sys.stderr)
        return 1
    try:
        if progress:
            warm_up(engine, sys.stderr)
        turn = answer_once(engine, [{"role": "user", "content": text}], sys.stderr if progress else None)
    except HuggingGPTError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ncancelled", file=sys.stderr)
        return 130
    print(render_markdown(turn.answer, color=sys.stdout.isatty()))
    if turn.failed:
        print(f"error: {len(turn.failed)} task(s) failed: " + ", ".join(f"#{t}" for t in sorted(set(turn.failed))),
              file=sys.stderr)
        return 1
    return 0


def run_cli(engine: HuggingGPT, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    if stdin.isatty() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started in the background of a script, which ignores SIGINT (and Python keeps that); a person at
        # this terminal still expects Ctrl-C to cancel the running request.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    print("Welcome to HuggingGPT. Ask for anything; type `exit` to quit, Ctrl-C cancels a running request.",
          file=out, flush=True)
    down = llm_down(engine)
    if down:  # not fatal here: it may be started while the prompt waits
        print(f"warning: {down}", file=out, flush=True)
    warm_up(engine, out)
    messages: list[dict[str, str]] = []
    while True:
        print("[ User ]: ", end="", file=out, flush=True)
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            print("\nbye", file=out)
            return 0
        if not line:  # Ctrl-D
            print("\nbye", file=out)
            return 0
        text = line.strip()
        if not text:
            continue
        if text.lower() in ("exit", "quit"):
            print("bye", file=out)
            return 0
        messages.append({"role": "user", "content": text})
        try:
            turn = answer_once(engine, messages, out)
        except HuggingGPTError as exc:
            messages.pop()
            print(f"[ Jarvis ]: sorry, that failed: {exc}", file=out, flush=True)
            continue
        except KeyboardInterrupt:
            messages.pop()
            print("\n(cancelled)", file=out, flush=True)
            continue
        messages.append({"role": "assistant", "content": turn.history_entry()})
        del messages[:-(MAX_MESSAGES - 2)]  # the oldest turns go: the next question still makes a request
        print(f"[ Jarvis ]: {render_markdown(turn.answer, color=out.isatty())}", file=out, flush=True)


BOLD, ITALIC, DIM, RESET = "\x1b[1m", "\x1b[3m", "\x1b[2m", "\x1b[0m"


def render_markdown(text: str, color: bool = False) -> str:
    """The answer's Markdown as a terminal shows it: no `**`, `#` or backticks left; bold and italics as
    terminal styles when `color` (a terminal that does not set NO_COLOR), list items as bullets, links as
    "text (url)", code blocks indented. The LLM's control characters are dropped (no escape sequences)."""
    color = color and not os.environ.get("NO_COLOR")
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f\x9b]", "", text)  # ESC included: only our own styles

    def style(code: str, inner: str) -> str:
        return f"{code}{inner}{RESET}" if color else inner

    def inline(line: str) -> str:
        line = re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r"\1 (\2)", line)
        line = re.sub(r"\*\*([^*]+)\*\*|__([^_]+)__", lambda m: style(BOLD, m.group(1) or m.group(2)), line)
        line = re.sub(r"(?<![\w*])\*([^*\s][^*]*)\*(?!\w)|(?<!\w)_([^_\s][^_]*)_(?!\w)",
                      lambda m: style(ITALIC, m.group(1) or m.group(2)), line)
        return re.sub(r"`([^`]+)`", lambda m: style(DIM, m.group(1)) if color else m.group(1), line)

    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            out.append("    " + line)
            continue
        head = re.match(r"^\s{0,3}#{1,6}\s+(.*)$", line)
        item = re.match(r"^(\s*)[-*+]\s+(.*)$", line)
        if head:
            out.append(style(BOLD, inline(head.group(1))))
        elif item:
            out.append(f"{item.group(1)}  • {inline(item.group(2))}")
        elif re.match(r"^\s*([-*_])(\s*\1){2,}\s*$", line):
            out.append("─" * 20)
        else:
            out.append(inline(line))
    return "\n".join(out)
