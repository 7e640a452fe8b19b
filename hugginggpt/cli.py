"""Terminal front ends: an interactive chat with history (`--mode cli`) and one-shot (`--mode text`).

The request runs on a worker thread so that Ctrl-C reaches the terminal at once: it cancels the request
(its scheduler included) and mutes its progress lines, and the prompt comes back clean.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, TextIO

from .chat import ChatRequest, HuggingGPT, RequestState
from .errors import HuggingGPTError

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
        """The assistant message kept in history; names the files, as the web app does, for follow-ups."""
        if not self.files:
            return self.answer
        return self.answer + "\nGenerated files: " + ", ".join(self.files)


def progress_printer(out: TextIO, turn: Turn, muted: threading.Event):
    """Turn pipeline events into short progress lines; model time and selection time are shown apart."""

    def say(text: str) -> None:
        if not muted.is_set():
            print(text, file=out, flush=True)

    def show(name: str, e: dict[str, Any]) -> None:
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


def run_text(engine: HuggingGPT, text: str, progress: bool = True) -> int:
    """0 when every task succeeded; 1 when the request or one of its tasks failed (the answer is still printed)."""
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
    print(turn.answer)
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
        print(f"[ Jarvis ]: {turn.answer}", file=out, flush=True)
