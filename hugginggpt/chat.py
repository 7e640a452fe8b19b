"""The four stages for one request: plan -> select -> execute -> respond.

`HuggingGPT` is built once from a Config (catalog, prompts, backends, caches); every call gets its own
`RequestState`, so concurrent requests never share tasks, results or keys.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .backends import Backend
from .backends.local import LocalModelsServer
from .catalog import Catalog, KeywordRanker, Ranker
from .config import Config
from .execute import Executor
from .llm import LLMClient, with_overrides
from .plan import TEXT_TASKS_FOR_LLM, Plan, PlanParseError, Task, parse_plan, plan_json_schema
from .planstream import EarlyTasks
from .prompts import PromptSet
from .replan import Replanner, failed_for_good, invalid_tasks
from .request import ChatRequest, EventSink, RequestState, collect_result, validate_messages
from .respond import write_answer
from .scheduler import Outcome
from .select import Availability, Selection, Selector, control_task_fixup

__all__ = ["ChatRequest", "HuggingGPT", "RequestState", "collect_result", "validate_messages"]

log = logging.getLogger(__name__)


class HuggingGPT:
    """The orchestrator. Build once per process; call `run` per request (thread-safe)."""

    def __init__(
        self,
        config: Config,
        *,
        ranker: Ranker | None = None,
        backends: dict[str, Backend] | None = None,
    ):
        self.config = config
        self.prompts = PromptSet.from_config(config)
        self.catalog = Catalog.load(config.catalog_path)
        if ranker is None and config.semantic_ranking:
            from .catalog.semantic import SemanticRanker

            ranker = SemanticRanker.create(config.cache_dir, catalog=self.catalog.cards)
        self.ranker = ranker or KeywordRanker()
        self.warmed = threading.Event()
        self._clients: dict[Any, LLMClient] = {}
        self._clients_lock = threading.Lock()
        self.url_policy = config.url_policy()
        self.local = LocalModelsServer(config.models_server_url, config.public_dir, config.status_timeout,
                                       config.task_timeout, token=config.models_server_token, policy=self.url_policy,
                                       max_output_bytes=config.max_output_bytes, copy_timeout=config.fetch_timeout * 4)
        self.backends: dict[str, Backend] = backends if backends is not None else self._default_backends()
        self.executor = Executor(config, self.backends, self.url_policy)
        self.replanner = Replanner(config.max_replans)
        self.availability = Availability(self.backends, ttl=config.status_cache_seconds)
        self.selector = Selector(
            catalog=self.catalog, ranker=self.ranker, availability=self.availability, prompts=self.prompts,
            inference_mode=config.inference_mode, num_candidates=config.num_candidate_models,
            max_description_length=config.max_description_length,
            language=config.preferred_language, max_size_mb=config.max_model_size_mb,
            choose=config.choose_model, margin=config.choose_model_margin,
        )

    def warm(self) -> None:
        """Load the ranking model and embed the catalog now, not on the first request."""
        warm = getattr(self.ranker, "warm", None)
        if warm is not None:
            try:
                warm(self.catalog.cards)
                self.ranker.load()
            except Exception:  # noqa: BLE001 - ranking falls back per request if this fails
                log.exception("warming the model ranker failed")
        self.warmed.set()

    @property
    def ranking(self) -> str:
        kind = "semantic" if hasattr(self.ranker, "warm") else "keyword"
        return kind if self.warmed.is_set() or kind == "keyword" else "warming"

    def _default_backends(self) -> dict[str, Backend]:
        backends: dict[str, Backend] = {}
        if self.config.inference_mode in ("local", "hybrid"):
            backends["local"] = self.local
        if self.config.inference_mode in ("huggingface", "hybrid"):
            from .backends.hosted import HostedInference

            backends["huggingface"] = HostedInference.from_config(self.config)
        return backends

    # -- entry point ------------------------------------------------------------------------------

    def llm_for(self, request: ChatRequest) -> LLMClient:
        settings = with_overrides(self.config.llm, request.api_key, request.api_type, request.api_endpoint,
                                  request.model, allow_endpoints=self.config.allow_request_endpoints)
        with self._clients_lock:  # clients are thread-safe and costly to build (TLS setup): reuse them
            client = self._clients.get(settings)
            if client is None:
                if len(self._clients) > 64:
                    self._clients.clear()
                client = self._clients[settings] = LLMClient(settings, proxy=self.config.proxy)
            return client

    def run(
        self,
        request: ChatRequest,
        mode: str = "answer",
        on_event: EventSink | None = None,
        state_ready: Callable[[RequestState], None] | None = None,
    ) -> Any:
        """mode: "answer" (/hugginggpt), "tasks" (/tasks), "results" (/results), "decisions"."""
        state = RequestState(request, self.llm_for(request), on_event, self.config.request_timeout)
        if state_ready:
            state_ready(state)
        rid = request.request_id
        log.info("[%s] request (%s): %.200s", rid, mode, request.user_input)
        early = self.early_start(state) if mode in ("answer", "results") and self.config.stream_plan else None
        plan = self.plan(state, early)
        if not isinstance(plan, Plan):  # a conversational answer
            state.emit("answer", {"message": plan["message"]})
            return plan
        if mode == "tasks":
            return plan.to_list()
        self.start_selection(state, plan)
        if mode == "decisions":
            return self.decisions(state, plan)
        if early is not None and early.round is not None:
            for task in plan.tasks:  # what the stream already started runs on; the rest joins now
                if task.id not in early.started:
                    early.round.add(task)
            early.round.finish()
        else:
            self.execute(state, plan)
        self.recover(state, plan)
        with state.lock:
            results = {tid: state.results[tid] for tid in sorted(state.results)}
        if state.cancelled.is_set():
            log.info("[%s] cancelled; no answer written", rid)
            return {"message": "", "cancelled": True}
        if mode == "results":
            return results
        message = self.respond(state, results)
        log.info("[%s] answered in %.2fs", rid, time.perf_counter() - state.started)
        return {"message": message}

    # -- stage 1 ----------------------------------------------------------------------------------

    def early_start(self, state: RequestState) -> EarlyTasks:
        """Tasks the streamed plan makes final start now: their model is chosen and they join the round."""
        def start(task: Task) -> None:
            control_task_fixup(task)
            if early.round is None:
                early.round = self.executor.begin(state)
            self.start_selection(state, Plan(tasks=[task]))
            early.round.add(task)

        early = EarlyTasks(start)
        state.hold_events()  # task events wait until the whole plan is announced, as without streaming
        return early

    def plan(self, state: RequestState, early: EarlyTasks | None = None) -> Plan | dict[str, str]:
        req = state.request
        messages = self.prompts.parse_task(req.messages[:-1], req.user_input, state.llm.settings.model,
                                           state.llm.settings.max_context_tokens)
        try:
            reply = state.llm.chat(messages, on_token=early.feed if early else None, **self.planner_kwargs())
        except BaseException:
            self.drop_early(state, early)
            raise
        log.debug("[%s] planner said: %s", req.request_id, reply)
        try:
            plan = parse_plan(reply)
        except PlanParseError as exc:
            log.info("[%s] no task list in the plan (%s); answering conversationally", req.request_id, exc)
            self.drop_early(state, early)
            return {"message": self.chitchat(state)}
        problems = invalid_tasks(plan)
        if early is not None and early.started:
            differs = [t.id for t in plan.tasks if t.id in early.started and not early.agrees(control_fixed(t))]
            if problems or differs or not plan.tasks:  # the full plan disagrees: start over from it
                log.info("[%s] the full plan differs from the streamed tasks %s; starting over", req.request_id,
                         differs)
                self.drop_early(state, early)
                early = None
        state.planner_messages, state.plan_reply = messages, reply
        if problems and plan.tasks and self.replanner.allowed(state):
            state.replan_attempts += 1
            reason = "the plan cannot run as written: " + "; ".join(problems)
            better = self.replanner.ask(state, messages, reply, reason.capitalize() + ".", frozenset(), 0,
                                        self.planner_kwargs())
            if better is not None and not invalid_tasks(better):
                self.replanner.record(state, reason, better)
                plan = better
        for note in plan.notes:
            log.info("[%s] plan: %s", req.request_id, note)
        if not plan.tasks:
            self.drop_early(state, early)
            return {"message": self.chitchat(state)}
        if len(plan.tasks) == 1 and plan.tasks[0].task in TEXT_TASKS_FOR_LLM and not plan.tasks[0].error:
            self.drop_early(state, early)
            return {"message": self.chitchat(state)}
        for i, task in enumerate(plan.tasks):
            control_task_fixup(task)
            if early is not None and task.id in early.started:
                plan.tasks[i] = early.started[task.id]  # the very object that runs
        state.emit("plan", {"tasks": plan.to_list(), "notes": plan.notes})
        state.release_events()
        return plan

    @staticmethod
    def drop_early(state: RequestState, early: EarlyTasks | None) -> None:
        """Stop what the stream started (the full plan took another turn) and forget its events."""
        if early is not None and early.round is not None:
            early.round.scheduler.cancel("the full plan replaced the streamed one")
            early.round = None
            early.started.clear()
            with state.lock:
                state.selections.clear()
        state.release_events(drop=True)

    def planner_kwargs(self) -> dict[str, Any]:
        structured = self.config.structured_output
        return {"logit_bias_weight": self.config.logit_bias.get("parse_task", 0.0),
                "json_schema": plan_json_schema() if structured != "off" else None, "structured": structured,
                "max_tokens": self.config.planner_max_tokens}

    def recover(self, state: RequestState, plan: Plan) -> None:
        """Replan the remaining work when tasks failed on every model (at most max_replans times)."""
        while self.replanner.allowed(state) and not state.cancelled.is_set():
            with state.lock:
                results = dict(state.results)
            failures = failed_for_good(plan, results)
            if not failures:
                return
            state.replan_attempts += 1
            finished = frozenset(t for t, r in results.items() if "error" not in r["inference result"])
            reason = "; ".join(failures)
            new = self.replanner.ask(state, state.planner_messages, state.plan_reply,
                                     f"{reason}.\nWhat ran so far: {self.replanner.context(plan, results)}",
                                     finished, max(results) + 1, self.planner_kwargs())
            if new is None or invalid_tasks(new):
                return
            for task in new.tasks:
                control_task_fixup(task)
            self.replanner.record(state, reason, new)
            self.start_selection(state, new)
            self.execute(state, new)
            plan = new

    def chitchat(self, state: RequestState) -> str:
        on_token = (lambda piece: state.emit("answer_token", {"text": piece})) if state._sink else None
        return state.llm.chat(state.request.messages, temperature=0.7, on_token=on_token)

    # -- stage 2 ----------------------------------------------------------------------------------

    def start_selection(self, state: RequestState, plan: Plan) -> None:
        """Select every task's model now, in parallel, so selection stays off the critical path."""
        pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(plan.tasks))), thread_name_prefix="select")
        bias = self.config.logit_bias.get("choose_model", 0.0)
        for task in plan.tasks:
            if task.error or task.id in state.selections:  # already chosen while the plan streamed
                continue
            fut = pool.submit(self.selector.select, state.request.user_input, copy.deepcopy(task), state.llm, bias)
            fut.add_done_callback(lambda f, t=task: self._selected(state, t, f))
            state.selections[task.id] = fut
        pool.shutdown(wait=False)

    def _selected(self, state: RequestState, task: Task, fut: Future) -> None:
        if fut.exception() is not None:
            return
        sel: Selection = fut.result()
        state.emit("model_selected", {"id": task.id, "task": task.task, "model": sel.model_id,
                                      "hosted_on": sel.hosted_on, "reason": sel.reason, "error": sel.error,
                                      "candidates": sel.available, "seconds": round(sel.seconds, 4)})

    def decisions(self, state: RequestState, plan: Plan) -> dict[str, Any]:
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

    # -- stages 3 and 4 -------------------------------------------------------------------------

    def execute(self, state: RequestState, plan: Plan) -> dict[int, Outcome]:
        return self.executor.execute(state, plan)

    def respond(self, state: RequestState, results: dict[int, dict[str, Any]]) -> str:
        notes = list(state.replans)
        if state.replan_attempts and any("error" in r["inference result"] for r in results.values()):
            notes.append(f"Some tasks still failed after {state.replan_attempts} replan attempt(s) "
                         f"(max_replans: {self.replanner.max_replans}); their errors are above.")
        return write_answer(state.llm, self.prompts, state.request.user_input, results, state.timeout,
                            state.emit if state._sink else None, notes)


def control_fixed(task: Task) -> Task:
    """A copy of the task as it will run (ControlNet fix-ups applied), for comparing with a streamed one."""
    fixed = copy.deepcopy(task)
    control_task_fixup(fixed)
    return fixed
