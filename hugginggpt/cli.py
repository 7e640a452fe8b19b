"""Terminal front ends: an interactive chat with history (`--mode cli`) and one-shot (`--mode text`)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .chat import ChatRequest, HuggingGPT
from .errors import HuggingGPTError


def progress_printer(out: TextIO):
    """Turn pipeline events into short progress lines."""

    def show(name: str, e: dict[str, Any]) -> None:
        t = f"{e.get('t', 0):6.2f}s"
        if name == "plan":
            steps = ", ".join(f"#{x['id']} {x['task']}" for x in e["tasks"])
            print(f"  [{t}] plan: {steps}", file=out, flush=True)
        elif name == "model_selected":
            print(f"  [{t}] #{e['id']} {e['task']}: model {e.get('model') or '-'}"
                  f" ({e.get('hosted_on') or e.get('error')})", file=out, flush=True)
        elif name == "task_started":
            print(f"  [{t}] #{e['id']} {e.get('task', '')} started", file=out, flush=True)
        elif name == "task_finished":
            print(f"  [{t}] #{e['id']} {e.get('task', '')} done in {e.get('seconds', 0):.2f}s", file=out, flush=True)
        elif name == "task_failed":
            print(f"  [{t}] #{e['id']} {e.get('task', '')} failed: {e.get('error')}", file=out, flush=True)

    return show


def answer_once(engine: HuggingGPT, messages: list[dict[str, str]], out: TextIO | None) -> str:
    request = ChatRequest.from_body({"messages": messages})
    result = engine.run(request, "answer", on_event=progress_printer(out) if out else None)
    return result["message"]


def run_text(engine: HuggingGPT, text: str, progress: bool = True) -> int:
    try:
        print(answer_once(engine, [{"role": "user", "content": text}], sys.stderr if progress else None))
        return 0
    except HuggingGPTError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def run_cli(engine: HuggingGPT, stdin: TextIO = sys.stdin, out: TextIO = sys.stdout) -> int:
    print("Welcome to HuggingGPT. Ask for anything; type `exit` to quit.", file=out, flush=True)
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
            answer = answer_once(engine, messages, out)
        except HuggingGPTError as exc:
            messages.pop()
            print(f"[ Jarvis ]: sorry, that failed: {exc}", file=out, flush=True)
            continue
        except KeyboardInterrupt:
            messages.pop()
            print("\n(interrupted)", file=out, flush=True)
            continue
        messages.append({"role": "assistant", "content": answer})
        print(f"[ Jarvis ]: {answer}", file=out, flush=True)
