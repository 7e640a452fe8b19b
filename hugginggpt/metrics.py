"""Prometheus metrics of one orchestrator, served at GET /metrics in the text format.

Each app has its own registry (never prometheus_client's global one): two servers in one process, as in the
tests, count apart, and nothing is shared between them. The worker processes of one server (`http_workers`)
write their values to files in the folder named by PROMETHEUS_MULTIPROC_DIR (set by the supervisor before
they start, prometheus_client's multiprocess mode), and any worker answering /metrics sums them all:
`shared_dir` says which folder.

No label carries a value a caller chooses without a bound (each series is kept for the life of the process,
a histogram's about twenty lines): routes are the app's own rules (anything else is "other"), statuses are
HTTP's, modes, stages and outcomes are this package's constants, LLM backends are `API_TYPES` (a request's
`api_type` is checked against them before any call), model backends are the configured ones, providers are
the Inference Providers huggingface_hub knows, and models are the ids the catalog knows (the curated one or
the catalog store's), at most `MAX_MODEL_LABELS` of them: anything else counts as "other".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .config import API_TYPES

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STAGES = ("plan", "select", "execute", "respond")
# how a call to a hosted Inference Provider ended (backends/hosted.py)
PROVIDER_OUTCOMES = ("ok", "unauthorized", "out_of_credits", "rate_limited", "unavailable", "timeout", "error")
HUB_OUTCOMES = ("unauthorized", "rate_limited", "unavailable", "timeout", "error")  # a failed Hub lookup's
LLM_BACKENDS = (*API_TYPES, "none")  # a request's api_type is one of API_TYPES (llm.with_overrides checks it)
OTHER = "other"  # the one label value every value outside a label's bound counts as
MAX_MODEL_LABELS = 200  # distinct model ids with series of their own, the second guard after "the catalog knows it"
CONTENT_TYPE = CONTENT_TYPE_LATEST


class BoundedLabel:
    """The values one label may take: a value `known` accepts keeps its name while fewer than `cap` names are
    in use; anything else, and every new name past the cap, is "other".

    `known` is asked once per new value that it accepts (a value already in use answers from memory), so it may
    query a database; one that raises counts the value as unknown.
    """

    def __init__(self, known: Callable[[str], bool] | None = None, cap: int = MAX_MODEL_LABELS):
        self.known = known
        self.cap = cap
        self.used: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self.used:
            return value
        if len(self.used) >= self.cap or self.known is None or not isinstance(value, str):
            return OTHER
        try:
            if not self.known(value):
                return OTHER
        except Exception:  # noqa: BLE001 - a failed look-up must not fail the call being counted
            return OTHER
        with self._lock:
            if value not in self.used and len(self.used) >= self.cap:
                return OTHER
            self.used.add(value)
        return value


def one_of(value: str, allowed: Collection[str], fallback: str = OTHER) -> str:
    return value if value in allowed else fallback


def catalog_knows(engine: Any) -> Callable[[str], bool]:
    """Does `engine` (a HuggingGPT) know this model id: its curated catalog, or its catalog store once open?"""

    def known(model_id: str) -> bool:
        if engine.catalog.get(model_id) is not None:
            return True
        store = getattr(engine, "catalog_store", None)
        return store is not None and bool(store.known_ids([model_id]))

    return known


class Metrics:
    def __init__(self, known_model: Callable[[str], bool] | None = None,
                 backends: Collection[str] | None = None) -> None:
        """known_model: is this model id one to count under its own name (`catalog_knows`); None: every model
        counts as "other". backends: the model backends' names (the engine's), any other is "other"."""
        self.model_label = BoundedLabel(known_model)
        self.backends = frozenset(backends if backends is not None else ("local", "huggingface"))
        self.shared_dir: Path | None = None  # set in a worker: /metrics sums every worker's files there
        r = self.registry = CollectorRegistry()
        self.http_requests = Counter("hugginggpt_http_requests", "HTTP requests answered, by route and status",
                                     ["route", "status"], registry=r)
        self.request_seconds = Histogram("hugginggpt_request_seconds", "Pipeline requests from start to answer, "
                                         "by mode and outcome", ["mode", "outcome"], buckets=SECONDS, registry=r)
        self.stage_seconds = Histogram("hugginggpt_stage_seconds", "Time in each stage of a request (select: per "
                                       "task, while the plan streams or dependencies run)", ["stage"],
                                       buckets=SECONDS, registry=r)
        self.llm_calls = Counter("hugginggpt_llm_calls", "LLM calls by backend kind and outcome (ok, error)",
                                 ["backend", "outcome"], registry=r)
        self.llm_seconds = Histogram("hugginggpt_llm_seconds", "LLM call latency by backend kind", ["backend"],
                                     buckets=SECONDS, registry=r)
        self.llm_tokens = Counter("hugginggpt_llm_tokens", "Tokens the LLM reported using (prompt, completion), by "
                                  "backend kind; calls whose backend reports no usage add nothing",
                                  ["backend", "kind"], registry=r)
        self.model_calls = Counter("hugginggpt_model_calls", "Model calls by model, backend and outcome (ok, error)",
                                   ["model", "backend", "outcome"], registry=r)
        self.model_seconds = Histogram("hugginggpt_model_seconds", "Model call latency by model and backend",
                                       ["model", "backend"], buckets=SECONDS, registry=r)
        self.provider_calls = Counter("hugginggpt_provider_calls", "Hosted model calls by Inference Provider (a name "
                                      "outside known_providers counts as other) and outcome (" +
                                      ", ".join(PROVIDER_OUTCOMES) + ")", ["provider", "outcome"], registry=r)
        self.provider_seconds = Histogram("hugginggpt_provider_seconds", "Hosted model call latency by Inference "
                                          "Provider", ["provider"], buckets=SECONDS, registry=r)
        self.hub_failures = Counter("hugginggpt_hub_lookup_failures", "Failed lookups of a model on the Hugging Face "
                                    "Hub during hosted inference (ours or huggingface_hub's own), by outcome "
                                    "(unauthorized, rate_limited, unavailable, timeout, error); never counted "
                                    "against a provider", ["outcome"], registry=r)
        self.known_providers: frozenset[str] = frozenset()  # the engine's: huggingface_hub's providers, "endpoint"
        self.rejected = Counter("hugginggpt_admission_rejections", "Requests refused with 429 because "
                                "max_concurrent_requests were running", registry=r)
        self.in_flight = Gauge("hugginggpt_requests_in_flight", "Pipeline requests running now", registry=r,
                               multiprocess_mode="livesum")

    def llm_call(self, backend: str, ok: bool, seconds: float, usage: dict | None = None) -> None:
        backend = one_of(backend, LLM_BACKENDS)
        self.llm_calls.labels(backend, "ok" if ok else "error").inc()
        self.llm_seconds.labels(backend).observe(seconds)
        for kind in ("prompt", "completion"):
            value = (usage or {}).get(f"{kind}_tokens")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self.llm_tokens.labels(backend, kind).inc(value)

    def model_call(self, model: str, backend: str, ok: bool, seconds: float) -> None:
        model, backend = self.model_label(model), one_of(backend, self.backends)
        self.model_calls.labels(model, backend, "ok" if ok else "error").inc()
        self.model_seconds.labels(model, backend).observe(seconds)

    def provider_call(self, provider: str, outcome: str, seconds: float) -> None:
        label = provider if provider in self.known_providers else "other"
        self.provider_calls.labels(label, outcome if outcome in PROVIDER_OUTCOMES else "error").inc()
        self.provider_seconds.labels(label).observe(seconds)

    def hub_failure(self, outcome: str) -> None:
        self.hub_failures.labels(outcome if outcome in HUB_OUTCOMES else "error").inc()

    def exposition(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, path=str(self.shared_dir))
        return generate_latest(every_worker)
