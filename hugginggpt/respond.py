"""Stage 4: the final answer from the execution log.

The LLM writes it; when the request's deadline leaves no time for that, the answer is put together
from the results themselves, so what finished is never lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .answercheck import check_answer
from .backends.normalize import FILE_KEYS
from .errors import DeadlineExceeded
from .llm import DeadlineLLM, stage_cap
from .prompts import PromptSet
from .request import RequestState

Emit = Callable[[str, dict[str, Any]], None]


def answer(state: RequestState, prompts: PromptSet, results: dict[int, dict[str, Any]], max_replans: int) -> str:
    """The request's final answer, with a line for each replan and for what still failed after them."""
    notes = list(state.replans)
    if state.replan_attempts and any("error" in r["inference result"] for r in results.values()):
        notes.append(f"Some tasks still failed after {state.replan_attempts} replan attempt(s) "
                     f"(max_replans: {max_replans}); their errors are above.")
    return write_answer(state.llm, prompts, state.request.user_input, results, state.timeout,
                        state.emit if state.on_event else None, notes)


def write_answer(llm: DeadlineLLM, prompts: PromptSet, user_input: str, results: dict[int, dict[str, Any]],
                 timeout: float, emit: Emit | None = None, notes: list[str] | None = None) -> str:
    """notes: lines the answer must carry whatever the LLM writes (e.g. what was replanned)."""
    processes = [results[k] for k in sorted(results)]
    messages = prompts.response_results(user_input, processes)
    on_token = (lambda piece: emit("answer_token", {"text": piece})) if emit else None
    try:
        message = check_answer(llm.chat(messages, on_token=on_token,
                                        max_tokens=stage_cap(llm, "answer")).strip(), results)
    except DeadlineExceeded:
        message = deadline_answer(results, timeout)
    if notes:
        message += "\n\n" + "\n".join(notes)
    if emit:
        emit("answer", {"message": message})
    return message


def deadline_answer(results: dict[int, dict[str, Any]], timeout: float) -> str:
    """A plain answer listing each task's outcome, for when the LLM has no time left to write one."""
    lines = [f"The request reached its {timeout:g} s deadline before the answer could be written. "
             "Here is what each task produced:"]
    for tid in sorted(results):
        record = results[tid]
        task = record.get("task", {})
        inference = record.get("inference result") or {}
        choose = record.get("choose model result")
        model = choose.get("id") if isinstance(choose, dict) else None
        head = f"- task {tid} ({task.get('task', '?')}{', ' + model if model else ''}): "
        if "error" in inference:
            err = inference["error"]
            lines.append(head + "failed: " + str(err.get("message", err) if isinstance(err, dict) else err))
            continue
        parts = [f"{key} {inference[key]}" for key in FILE_KEYS if inference.get(key)]
        for key in ("generated text", "text", "response", "answer"):
            if isinstance(inference.get(key), str):
                parts.append(inference[key][:500])
        if not parts and inference.get("predicted") is not None:
            parts.append(json.dumps(inference["predicted"], ensure_ascii=False)[:500])  # pragma: no mutate: None is False
        lines.append(head + ("; ".join(parts) or "done"))
    return "\n".join(lines)
