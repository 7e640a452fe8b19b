"""Stage 2 for one request: every task's model chosen at once, in parallel, off the critical path.

`select.py` chooses for one task; this module starts that for each task of a plan (as soon as the task is
known, while the plan still streams or while dependencies run), announces each choice, and writes the
decisions-only answer (`return_decisions: true`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from .plan import Plan, Task
from .request import RequestState, collect_result
from .select import Selection, Selector


def start_selection(state: RequestState, selector: Selector, tasks: list[Task], threads: Executor,
                    logit_bias: float = 0.0, observe_seconds: Callable[[float], None] | None = None) -> None:
    """Start choosing each task's model now, on `threads` (shared by requests: no thread started per request);
    `state.selection_of(task)` waits for the answer. observe_seconds: told how long each choice took."""
    selector.prepare(state.request.user_input, [t for t in tasks if not t.error and t.id not in state.selections])
    with state.lock:
        failed = frozenset(state.failed_models)  # a replan never picks a model that failed in this request
    for task in tasks:
        if task.error or task.id in state.selections:  # already chosen while the plan streamed
            continue
        state.selections[task.id] = threads.submit(_choose, state, selector, task, logit_bias, failed,
                                                   observe_seconds)


def _choose(state: RequestState, selector: Selector, task: Task, logit_bias: float, failed: frozenset[str],
            observe_seconds: Callable[[float], None] | None = None) -> Selection:
    """Choose, then announce: the choice is announced before anyone waiting on it (the task) can go on."""
    sel = selector.select(state.request.user_input, copy.deepcopy(task), state.llm, logit_bias, failed)
    if observe_seconds is not None:
        observe_seconds(sel.seconds)
    _announce(state, task, sel)
    return sel


def _announce(state: RequestState, task: Task, sel: Selection) -> None:
    state.emit("model_selected", {"id": task.id, "task": task.task, "model": sel.model_id,
                                  "hosted_on": sel.hosted_on, "reason": sel.reason, "error": sel.error,
                                  "candidates": sel.available, "seconds": round(sel.seconds, 4)})


def decisions(state: RequestState, plan: Plan) -> dict[str, Any]:
    """The decisions-only answer: the plan and each task's chosen model, nothing executed."""
    selections: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    unavailable = 0
    for task in plan.tasks:
        if task.error:
            sel = Selection(task.id, task.task, None, None, "", error=task.error)
        else:
            sel = state.selection_of(task, timeout=max(0.1, state.deadline - time.monotonic()))
        if sel.model_id is None:
            unavailable += 1
        selections[str(task.id)] = {
            "task": task.task,
            "selected_model": sel.model_id,
            "hosted_on": sel.hosted_on,
            "reason": sel.reason if sel.model_id else sel.error,
            "status": "selected_not_executed" if sel.model_id else "unavailable",
            "available_candidates": sel.available,
        }
        raw[str(task.id)] = collect_result(task, sel.choose(), {} if sel.model_id else {"error": {"message": sel.error}})
    return {
        "decisions": {
            "input": state.request.user_input,
            "planned_tasks": plan.to_list(),
            "model_selections": selections,
            "summary": {"total_tasks": len(plan.tasks), "tasks_with_selections": len(plan.tasks) - unavailable,
                        "tasks_unavailable": unavailable},
        },
        "raw_results": raw,
    }
