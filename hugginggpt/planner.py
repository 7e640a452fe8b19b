"""Stage 1: the task plan for one request, or the conversational reply when there is nothing to run.

One entry point, `Planner.plan`. Inside it: the planner call (read while it streams when a `TaskSink` is
given, so each final task can start before the plan is complete), the reconciliation of what started with
the full plan (which stays the authority), one replan of a plan that cannot run as written, and the
conversational fallbacks (no task list, an empty one, a lone text task the LLM answers itself).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from .config import Config
from .llm import ignore_tokens, is_local, stage_cap
from .plan import TEXT_TASKS_FOR_LLM, Plan, PlanParseError, Task, kind_problems, parse_plan, plan_json_schema
from .planstream import EarlyTasks
from .prompts import PromptSet
from .replan import Replanner, invalid_tasks
from .request import RequestState
from .select import control_task_fixup

log = logging.getLogger(__name__)


# Tokens a plan may take per task it may hold: a task line is about 30 tokens, plus a copied sentence or two.
TOKENS_PER_TASK = 80


def plan_token_cap(max_tasks: int) -> int:
    """The longest plan worth reading: `max_tasks` tasks of TOKENS_PER_TASK, and the list's brackets."""
    return TOKENS_PER_TASK * max_tasks + 16


class PlanTooLarge(Exception):
    """The plan has more tasks than `max_tasks`: refused at once, with a message for the user."""


class TaskSink(Protocol):
    """Where the streamed plan's final tasks go before the whole plan is read (selection and execution)."""

    def start(self, task: Task) -> None: ...

    def stop(self) -> None:
        """Undo what was started: the full plan took another turn. Called at most once per sink use."""


@dataclass
class Planned:
    """What planning produced: a plan to run, or a reply to send as the answer."""

    plan: Plan | None = None
    reply: str | None = None
    streamed: frozenset[int] = frozenset()  # ids of the plan's tasks that already started while it streamed


class Planner:
    def __init__(self, config: Config, prompts: PromptSet, replanner: Replanner):
        self.config = config
        self.prompts = prompts
        self.replanner = replanner

    def chat_kwargs(self, api_type: str | None = None) -> dict[str, Any]:
        """How the planner is called (the first plan and every replan), for a backend of this type.

        A local backend (llama.cpp, Ollama, vLLM) gets the relaxed schema, whose grammar ends the list at
        `max_tasks`, and always a token cap: such a server runs one request at a time, so a runaway reply would
        hold every request behind it. The cap follows from `max_tasks` unless `planner_max_tokens` sets it."""
        structured = self.config.structured_output
        local = api_type == "local"
        schema = plan_json_schema(strict=not local, max_tasks=self.config.max_tasks) if structured != "off" else None
        cap = self.config.planner_max_tokens or (plan_token_cap(self.config.max_tasks) if local else None)
        return {"logit_bias_weight": self.config.logit_bias.get("parse_task", 0.0), "json_schema": schema,
                "structured": structured, "max_tokens": cap}

    def plan(self, state: RequestState, sink: TaskSink | None = None) -> Planned:
        """The plan, announced with a `plan` event; with a sink, final tasks are started as they stream."""
        early = EarlyTasks(sink.start, self.config.max_tasks) if sink is not None else None
        if early is not None:
            state.hold_events()  # task events wait until the whole plan is announced, as without streaming
        plan: Plan | None = None
        try:
            plan = self._read(state, early, sink)
        except PlanTooLarge as exc:
            return Planned(reply=str(exc))
        finally:
            if plan is None:  # an error, a refusal or a conversational answer: nothing the stream started may run
                self._drop(state, sink, early)
        if plan is None:
            return Planned(reply=self.chitchat(state))
        state.emit("plan", {"tasks": plan.to_list(), "notes": plan.notes})
        state.release_events()
        return Planned(plan=plan, streamed=frozenset(early.started) if early is not None else frozenset())

    def chitchat(self, state: RequestState) -> str:
        on_token = (lambda piece: state.emit("answer_token", {"text": piece})) if state.on_event else None
        return state.llm.chat(state.request.messages, temperature=0.7, on_token=on_token,
                              max_tokens=stage_cap(state.llm, "chat"))

    # -- inside -----------------------------------------------------------------------------------

    def propose(self, state: RequestState, on_token=None, fallback: bool = False) -> Plan | None:
        """The plan as the planner wrote it, read, checked and repaired once where it cannot run as written; None
        when the reply holds no task list. No conversational fallback here: this is what the bench scores (a
        lone summary is a plan here, while `plan` answers it in prose); `fallback` only says so in the log."""
        req = state.request
        messages = self.prompts.parse_task(req.messages[:-1], req.user_input, state.llm.settings.model,
                                           state.llm.settings.max_context_tokens)
        if on_token is None and is_local(state.llm):
            # llama.cpp's server stops generating when a *streamed* caller leaves, and only then: streamed, a plan
            # that times out or is cancelled frees the one-request-at-a-time server at its next token.
            on_token = ignore_tokens
        reply = state.llm.chat(messages, on_token=on_token, **self.chat_kwargs(state.llm.settings.api_type))
        log.debug("[%s] planner said: %s", req.request_id, reply)
        state.planner_messages, state.plan_reply = messages, reply
        try:
            plan = parse_plan(reply)
        except PlanParseError as exc:
            log.info("[%s] no task list in the plan (%s)%s", req.request_id, exc,
                     "; answering conversationally" if fallback else "")
            return None
        self._check_size(plan)
        return plan

    def repair(self, state: RequestState, plan: Plan) -> Plan:
        """One replan of a plan that cannot run as written (or whose inputs do not fit what their dependencies
        make), shown its problems; the better plan, else this one."""
        problems = invalid_tasks(plan) or kind_problems(plan)
        if problems and plan.tasks and self.replanner.allowed(state):
            state.replan_attempts += 1
            reason = "the plan cannot run as written: " + "; ".join(problems)
            better = self.replanner.ask(state, state.planner_messages, state.plan_reply,
                                        reason[0].upper() + reason[1:] + ".", frozenset(), 0,
                                        self.chat_kwargs(state.llm.settings.api_type))
            if better is not None and not invalid_tasks(better) and len(kind_problems(better)) <= len(
                    kind_problems(plan)):
                self._check_size(better)
                self.replanner.record(state, reason, better)
                return better
        return plan

    def _read(self, state: RequestState, early: EarlyTasks | None, sink: TaskSink | None) -> Plan | None:
        """The plan to run, or None to answer conversationally. Streamed tasks that disagree are dropped."""
        req = state.request
        plan = self.propose(state, on_token=early.feed if early else None, fallback=True)
        if plan is None:
            return None
        problems = invalid_tasks(plan)
        if early is not None and early.started:
            in_plan = {t.id for t in plan.tasks}
            differs = sorted([t.id for t in plan.tasks if t.id in early.started and not early.agrees(control_fixed(t))]
                             + [tid for tid in early.started if tid not in in_plan])  # e.g. an example in prose
            if problems or differs or not plan.tasks:  # the full plan disagrees: start over from it
                log.info("[%s] the full plan differs from the streamed tasks %s; starting over", req.request_id,
                         differs)
                self._drop(state, sink, early)
        plan = self.repair(state, plan)
        for note in plan.notes:
            log.info("[%s] plan: %s", req.request_id, note)
        if not plan.tasks:
            return None
        if len(plan.tasks) == 1 and plan.tasks[0].task in TEXT_TASKS_FOR_LLM and not plan.tasks[0].error:
            return None
        started = early.started if early is not None else {}
        for i, task in enumerate(plan.tasks):
            control_task_fixup(task)
            if task.id in started:
                plan.tasks[i] = started[task.id]  # the very object that runs
        return plan

    def _check_size(self, plan: Plan) -> None:
        if len(plan.tasks) > self.config.max_tasks:
            raise PlanTooLarge(f"The plan for this request has {len(plan.tasks)} tasks; this server runs at most "
                               f"{self.config.max_tasks} per request (max_tasks), so nothing was run. Ask for "
                               "fewer steps at once.")

    @staticmethod
    def _drop(state: RequestState, sink: TaskSink | None, early: EarlyTasks | None) -> None:
        """Stop what the stream started and forget its events (safe to call twice)."""
        if sink is not None and early is not None and early.started:
            sink.stop()
            early.started.clear()
        state.release_events(drop=True)


def control_fixed(task: Task) -> Task:
    """A copy of the task as it will run (ControlNet fix-ups applied), for comparing with a streamed one."""
    fixed = task.copy()  # new dep and args: the fix-up never touches the plan's own task
    control_task_fixup(fixed)
    return fixed
