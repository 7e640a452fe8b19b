"""The four stages for one request: plan -> select -> execute -> respond.

`HuggingGPT` is built once from a Config (catalog, prompts, backends, caches); every call gets its own
`RequestState`, so concurrent requests never share tasks, results or keys.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .backends import Backend, TaskInputs
from .backends.local import LocalModelsServer
from .catalog import Catalog, KeywordRanker, Ranker
from .config import Config
from .errors import BackendError, BadRequest, LLMError, ResourceError
from .llm import DeadlineLLM, LLMClient, with_overrides
from .plan import TEXT_TASKS_FOR_LLM, Plan, PlanParseError, Task, parse_plan
from .prompts import PromptSet
from .resources import Resource, resolve
from .respond import write_answer
from .scheduler import DONE, FAILED, Outcome, Scheduler, TaskFailed
from .select import Availability, Selection, Selector, control_task_fixup

log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], None]
MAX_MESSAGES = 200
MAX_CONTENT_CHARS = 100_000


@dataclass
class ChatRequest:
    """One request as the client sent it; validated by `from_body`."""

    messages: list[dict[str, str]]
    api_key: str | None = None
    api_type: str | None = None
    api_endpoint: str | None = None
    model: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def from_body(cls, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object with a `messages` list")
        messages = validate_messages(body.get("messages"))
        fields = {}
        for key in ("api_key", "api_type", "api_endpoint", "model"):
            value = body.get(key)
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"`{key}` must be a string")
            if value:
                _check_unicode(value, f"`{key}`")
            fields[key] = value or None
        return cls(messages=messages, **fields)

    @property
    def user_input(self) -> str:
        return self.messages[-1]["content"]


def validate_messages(messages: Any) -> list[dict[str, str]]:
    if messages is None:
        raise BadRequest("`messages` is required: a list of {\"role\", \"content\"} objects, the last one the request")
    if not isinstance(messages, list):
        raise BadRequest("`messages` must be a list of {\"role\", \"content\"} objects")
    if not messages:
        raise BadRequest("`messages` is empty: send at least one user message")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"`messages` has {len(messages)} items; at most {MAX_MESSAGES} are accepted")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object with `role` and `content`")
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}].role must be user, assistant or system, got {role!r}")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        if len(content) > MAX_CONTENT_CHARS:
            raise BadRequest(f"messages[{i}].content is longer than {MAX_CONTENT_CHARS} characters")
        _check_unicode(content, f"messages[{i}].content")
        clean.append({"role": role, "content": content})
    if not clean[-1]["content"].strip():
        raise BadRequest("the last message is empty: it must hold the request")
    return clean


def _check_unicode(value: str, where: str) -> None:
    """JSON can carry lone UTF-16 surrogates (\\ud800) that no UTF-8 consumer downstream accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} contains invalid Unicode (a lone surrogate at position {exc.start})") from None


def collect_result(task: Task, choose: dict[str, str] | str, inference: dict[str, Any]) -> dict[str, Any]:
    """JARVIS's per-task record."""
    return {"task": task.to_dict(), "inference result": inference, "choose model result": choose}


class RequestState:
    """Everything one request owns: its LLM client, plan, selections, results and events."""

    def __init__(self, request: ChatRequest, llm: LLMClient, on_event: EventSink | None, timeout: float):
        self.request = request
        self.started = time.perf_counter()
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.llm = DeadlineLLM(llm, self.deadline)
        self._sink = on_event
        self.results: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.selections: dict[int, Future] = {}
        self.scheduler: Scheduler | None = None
        self.cancelled = threading.Event()
        self.sealed = False  # set under `lock` when execution ends: late task results are dropped

    def emit(self, name: str, payload: dict[str, Any]) -> None:
        if self._sink is None:
            return
        event = {"event": name, "request_id": self.request.request_id,
                 "t": round(time.perf_counter() - self.started, 4), **payload}
        try:
            self._sink(name, event)
        except Exception:  # noqa: BLE001 - a broken listener must not break the request
            log.exception("[%s] event listener failed", self.request.request_id)

    def cancel(self) -> None:
        self.cancelled.set()
        if self.scheduler is not None:
            self.scheduler.cancel()


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
            from .ranking import SemanticRanker

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
        self.availability = Availability(self.backends, ttl=config.status_cache_seconds)
        self.selector = Selector(
            catalog=self.catalog, ranker=self.ranker, availability=self.availability, prompts=self.prompts,
            inference_mode=config.inference_mode, num_candidates=config.num_candidate_models,
            max_description_length=config.max_description_length,
            language=config.preferred_language, max_size_mb=config.max_model_size_mb,
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
        plan = self.plan(state)
        if not isinstance(plan, Plan):  # a conversational answer
            state.emit("answer", {"message": plan["message"]})
            return plan
        if mode == "tasks":
            return plan.to_list()
        self.start_selection(state, plan)
        if mode == "decisions":
            return self.decisions(state, plan)
        self.execute(state, plan)
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

    def plan(self, state: RequestState) -> Plan | dict[str, str]:
        req = state.request
        messages = self.prompts.parse_task(req.messages[:-1], req.user_input, state.llm.settings.model,
                                           state.llm.settings.max_context_tokens)
        reply = state.llm.chat(messages, logit_bias_weight=self.config.logit_bias.get("parse_task", 0.0))
        log.debug("[%s] planner said: %s", req.request_id, reply)
        try:
            plan = parse_plan(reply)
        except PlanParseError as exc:
            log.info("[%s] no task list in the plan (%s); answering conversationally", req.request_id, exc)
            return {"message": self.chitchat(state)}
        for note in plan.notes:
            log.info("[%s] plan: %s", req.request_id, note)
        if not plan.tasks:
            return {"message": self.chitchat(state)}
        if len(plan.tasks) == 1 and plan.tasks[0].task in TEXT_TASKS_FOR_LLM and not plan.tasks[0].error:
            return {"message": self.chitchat(state)}
        for task in plan.tasks:
            control_task_fixup(task)
        state.emit("plan", {"tasks": plan.to_list(), "notes": plan.notes})
        return plan

    def chitchat(self, state: RequestState) -> str:
        on_token = (lambda piece: state.emit("answer_token", {"text": piece})) if state._sink else None
        return state.llm.chat(state.request.messages, temperature=0.7, on_token=on_token)

    # -- stage 2 ----------------------------------------------------------------------------------

    def start_selection(self, state: RequestState, plan: Plan) -> None:
        """Select every task's model now, in parallel, so selection stays off the critical path."""
        pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(plan.tasks))), thread_name_prefix="select")
        bias = self.config.logit_bias.get("choose_model", 0.0)
        for task in plan.tasks:
            if task.error:
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
                                      "candidates": sel.available})

    def selection_of(self, state: RequestState, task: Task, timeout: float | None = None) -> Selection:
        fut = state.selections[task.id]
        try:
            return fut.result(timeout=timeout)
        except LLMError:
            raise
        except Exception as exc:  # noqa: BLE001
            return Selection(task.id, task.task, None, None, "", error=f"model selection failed: {exc}")

    def decisions(self, state: RequestState, plan: Plan) -> dict[str, Any]:
        selections: dict[str, Any] = {}
        raw: dict[str, Any] = {}
        unavailable = 0
        for task in plan.tasks:
            if task.error:
                sel = Selection(task.id, task.task, None, None, "", error=task.error)
            else:
                sel = self.selection_of(state, task, timeout=max(0.1, state.deadline - time.monotonic()))
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

    # -- stage 3 ----------------------------------------------------------------------------------

    def execute(self, state: RequestState, plan: Plan) -> dict[int, Outcome]:
        by_id = plan.by_id()
        graph = {t.id: [d for d in t.dep if d != -1] for t in plan.tasks}
        upfront = {t.id: t.error for t in plan.tasks if t.error}

        def body(tid: int) -> dict[str, Any]:
            result = self.run_task(state, by_id[tid])
            with state.lock:
                if not state.sealed:
                    state.results[tid] = result
            if "error" in result["inference result"]:
                raise TaskFailed(_message(result["inference result"]["error"]), result)
            return result

        def relay(name: str, payload: dict[str, Any]) -> None:
            payload = dict(payload)
            if name == "task_skipped":
                name, payload["skipped"] = "task_failed", True
            task = by_id.get(payload.get("id"))
            if task is not None:
                payload["task"] = task.task
            result = payload.pop("result", None)
            if isinstance(result, dict):
                payload["result"] = result.get("inference result")
                payload["args"] = result.get("task", {}).get("args")
            state.emit(name, payload)

        scheduler = Scheduler(graph, body, max_workers=self.config.max_workers, on_event=relay, failed_upfront=upfront)
        state.scheduler = scheduler
        if state.cancelled.is_set():
            scheduler.cancel()
        remaining = state.deadline - time.monotonic()
        outcomes = scheduler.run(timeout=max(0.1, remaining))
        with state.lock:  # the outcome is the truth: a task that timed out has no result, even if it wrote one
            state.sealed = True
            for tid, outcome in outcomes.items():
                if outcome.state not in (DONE, FAILED) or tid not in state.results:
                    state.results[tid] = collect_result(by_id[tid], "", {"error": {"message": outcome.error
                                                                                    or outcome.state}})
        state.outcomes = outcomes  # type: ignore[attr-defined] - kept for timing measurements
        return outcomes

    def run_task(self, state: RequestState, planned: Task) -> dict[str, Any]:
        task = copy.deepcopy(planned)
        try:
            self.resolve_refs(state, task)
        except TaskFailed as exc:
            return collect_result(task, "", {"error": {"message": str(exc)}})
        sel = self.selection_of(state, planned)
        if sel.error or not sel.model_id:
            return collect_result(task, sel.choose(), {"error": {"message": sel.error or "no model selected"}})
        if sel.hosted_on == "llm":
            return collect_result(task, sel.choose(), {"response": self.llm_text_task(state, task)})
        try:
            inputs = self.inputs_for(task)
        except ResourceError as exc:
            return collect_result(task, sel.choose(), {"error": {"message": str(exc)}})
        tried: list[dict[str, str]] = []
        for model_id, backend_name in sel.fallbacks():
            backend = self.backends.get(backend_name)
            if backend is None:
                continue
            try:
                result = backend.infer(model_id, inputs)
            except BackendError as exc:
                result = {"error": {"message": str(exc)}}
            if "error" not in result:
                choose = {"id": model_id, "reason": sel.reason if model_id == sel.model_id else
                          f"fallback after {tried[-1]['model']} failed"}
                if tried:
                    result = {**result, "fallback": {"tried": tried}}
                return collect_result(task, choose, result)
            tried.append({"model": model_id, "hosted_on": backend_name, "error": _message(result["error"])})
            log.warning("[%s] task %s: %s on %s failed: %s", state.request.request_id, task.id, model_id,
                        backend_name, tried[-1]["error"])
            if state.cancelled.is_set():
                break
        message = "; ".join(f"{t['model']} ({t['hosted_on']}): {t['error']}" for t in tried) or "no backend"
        return collect_result(task, sel.choose(), {"error": {"message": f"every candidate failed: {message}",
                                                             "tried": tried}})

    def resolve_refs(self, state: RequestState, task: Task) -> None:
        """Replace `<GENERATED>-N` with task N's output of the argument's kind, just before running."""
        for key, value in list(task.args.items()):
            if "<GENERATED>" not in value:
                continue

            def output_of(n: int, key: str = key) -> str:
                with state.lock:
                    dep = state.results.get(n)
                if dep is None:
                    raise TaskFailed(f"argument {key} needs the output of task {n}, which has none")
                inf = dep["inference result"]
                keys = {"image": ("generated image",), "audio": ("generated audio",), "text": (
                    "generated text", "text", "response", "answer")}[key]
                for k in keys:
                    if isinstance(inf.get(k), str) and inf[k]:
                        return inf[k]
                if key == "text" and inf.get("predicted") is not None:
                    return json.dumps(inf["predicted"], ensure_ascii=False)
                if key in dep["task"]["args"] and "<GENERATED>" not in dep["task"]["args"][key]:
                    return dep["task"]["args"][key]  # JARVIS: fall back to the dependency's own input
                raise TaskFailed(f"argument {key} needs a {key} from task {n}, which produced none")

            task.args[key] = re.sub(r"<GENERATED>-(\d+)", lambda m: output_of(int(m.group(1))), value)

    def inputs_for(self, task: Task) -> TaskInputs:
        def res(name: str) -> Resource | None:
            value = task.args.get(name)
            if not value:
                return None
            return resolve(value, self.config.public_dir, self.config.max_fetch_bytes, self.config.fetch_timeout,
                           self.config.proxy, self.url_policy)

        return TaskInputs(task=task.task, text=task.args.get("text"), image=res("image"), audio=res("audio"))

    def llm_text_task(self, state: RequestState, task: Task) -> str:
        prompt = (
            f"The request [ {state.request.user_input} ] contains this task in JSON: {json.dumps(task.to_dict())}. "
            f"Act as a {task.task} system with the arguments {json.dumps(task.args, ensure_ascii=False)} and give "
            "only the result, as plain text without URLs."
        )
        return state.llm.chat([{"role": "user", "content": prompt}])

    # -- stage 4 ----------------------------------------------------------------------------------

    def respond(self, state: RequestState, results: dict[int, dict[str, Any]]) -> str:
        return write_answer(state.llm, self.prompts, state.request.user_input, results, state.timeout,
                            state.emit if state._sink else None)


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)
