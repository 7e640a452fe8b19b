"""Prometheus metrics of one models server (GET /metrics): calls by model, and the pool as it is now.

Calls are counted as they are answered; what the pool holds (models loaded, their memory against the budget,
loads and evictions so far) is read from the engine at scrape time, so the numbers cannot drift from it. Each
app has its own registry, never prometheus_client's global one.

The model label is bounded although ids come from the URL: an id is counted only once it named a model this
server ran (the registry's, or a Hub model it discovered and downloaded); the registry's keep their names (the
server's own catalog bounds them), a discovered one keeps its name while fewer than `MAX_MODEL_LABELS`
discovered names are in use, and anything else counts as "other".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..metrics import MAX_MODEL_LABELS, BoundedLabel

SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class PoolCollector:
    """Reads the engine's pool on every scrape (LocalEngine's ModelPool; other engines report what they have)."""

    def __init__(self, engine: Any):
        self.engine = engine

    def collect(self) -> Iterator[Any]:
        loaded = self.engine.loaded()
        yield GaugeMetricFamily("models_server_models_loaded", "Models held in memory now", value=len(loaded))
        used = sum(getattr(entry, "nbytes", 0) or 0 for entry in loaded.values())  # pragma: no mutate: 0 or None alike
        yield GaugeMetricFamily("models_server_memory_used_bytes", "Memory the loaded models take", value=used)
        pool = getattr(self.engine, "pool", None)
        budget = getattr(pool, "budget", None)
        if budget is not None:
            yield GaugeMetricFamily("models_server_memory_budget_bytes", "memory_budget_gb, in bytes", value=budget)
        if pool is not None:
            yield CounterMetricFamily("models_server_model_loads", "Models loaded since start",
                                      value=getattr(pool, "loads", 0))
            yield CounterMetricFamily("models_server_model_evictions", "Models evicted to stay under the budget",
                                      value=len(getattr(pool, "evictions", ())))


class ModelsMetrics:
    def __init__(self, engine: Any, cap: int = MAX_MODEL_LABELS):
        registry = getattr(engine, "registry", None)
        catalog = frozenset(getattr(registry, "catalog_ids", ()) or ())  # pragma: no mutate: None or () alike
        self.catalog_label = BoundedLabel(catalog.__contains__, len(catalog))  # the registry's models, any level
        self.discovered_label = BoundedLabel(lambda _: True, cap)  # those downloaded on request
        r = self.registry = CollectorRegistry()
        self.calls = Counter("models_server_calls", "Inference calls by model and outcome (ok, error, cancelled)",
                             ["model", "outcome"], registry=r)
        self.seconds = Histogram("models_server_call_seconds", "Inference latency by model (loading included)",
                                 ["model"], buckets=SECONDS, registry=r)
        r.register(PoolCollector(engine))

    def model_label(self, model: str) -> str:
        label = self.catalog_label(model)
        return label if label == model else self.discovered_label(model)

    def call(self, model: str, ok: bool, seconds: float, cancelled: bool = False) -> None:
        """model: the id of a model this server ran (never a URL's id before it was found). A call stopped because
        its client left is `cancelled`, not an error of the model's."""
        model = self.model_label(model)
        self.calls.labels(model, "ok" if ok else "cancelled" if cancelled else "error").inc()
        self.seconds.labels(model).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
