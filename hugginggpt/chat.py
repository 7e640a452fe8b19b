"""The four stages for one request: plan -> select -> execute -> respond.

`HuggingGPT` is built once from a Config (catalog, prompts, backends, caches) and wires the stages; every
call gets its own `RequestState`, so concurrent requests never share tasks, results or keys. Each stage
lives in its own module: `planner.py`, `choose.py` (with `select.py`), `execute.py`, `respond.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from . import cancel
from .admission import Admission, local_slots
from .backends import Backend
from .backends.local import LocalModelsServer
from .catalog import Catalog, KeywordRanker, Ranker
from .catalog.store import CatalogStore
from .checks import CachedCheck, llm_problem
from .choose import decisions, start_selection
from .config import Config
from .errors import DeadlineExceeded
from .execute import Executor, Round
from .llm import ClientCache, LLMClient, with_overrides
from .metrics import Metrics, catalog_knows
from .plan import Plan, Task
from .planner import Planner
from .prompts import PromptSet
from .replan import Replanner, failed_for_good, invalid_tasks
from .request import ChatRequest, EventSink, RequestState, collect_result, validate_messages
from .requestctx import REQUEST_ID, ContextThreadPool
from .respond import answer
from .select import Availability, Selector, control_task_fixup
from .urlpolicy import UrlPolicy

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
        url_policy: UrlPolicy | None = None,
    ):
        """url_policy: for URLs and LLM endpoints that requests name (default: the config's url_allowlist)."""
        self.config = config
        self.prompts = PromptSet.from_config(config)
        self.catalog = Catalog.load(config.catalog_path)
        if ranker is None and config.semantic_ranking:
            from .catalog.semantic import SemanticRanker

            ranker = SemanticRanker.create(config.cache_dir, catalog=self.catalog.cards,
                                           precision=config.embedding_precision)
        self.ranker = ranker or KeywordRanker()
        self.warmed = threading.Event()
        self.catalog_store: CatalogStore | None = None  # opened by `warm`
        self.refreshes_catalog = True  # of several worker processes, one keeps the shared store synced
        self.clients = ClientCache(config.proxy)
        self._llm_check = CachedCheck(lambda: llm_problem(config.llm, config.proxy), ttl=5.0)
        self.url_policy = url_policy or config.url_policy()
        self.local = LocalModelsServer(config.models_server_url, config.public_dir, config.status_timeout,
                                       config.task_timeout, token=config.models_server_token, policy=self.url_policy,
                                       max_output_bytes=config.max_output_bytes, copy_timeout=config.fetch_timeout * 4,
                                       connections=2 * config.max_concurrent_requests)
        self.backends: dict[str, Backend] = backends if backends is not None else self._default_backends()
        self.replanner = Replanner(config.max_replans)
        self.planner = Planner(config, self.prompts, self.replanner)
        self.availability = Availability(self.backends, ttl=config.status_cache_seconds)
        self.selector = Selector(
            catalog=self.catalog, ranker=self.ranker, availability=self.availability, prompts=self.prompts,
            inference_mode=config.inference_mode, num_candidates=config.num_candidate_models,
            max_description_length=config.max_description_length,
            language=config.preferred_language, max_size_mb=config.max_model_size_mb,
            choose=config.choose_model, margin=config.choose_model_margin,
            allowed=config.allowed_models, denied=config.denied_models,
        )
        # this engine's own registry (GET /metrics); a model outside the catalog counts as "other"
        self.metrics = Metrics(known_model=catalog_knows(self), backends=self.backends)
        # max_concurrent_requests, for every door (HTTP, /v1, MCP, Gradio); a worker process swaps in the slots
        # it shares with the other workers (`workers.SharedSlots`)
        self.admission: Admission = local_slots(config.max_concurrent_requests)
        self.executor = Executor(config, self.backends, self.url_policy, observe_model=self.metrics.model_call)
        hosted = self.backends.get("huggingface")
        if hasattr(hosted, "observe_provider"):  # each Inference Provider call, by provider (bounded labels)
            from .backends.hosted import ENDPOINT, known_providers

            self.metrics.known_providers = frozenset((*known_providers(), ENDPOINT))
            hosted.observe_provider = self.metrics.provider_call
            hosted.observe_hub = self.metrics.hub_failure
        self.selection_threads = ContextThreadPool(max_workers=max(16, 4 * config.max_concurrent_requests),
                                                   thread_name_prefix="select")

    def warm(self) -> None:
        """Load the ranking model, embed the catalog and open the catalog store now, not on the first request.
        Until the store is open, models are chosen from the curated catalog in memory."""
        warm = getattr(self.ranker, "warm", None)
        if warm is not None:
            try:
                warm(self.catalog.cards)
                self.ranker.load()
            except Exception:  # noqa: BLE001 - ranking falls back per request if this fails
                log.exception("warming the model ranker failed")
        try:
            self.open_catalog_store()
        except Exception:  # noqa: BLE001 - selection keeps the curated catalog
            log.exception("opening the catalog store %s failed; choosing from %s", self.config.catalog_store,
                          self.config.catalog_path)
        self.warmed.set()

    def open_catalog_store(self) -> None:
        """The Hub catalog (`catalog_store`, with the curated rows imported): selection ranks from it, every
        model run is recorded in its health table, and `catalog_refresh_hours` keeps it synced."""
        from .catalog.embedders import HashEmbedder, SemanticEmbedder
        from .catalog.store import open_store

        # the ranker's own sentence vectors (reused for the curated cards); without its model, hashed words
        semantic = hasattr(self.ranker, "card_vector")
        store = open_store(self.config, SemanticEmbedder.from_ranker(self.ranker, self.catalog.cards) if semantic
                           else HashEmbedder())
        self.catalog_store = store
        if self.config.huggingface_providers:  # a model only other providers serve is not hosted here
            store.allowed_providers = frozenset(self.config.huggingface_providers)
        self.executor.health = store.health
        self.executor.records_health_of = catalog_knows(self)
        self.selector.use_store(store)
        log.info("catalog store %s: %d models in %d tasks", store.path, store.count(), len(store.tasks()))
        if self.config.catalog_refresh_hours > 0 and self.refreshes_catalog:
            from .catalog.hub_api import HubClient
            from .catalog.sync import HUB_TASKS, BackgroundRefresh

            client = HubClient(self.config.catalog_endpoint, self.config.huggingface_token)
            BackgroundRefresh(store, client, self.config.catalog_sync_tasks or HUB_TASKS,
                              self.config.catalog_refresh_hours, self.config.catalog_sync_per_task).start()

    def checks(self, fresh: bool = False) -> dict[str, str | None]:
        """What is down: per dependency None (it answers), "unused", or one line saying what is wrong. The LLM
        check is cached for a few seconds (`/health` may be polled); `fresh` asks again."""
        from .checks import models_server_problem

        llm = self._llm_check.check() if fresh else self._llm_check()
        if "local" in self.backends:
            models = models_server_problem(self.config.models_server_url, self.config.models_server_token,
                                           timeout=self.config.status_timeout)
        else:
            models = "unused"
        return {"llm": llm, "models_server": models}

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

    def llm_for(self, request: ChatRequest) -> LLMClient:
        return self.clients.get(with_overrides(self.config.llm, request.api_key, request.api_type,
                                               request.api_endpoint, request.model,
                                               allow_endpoints=self.config.allow_request_endpoints,
                                               policy=self.url_policy))

    # -- the pipeline -----------------------------------------------------------------------------

    def run(
        self,
        request: ChatRequest,
        mode: str = "answer",
        on_event: EventSink | None = None,
        state_ready: Callable[[RequestState], None] | None = None,
    ) -> Any:
        """mode: "answer" (/hugginggpt), "tasks" (/tasks), "results" (/results), "decisions"."""
        state = RequestState(request, self.llm_for(request), on_event, self.config.request_timeout,
                             observe_llm=self.metrics.llm_call)
        state.executes = mode in ("answer", "results")
        if state_ready:
            state_ready(state)
        token = REQUEST_ID.set(request.request_id)  # every log line of this request names it, on any thread
        cancel_token = cancel.CURRENT.set(state.cancel_token)  # and its I/O, on any thread, stops on cancel()
        self.metrics.in_flight.inc()
        started, outcome = time.perf_counter(), "error"
        try:
            result = self._run(state, mode)
            outcome = "ok"
            return result
        finally:
            if state.cancelled.is_set():
                outcome = "cancelled"
            self.metrics.in_flight.dec()
            self.metrics.request_seconds.labels(mode, outcome).observe(time.perf_counter() - started)
            cancel.CURRENT.reset(cancel_token)
            REQUEST_ID.reset(token)

    def _stage(self, name: str, started: float) -> None:
        self.metrics.stage_seconds.labels(name).observe(time.perf_counter() - started)

    def _run(self, state: RequestState, mode: str) -> Any:
        request = state.request
        log.info("[%s] request (%s): %.200s", request.request_id, mode, request.user_input)
        streamed = StreamedStart(self, state) if mode in ("answer", "results") and self.config.stream_plan else None

        # 1. plan (tasks final in the streamed plan are already selected and running)
        started = time.perf_counter()
        planned = self.planner.plan(state, streamed)
        self._stage("plan", started)
        if planned.plan is None:
            state.emit("answer", {"message": planned.reply})
            return {"message": planned.reply}
        plan = planned.plan
        if mode == "tasks":
            return plan.to_list()
        # 2. select every task's model, in parallel
        self.select(state, plan.tasks)
        if mode == "decisions":
            return decisions(state, plan)
        # 3. execute: the rest of the plan joins the streamed round (or a new one); then recover by replanning
        rest = [t for t in plan.tasks if t.id not in planned.streamed]
        started = time.perf_counter()
        self.executor.execute(state, rest, streamed.round if streamed is not None and planned.streamed else None)
        self.recover(state, plan)
        self._stage("execute", started)
        with state.lock:
            results = {tid: state.results[tid] for tid in sorted(state.results)}
        if state.cancelled.is_set():
            log.info("[%s] cancelled; no answer written", request.request_id)
            return {"message": "", "cancelled": True}
        if mode == "results":
            return results
        # 4. respond
        started = time.perf_counter()
        message = answer(state, self.prompts, results, self.replanner.max_replans)
        self._stage("respond", started)
        log.info("[%s] answered in %.2fs", request.request_id, time.perf_counter() - state.started)
        return {"message": message}

    def select(self, state: RequestState, tasks: list[Task]) -> None:
        start_selection(state, self.selector, tasks, self.selection_threads,
                        self.config.logit_bias.get("choose_model", 0.0),
                        observe_seconds=self.metrics.stage_seconds.labels("select").observe)

    def recover(self, state: RequestState, plan: Plan) -> None:
        """Replan the remaining work when tasks failed on every model (at most max_replans times)."""
        while self.replanner.allowed(state) and not state.cancelled.is_set():
            with state.lock:
                results = dict(state.results)
            failures = failed_for_good(plan, results)
            if not failures:
                return
            with state.lock:
                refused = set(state.refused)
            if refused >= set(self.selector.backends_in_order()):
                # every backend this server runs models on refused the account (a bad token, no credits): a new
                # plan would be sent to the same refusal, at the cost of another LLM call
                log.info("[%s] no replan: every backend refused the account", state.request.request_id)
                return
            state.replan_attempts += 1
            finished = frozenset(t for t, r in results.items() if "error" not in r["inference result"])
            reason = "; ".join(failures)
            try:
                new = self.replanner.ask(state, state.planner_messages, state.plan_reply,
                                         f"{reason}.\nWhat ran so far: {self.replanner.context(plan, results)}",
                                         finished, max(results) + 1,
                                         self.planner.chat_kwargs(state.llm.settings.api_type))
            except DeadlineExceeded:
                return  # the deadline passed before or while the LLM replanned: answer with what finished, not a 504
            if new is None or invalid_tasks(new) or len(new.tasks) > self.config.max_tasks:
                return
            for task in new.tasks:
                control_task_fixup(task)
            self.replanner.record(state, reason, new)
            self.select(state, new.tasks)
            self.executor.execute(state, new.tasks)
            plan = new


class StreamedStart:
    """The planner's task sink: a task final in the streamed plan has its model chosen and joins one round."""

    def __init__(self, engine: HuggingGPT, state: RequestState):
        self.engine = engine
        self.state = state
        self.round: Round | None = None

    def start(self, task: Task) -> None:
        control_task_fixup(task)
        if self.round is None:
            self.round = self.engine.executor.begin(self.state)
        self.engine.select(self.state, [task])
        self.round.add(task)

    def stop(self) -> None:
        if self.round is not None:
            self.round.scheduler.cancel("the full plan replaced the streamed one")
            self.round = None
        with self.state.lock:
            self.state.selections.clear()
