"""The models server's Prometheus metrics (modelhost/metrics.py) in-process: what a scrape of GET /metrics shows,
read back with prometheus_client's own parser. The engine is a plain object with the attributes the app's
engines have (`loaded()`, `pool` with `budget`, `loads`, `evictions`, `registry.catalog_ids`)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from hugginggpt.modelhost.metrics import CONTENT_TYPE, SECONDS, ModelsMetrics

CATALOG = ("acme/sd", "acme/bert")
GIB = 2**30


def engine(loaded=None, pool=True, budget=8 * GIB, loads=3, evictions=("acme/old",), catalog=CATALOG):
    held = loaded if loaded is not None else {}
    the_pool = SimpleNamespace(budget=budget, loads=loads, evictions=list(evictions)) if pool else None
    return SimpleNamespace(loaded=lambda: held, pool=the_pool, registry=SimpleNamespace(catalog_ids=catalog))


def scrape(metrics: ModelsMetrics) -> dict[str, dict]:
    """family name -> {"help": ..., "type": ..., "samples": {(name, labels as sorted tuple): value}}"""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        out[family.name] = {"help": family.documentation, "type": family.type,
                            "samples": {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}}
    return out


def test_calls_are_counted_by_model_and_outcome_with_their_latency():
    metrics = ModelsMetrics(engine())
    metrics.call("acme/sd", True, 0.3)
    metrics.call("acme/sd", True, 0.02)
    metrics.call("acme/sd", False, 7.0)
    metrics.call("acme/sd", False, 0.01, cancelled=True)  # its client left: not the model's error
    got = scrape(metrics)
    calls = got["models_server_calls"]
    assert calls["type"] == "counter" and calls["help"] == "Inference calls by model and outcome (ok, error, cancelled)"
    assert calls["samples"][("models_server_calls_total", (("model", "acme/sd"), ("outcome", "ok")))] == 2
    assert calls["samples"][("models_server_calls_total", (("model", "acme/sd"), ("outcome", "error")))] == 1
    assert calls["samples"][("models_server_calls_total", (("model", "acme/sd"), ("outcome", "cancelled")))] == 1
    seconds = got["models_server_call_seconds"]
    assert seconds["type"] == "histogram" and seconds["help"] == "Inference latency by model (loading included)"
    buckets = {dict(labels)["le"]: v for (name, labels), v in seconds["samples"].items()
               if name == "models_server_call_seconds_bucket"}
    assert [float(le) for le in buckets if le != "+Inf"] == list(SECONDS)
    assert buckets["0.025"] == 2 and buckets["0.25"] == 2 and buckets["0.5"] == 3 and buckets["5.0"] == 3
    assert buckets["10.0"] == 4 and buckets["+Inf"] == 4
    assert seconds["samples"][("models_server_call_seconds_sum", (("model", "acme/sd"),))] == 0.3 + 0.02 + 7.0 + 0.01


def test_the_catalog_keeps_its_names_and_discovered_models_theirs_up_to_the_cap():
    metrics = ModelsMetrics(engine(), cap=2)
    for model in ("acme/bert", "hub/one", "hub/two", "hub/three", "acme/sd"):
        metrics.call(model, True, 0.1)
    models = {dict(labels)["model"] for (name, labels) in scrape(metrics)["models_server_calls"]["samples"]}
    assert models == {"acme/bert", "acme/sd", "hub/one", "hub/two", "other"}  # the third discovered is "other"
    assert metrics.model_label("acme/sd") == "acme/sd" and metrics.model_label("hub/one") == "hub/one"


def test_an_engine_without_a_catalog_counts_every_model_as_discovered():
    metrics = ModelsMetrics(SimpleNamespace(loaded=dict, pool=None, registry=None), cap=1)
    assert metrics.model_label("hub/one") == "hub/one" and metrics.model_label("hub/two") == "other"


def test_the_pool_is_read_at_scrape_time():
    held = {"acme/sd": SimpleNamespace(nbytes=3 * GIB), "acme/bert": SimpleNamespace(nbytes=None),
            "acme/odd": object()}  # an entry without nbytes (an engine's own) counts as nothing
    eng = engine(loaded=held)
    metrics = ModelsMetrics(eng)
    got = scrape(metrics)
    assert got["models_server_models_loaded"]["samples"] == {("models_server_models_loaded", ()): 3}
    assert got["models_server_models_loaded"]["help"] == "Models held in memory now"
    assert got["models_server_memory_used_bytes"]["samples"] == {("models_server_memory_used_bytes", ()): 3 * GIB}
    assert got["models_server_memory_used_bytes"]["help"] == "Memory the loaded models take"
    assert got["models_server_memory_budget_bytes"]["samples"] == {("models_server_memory_budget_bytes", ()): 8 * GIB}
    assert got["models_server_memory_budget_bytes"]["help"] == "memory_budget_gb, in bytes"
    assert got["models_server_model_loads"]["samples"] == {("models_server_model_loads_total", ()): 3}
    assert got["models_server_model_loads"]["help"] == "Models loaded since start"
    assert got["models_server_model_evictions"]["samples"] == {("models_server_model_evictions_total", ()): 1}
    assert got["models_server_model_evictions"]["help"] == "Models evicted to stay under the budget"
    del held["acme/odd"]  # the pool changed: the next scrape says so
    eng.pool.evictions.append("acme/odd")
    again = scrape(metrics)
    assert again["models_server_models_loaded"]["samples"] == {("models_server_models_loaded", ()): 2}
    assert again["models_server_model_evictions"]["samples"] == {("models_server_model_evictions_total", ()): 2}


def test_no_budget_and_no_pool_leave_their_metrics_out():
    got = scrape(ModelsMetrics(engine(budget=None)))
    assert "models_server_memory_budget_bytes" not in got and "models_server_model_loads" in got
    bare = scrape(ModelsMetrics(engine(pool=False)))  # the Ray engine: models live in replicas
    assert "models_server_model_loads" not in bare and "models_server_model_evictions" not in bare
    assert bare["models_server_models_loaded"]["samples"] == {("models_server_models_loaded", ()): 0}
    counts = scrape(ModelsMetrics(SimpleNamespace(loaded=dict, pool=SimpleNamespace(), registry=None)))
    assert counts["models_server_model_loads"]["samples"] == {("models_server_model_loads_total", ()): 0}
    assert counts["models_server_model_evictions"]["samples"] == {("models_server_model_evictions_total", ()): 0}


def test_each_server_has_its_own_registry_and_the_exposition_is_prometheus_text():
    one, two = ModelsMetrics(engine()), ModelsMetrics(engine())
    one.call("acme/sd", True, 0.1)
    assert ("models_server_calls_total", (("model", "acme/sd"), ("outcome", "ok"))) not in \
        scrape(two)["models_server_calls"]["samples"]
    assert CONTENT_TYPE == CONTENT_TYPE_LATEST and isinstance(one.exposition(), bytes)


def test_a_catalog_larger_than_the_discovered_cap_keeps_every_name():
    catalog = tuple(f"acme/model-{n}" for n in range(250))
    metrics = ModelsMetrics(engine(catalog=catalog), cap=2)
    assert all(metrics.model_label(m) == m for m in catalog)


def test_an_engine_without_a_registry_is_counted_too():
    metrics = ModelsMetrics(SimpleNamespace(loaded=dict), cap=1)  # no registry, no pool: an engine of its own
    metrics.call("hub/one", True, 0.1)
    assert ("models_server_calls_total", (("model", "hub/one"), ("outcome", "ok"))) in \
        scrape(metrics)["models_server_calls"]["samples"]
