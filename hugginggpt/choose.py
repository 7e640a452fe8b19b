"""Stage 2 for one request: every task's model chosen at once, in parallel, off the critical path.

`select.py` chooses for one task; this module starts that for each task of a plan (as soon as the task is
known, while the plan still streams or while dependencies run), announces each choice, and writes the
decisions-only answer (`return_decisions: true`).

With `choose_model: auto` the LLM is asked only when the ranking's lead is below the margin, and even then it
never holds up a task that could run: a task whose inputs are ready when it is selected runs the ranking's
pick without asking; a task still waiting for its dependencies has the LLM asked meanwhile, and its choice is
taken if it comes before the inputs do; otherwise the task starts on the ranking's pick at once (`Choice`).
`choose_model: llm` waits for the LLM (JARVIS's way), and so does a decisions-only request, where nothing runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from .plan import Plan, Task
from .request import RequestState, collect_result
from .select import Selection, Selector

log = logging.getLogger(__name__)


class Choice(Future):
    """One task's model choice, settled once: by the selection (the ranking, or the LLM's answer), or by the
    task itself when it is ready to run while the LLM is still thinking (`take_ranking`). Whoever settles it
    announces it, so `model_selected` is sent once and before the task's `task_started`."""

    def __init__(self) -> None:
        super().__init__()
        self._claim = threading.Lock()
        self._claims = 0  # calls to settle or fail so far: only the first one counts
        self.ranked = threading.Event()  # the ranking has answered: `provisional` is set, or the choice is final
        self.provisional: Selection | None = None  # the ranking's pick while the LLM is asked (auto only)

    def _first(self) -> bool:
        """True for the one caller that settles the choice; False for everyone after it."""
        with self._claim:
            self._claims += 1
            return self._claims == 1

    def settle(self, state: RequestState, task: Task, selection: Selection) -> bool:
        """Make `selection` the choice, unless it was made already; True when it was this call that made it.
        (Announcing cannot fail: `state.emit` keeps a listener's errors to itself.)"""
        if not self._first():
            return False
        _announce(state, task, selection)
        self.set_result(selection)
        self.ranked.set()
        return True

    def fail(self, exc: BaseException) -> bool:
        """The selection failed: the task waiting on the choice gets the error (False: it was settled already)."""
        if not self._first():
            return False
        self.set_exception(exc)
        self.ranked.set()
        return True

    def offer(self, pick: Selection) -> None:
        """The ranking's pick, taken by the task if it is ready before the LLM answers."""
        self.provisional = pick
        self.ranked.set()

    def take_ranking(self, state: RequestState, task: Task, timeout: float) -> None:
        """The task is ready to run: if the LLM has not chosen yet, the ranking's pick is the choice."""
        if self.done() or not self.ranked.wait(timeout):
            return
        pick = self.provisional
        if pick is not None and not self.done():
            final = pick.without_llm("the LLM was asked, but the task's inputs were ready before its answer")
            if self.settle(state, task, final):
                log.info("[%s] task %s: inputs ready before the LLM chose; running the top-ranked %s",
                         state.request.request_id, task.id, final.model_id)


def ready_to_start(state: RequestState, task: Task, choice: Future | None = None) -> None:
    """`task`'s inputs are ready: it never waits for an LLM choice that `auto` asked for (the ranking's pick
    is taken if the LLM has not answered yet), only for the ranking itself. choice: the one made for this very
    task (a round keeps its own: a streamed plan replaced by the full one reuses task ids)."""
    choice = choice if choice is not None else state.selections.get(task.id)
    if isinstance(choice, Choice):
        choice.take_ranking(state, task, max(0.0, state.deadline - time.monotonic()))


def selection_at_start(state: RequestState, task: Task, choice: Future | None = None) -> Selection:
    """The model `task` runs on, now that its inputs are ready (see `ready_to_start`); waits no longer than
    the request's deadline."""
    ready_to_start(state, task, choice)
    return state.selection_of(task, timeout=max(0.0, state.deadline - time.monotonic()), choice=choice)


def inputs_ready(state: RequestState, task: Task) -> bool:
    """Every task `task` depends on has finished (a task with no dependencies is ready from the start)."""
    deps = [d for d in task.dep if d != -1]
    with state.lock:
        return all(d in state.results for d in deps)


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
        choice = Choice()
        threads.submit(_choose, state, selector, task, logit_bias, failed, observe_seconds, choice)
        state.selections[task.id] = choice  # only once it is being made: nobody waits for a choice never started


def _choose(state: RequestState, selector: Selector, task: Task, logit_bias: float, failed: frozenset[str],
            observe_seconds: Callable[[float], None] | None, choice: Choice) -> None:
    """Rank; ask the LLM when the ranking does not decide and its answer can still change what runs; settle."""
    try:
        started = time.perf_counter()
        task = task.copy()
        sel = selector.by_ranking(state.request.user_input, task, failed)
        if sel.question is not None:
            waits = selector.choose == "llm" or not state.executes  # nothing runs: the answer is the choice
            if not waits and inputs_ready(state, task):
                sel = sel.without_llm("the task's inputs were ready, so it ran without waiting for the LLM")
            else:
                if not waits:
                    choice.offer(sel)
                sel = selector.ask_llm(sel, state.request.user_input, task, state.llm, logit_bias)
        sel.seconds = time.perf_counter() - started
        if observe_seconds is not None:
            observe_seconds(sel.seconds)
        if not choice.settle(state, task, sel):
            log.info("[%s] task %s: the LLM chose %s after the task had started on the top-ranked model",
                     state.request.request_id, task.id, sel.model_id)
    except Exception as exc:  # noqa: BLE001 - the task waiting on the choice gets the error
        if not choice.fail(exc):  # the task runs already: say what went wrong after it started
            log.exception("[%s] task %s: choosing its model failed after it started on the top-ranked model",
                          state.request.request_id, task.id)


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
        if task.error:  # never selected: the planned task cannot run (its error says why)
            model_id, hosted_on, why, available, chosen = None, None, task.error, {}, ""
        else:
            sel = state.selection_of(task, timeout=max(0.1, state.deadline - time.monotonic()))
            model_id, hosted_on, available, chosen = sel.model_id, sel.hosted_on, sel.available, sel.choose()
            why = sel.reason if model_id else sel.error
        if model_id is None:
            unavailable += 1
        selections[str(task.id)] = {
            "task": task.task,
            "selected_model": model_id,
            "hosted_on": hosted_on,
            "reason": why,
            "status": "selected_not_executed" if model_id else "unavailable",
            "available_candidates": available,
        }
        raw[str(task.id)] = collect_result(task, chosen, {} if model_id else {"error": {"message": why}})
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
