"""Recovery by replanning: ask the planner once more, with what went wrong, for a plan of the remaining work.

Two moments: a plan that cannot run as written (unknown task type, cycle, dangling reference) before
anything runs, and tasks whose every candidate model failed after the first round. The new plan may use the
outputs of tasks that finished (`<GENERATED>-k`); its tasks get ids after the old ones. `max_replans` bounds
how often this happens per request; each replan is an event and a line in the answer.
"""

from __future__ import annotations

import logging
from typing import Any

from .plan import Plan, PlanParseError, parse_plan
from .request import RequestState
from .textsafe import JSON_AS_IS

log = logging.getLogger(__name__)

ALL_FAILED = "every candidate failed"


def invalid_tasks(plan: Plan) -> list[str]:
    return [f"task {t.id} ({t.task}): {t.error}" for t in plan.tasks if t.error]


def failed_for_good(plan: Plan, results: dict[int, dict[str, Any]]) -> list[str]:
    """Tasks of this plan whose every model failed (a different plan might avoid them)."""
    out = []
    for task in plan.tasks:
        error = (results.get(task.id) or {}).get("inference result", {}).get("error")
        if isinstance(error, dict) and str(error.get("message")).startswith(ALL_FAILED):
            out.append(f"task {task.id} ({task.task}) could not be run: {error['message'][:400]}")
    return out


def _brief(results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    brief = []
    for tid in sorted(results):
        record = results[tid]
        inference = record.get("inference result", {})
        brief.append({"id": tid, "task": record.get("task", {}).get("task"),
                      "status": "failed" if "error" in inference else "done",
                      "output": {k: v for k, v in inference.items() if k != "error" and isinstance(v, (str, int, float))}})
    return brief


class Replanner:
    def __init__(self, max_replans: int):
        self.max_replans = max_replans

    def allowed(self, state: RequestState) -> bool:
        return state.replan_attempts < self.max_replans

    def ask(self, state: RequestState, planner_messages: list[dict[str, str]], previous: str, problem: str,
            finished: frozenset[int], first_id: int, chat_kwargs: dict[str, Any]) -> Plan | None:
        """One more planner call; the new plan (ids from first_id), or None when it is no better."""
        note = (f"{problem}\nWrite a new JSON task list for the remaining work only, in the same format. "
                f"Number its tasks from {first_id}. ")
        if finished:
            note += (f"Tasks {sorted(finished)} already finished: use <GENERATED>-k to use the output of finished "
                     "task k instead of running it again. ")
        note += "Avoid what failed (another task type or another way to reach the goal)."
        messages = planner_messages + [{"role": "assistant", "content": previous}, {"role": "user", "content": note}]
        reply = state.llm.chat(messages, **chat_kwargs)
        try:
            plan = parse_plan(reply, finished)
        except PlanParseError as exc:
            log.info("[%s] the replan is not a task list (%s)", state.request.request_id, exc)
            return None
        taken = finished | set(range(first_id))
        clash = [t.id for t in plan.tasks if t.id in taken]
        if clash or not plan.tasks:
            log.info("[%s] the replan is unusable (ids %s reused or empty)", state.request.request_id, clash)
            return None
        return plan

    def record(self, state: RequestState, reason: str, plan: Plan) -> None:
        line = f"Replanned after: {reason} -> " + ", ".join(f"#{t.id} {t.task}" for t in plan.tasks)
        state.replans.append(line)
        state.emit("replan", {"reason": reason, "tasks": plan.to_list()})

    @staticmethod
    def context(plan: Plan, results: dict[int, dict[str, Any]]) -> str:
        return JSON_AS_IS.encode({"plan": plan.to_list(), "results": _brief(results)})[:6000]
