"""Edge cases of hugginggpt/metrics.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md).

What a user sees is the text /metrics serves (Prometheus' exposition format): metric names, HELP lines, label
names and values, buckets and counts. These tests read that text.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from prometheus_client import values

from hugginggpt.metrics import (
    CONTENT_TYPE,
    MAX_MODEL_LABELS,
    BoundedLabel,
    Metrics,
    catalog_knows,
    one_of,
)


def text(metrics: Metrics) -> str:
    return metrics.exposition().decode()


def samples(metrics: Metrics) -> list[str]:
    """The sample lines, without the `_created` timestamps (they change on every run)."""
    return [line for line in text(metrics).splitlines()
            if line and not line.startswith("#") and "_created" not in line]


def header(metrics: Metrics) -> list[str]:
    return [line for line in text(metrics).splitlines()
            if line.startswith("#") and "_created" not in line]


def test_content_type_is_prometheus_text_format():
    assert CONTENT_TYPE.startswith("text/plain; version=")
    assert "charset=utf-8" in CONTENT_TYPE


def test_every_metric_has_its_name_type_and_help_as_scraped():
    assert header(Metrics()) == [
        "# HELP hugginggpt_http_requests_total HTTP requests answered, by route and status",
        "# TYPE hugginggpt_http_requests_total counter",
        "# HELP hugginggpt_request_seconds Pipeline requests from start to answer, by mode and outcome",
        "# TYPE hugginggpt_request_seconds histogram",
        "# HELP hugginggpt_stage_seconds Time in each stage of a request (select: per task, while the plan streams"
        " or dependencies run)",
        "# TYPE hugginggpt_stage_seconds histogram",
        "# HELP hugginggpt_llm_calls_total LLM calls by backend kind and outcome (ok, error)",
        "# TYPE hugginggpt_llm_calls_total counter",
        "# HELP hugginggpt_llm_seconds LLM call latency by backend kind",
        "# TYPE hugginggpt_llm_seconds histogram",
        "# HELP hugginggpt_llm_tokens_total Tokens the LLM reported using (prompt, completion), by backend kind;"
        " calls whose backend reports no usage add nothing",
        "# TYPE hugginggpt_llm_tokens_total counter",
        "# HELP hugginggpt_model_calls_total Model calls by model, backend and outcome (ok, error)",
        "# TYPE hugginggpt_model_calls_total counter",
        "# HELP hugginggpt_model_seconds Model call latency by model and backend",
        "# TYPE hugginggpt_model_seconds histogram",
        "# HELP hugginggpt_provider_calls_total Hosted model calls by Inference Provider (a name outside"
        " known_providers counts as other) and outcome (ok, unauthorized, out_of_credits, rate_limited,"
        " unavailable, timeout, error)",
        "# TYPE hugginggpt_provider_calls_total counter",
        "# HELP hugginggpt_provider_seconds Hosted model call latency by Inference Provider",
        "# TYPE hugginggpt_provider_seconds histogram",
        "# HELP hugginggpt_hub_lookup_failures_total Failed lookups of a model on the Hugging Face Hub during hosted"
        " inference (ours or huggingface_hub's own), by outcome (unauthorized, rate_limited, unavailable, timeout,"
        " error); never counted against a provider",
        "# TYPE hugginggpt_hub_lookup_failures_total counter",
        "# HELP hugginggpt_admission_rejections_total Requests refused with 429 because max_concurrent_requests"
        " were running",
        "# TYPE hugginggpt_admission_rejections_total counter",
        "# HELP hugginggpt_requests_in_flight Pipeline requests running now",
        "# TYPE hugginggpt_requests_in_flight gauge",
    ]


def test_a_fresh_server_shows_zero_rejections_and_nothing_in_flight():
    assert samples(Metrics()) == ["hugginggpt_admission_rejections_total 0.0", "hugginggpt_requests_in_flight 0.0"]


BUCKETS = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0",
           "120.0", "300.0", "600.0", "+Inf"]


def bucket_bounds(metrics: Metrics, name: str) -> list[str]:
    return [line.split('le="', 1)[1].split('"', 1)[0] for line in samples(metrics) if line.startswith(name + "_bucket")]


@pytest.mark.parametrize("observe, name", [
    (lambda m: m.request_seconds.labels("chat", "ok").observe(0.2), "hugginggpt_request_seconds"),
    (lambda m: m.stage_seconds.labels("plan").observe(0.2), "hugginggpt_stage_seconds"),
    (lambda m: m.llm_call("openai", True, 0.2), "hugginggpt_llm_seconds"),
    (lambda m: m.model_call("m", "local", True, 0.2), "hugginggpt_model_seconds"),
    (lambda m: m.provider_call("p", "ok", 0.2), "hugginggpt_provider_seconds"),
])
def test_latency_histograms_have_buckets_from_5ms_to_10_minutes(observe, name):
    metrics = Metrics()
    observe(metrics)
    assert bucket_bounds(metrics, name) == BUCKETS


def test_a_latency_falls_in_every_bucket_at_or_above_it():
    metrics = Metrics()
    metrics.stage_seconds.labels("select").observe(0.3)
    metrics.stage_seconds.labels("select").observe(700.0)
    lines = [line for line in samples(metrics) if line.startswith("hugginggpt_stage_seconds")]
    counts = [line.rsplit(" ", 1)[1] for line in lines if "_bucket" in line]
    assert counts == ["0.0"] * 6 + ["1.0"] * 10 + ["2.0"]
    assert 'hugginggpt_stage_seconds_count{stage="select"} 2.0' in lines
    assert 'hugginggpt_stage_seconds_sum{stage="select"} 700.3' in lines


def test_http_requests_and_rejections_count_by_route_and_status():
    metrics = Metrics()
    metrics.http_requests.labels("/hugginggpt", "200").inc()
    metrics.http_requests.labels("/hugginggpt", "200").inc()
    metrics.http_requests.labels("other", "404").inc()
    metrics.rejected.inc()
    metrics.in_flight.inc()
    metrics.in_flight.inc()
    metrics.in_flight.dec()
    assert samples(metrics) == [
        'hugginggpt_http_requests_total{route="/hugginggpt",status="200"} 2.0',
        'hugginggpt_http_requests_total{route="other",status="404"} 1.0',
        "hugginggpt_admission_rejections_total 1.0",
        "hugginggpt_requests_in_flight 1.0",
    ]


def test_request_seconds_are_labelled_by_mode_and_outcome():
    metrics = Metrics()
    metrics.request_seconds.labels("stream", "error").observe(1.5)
    assert 'hugginggpt_request_seconds_count{mode="stream",outcome="error"} 1.0' in samples(metrics)


def test_llm_call_counts_by_backend_and_outcome_and_adds_reported_tokens():
    metrics = Metrics()
    metrics.llm_call("openai", True, 0.5, {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150})
    metrics.llm_call("openai", False, 2.0, None)
    metrics.llm_call("azure", True, 0.1, {"prompt_tokens": 7})
    metrics.llm_call("local", True, 0.1, {})
    metrics.llm_call("none", True, 0.1)
    lines = samples(metrics)
    assert [line for line in lines if line.startswith("hugginggpt_llm_calls_total")] == [
        'hugginggpt_llm_calls_total{backend="openai",outcome="ok"} 1.0',
        'hugginggpt_llm_calls_total{backend="openai",outcome="error"} 1.0',
        'hugginggpt_llm_calls_total{backend="azure",outcome="ok"} 1.0',
        'hugginggpt_llm_calls_total{backend="local",outcome="ok"} 1.0',
        'hugginggpt_llm_calls_total{backend="none",outcome="ok"} 1.0',
    ]
    assert [line for line in lines if line.startswith("hugginggpt_llm_tokens_total")] == [
        'hugginggpt_llm_tokens_total{backend="openai",kind="prompt"} 120.0',
        'hugginggpt_llm_tokens_total{backend="openai",kind="completion"} 30.0',
        'hugginggpt_llm_tokens_total{backend="azure",kind="prompt"} 7.0',
    ]
    assert [line for line in lines if line.startswith("hugginggpt_llm_seconds_count")] == [
        'hugginggpt_llm_seconds_count{backend="openai"} 2.0',
        'hugginggpt_llm_seconds_count{backend="azure"} 1.0',
        'hugginggpt_llm_seconds_count{backend="local"} 1.0',
        'hugginggpt_llm_seconds_count{backend="none"} 1.0',
    ]
    assert 'hugginggpt_llm_seconds_sum{backend="openai"} 2.5' in lines


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 0, "completion_tokens": -5},
    {"prompt_tokens": True, "completion_tokens": True},  # a bool is not a count
    {"prompt_tokens": "12", "completion_tokens": 3.0},
    {"prompt_tokens": None},
])
def test_llm_usage_that_is_not_a_positive_integer_adds_no_tokens(usage):
    metrics = Metrics()
    metrics.llm_call("openai", True, 0.1, usage)
    assert not [line for line in samples(metrics) if line.startswith("hugginggpt_llm_tokens_total")]
    assert 'hugginggpt_llm_calls_total{backend="openai",outcome="ok"} 1.0' in samples(metrics)


def test_one_token_counts():
    metrics = Metrics()
    metrics.llm_call("local", True, 0.1, {"completion_tokens": 1})
    assert 'hugginggpt_llm_tokens_total{backend="local",kind="completion"} 1.0' in samples(metrics)


def test_model_calls_by_known_model_backend_and_outcome():
    metrics = Metrics(known_model={"dslim/bert-base-NER"}.__contains__)
    metrics.model_call("dslim/bert-base-NER", "huggingface", True, 0.25)
    metrics.model_call("dslim/bert-base-NER", "huggingface", False, 0.5)
    metrics.model_call("someone/else", "local", True, 1.0)
    lines = samples(metrics)
    assert [line for line in lines if line.startswith("hugginggpt_model_calls_total")] == [
        'hugginggpt_model_calls_total{backend="huggingface",model="dslim/bert-base-NER",outcome="ok"} 1.0',
        'hugginggpt_model_calls_total{backend="huggingface",model="dslim/bert-base-NER",outcome="error"} 1.0',
        'hugginggpt_model_calls_total{backend="local",model="other",outcome="ok"} 1.0',
    ]
    assert 'hugginggpt_model_seconds_count{backend="huggingface",model="dslim/bert-base-NER"} 2.0' in lines
    assert 'hugginggpt_model_seconds_sum{backend="huggingface",model="dslim/bert-base-NER"} 0.75' in lines
    assert 'hugginggpt_model_seconds_sum{backend="local",model="other"} 1.0' in lines


def test_without_a_model_lookup_every_model_counts_as_other():
    metrics = Metrics()
    metrics.model_call("dslim/bert-base-NER", "local", True, 0.1)
    assert 'hugginggpt_model_calls_total{backend="local",model="other",outcome="ok"} 1.0' in samples(metrics)


def test_default_backends_are_local_and_huggingface():
    metrics = Metrics()
    for backend in ("local", "huggingface", "hosted"):
        metrics.model_call("m", backend, True, 0.1)
    assert [line for line in samples(metrics) if line.startswith("hugginggpt_model_calls_total")] == [
        'hugginggpt_model_calls_total{backend="local",model="other",outcome="ok"} 1.0',
        'hugginggpt_model_calls_total{backend="huggingface",model="other",outcome="ok"} 1.0',
        'hugginggpt_model_calls_total{backend="other",model="other",outcome="ok"} 1.0',
    ]


def test_configured_backends_replace_the_defaults():
    metrics = Metrics(backends=["hosted"])
    metrics.model_call("m", "hosted", True, 0.1)
    metrics.model_call("m", "local", True, 0.1)
    assert [line for line in samples(metrics) if line.startswith("hugginggpt_model_calls_total")] == [
        'hugginggpt_model_calls_total{backend="hosted",model="other",outcome="ok"} 1.0',
        'hugginggpt_model_calls_total{backend="other",model="other",outcome="ok"} 1.0',
    ]
    empty = Metrics(backends=[])
    empty.model_call("m", "local", True, 0.1)
    assert 'hugginggpt_model_calls_total{backend="other",model="other",outcome="ok"} 1.0' in samples(empty)


@pytest.mark.parametrize("outcome", ["ok", "unauthorized", "out_of_credits", "rate_limited", "unavailable",
                                     "timeout", "error"])
def test_provider_outcomes_keep_their_names(outcome):
    metrics = Metrics()
    metrics.known_providers = frozenset({"together"})
    metrics.provider_call("together", outcome, 0.5)
    lines = samples(metrics)
    assert f'hugginggpt_provider_calls_total{{outcome="{outcome}",provider="together"}} 1.0' in lines
    assert 'hugginggpt_provider_seconds_count{provider="together"} 1.0' in lines
    assert 'hugginggpt_provider_seconds_sum{provider="together"} 0.5' in lines


def test_unknown_provider_and_outcome_count_as_other_and_error():
    metrics = Metrics()
    metrics.known_providers = frozenset({"together"})
    metrics.provider_call("made-up", "exploded", 0.5)
    lines = samples(metrics)
    assert 'hugginggpt_provider_calls_total{outcome="error",provider="other"} 1.0' in lines
    assert 'hugginggpt_provider_seconds_count{provider="other"} 1.0' in lines
    assert "made-up" not in text(metrics) and "exploded" not in text(metrics)


def test_providers_are_unknown_until_the_engine_names_them():
    metrics = Metrics()
    metrics.provider_call("together", "ok", 0.5)
    assert 'hugginggpt_provider_calls_total{outcome="ok",provider="other"} 1.0' in samples(metrics)


def test_two_servers_in_one_process_count_apart():
    a, b = Metrics(), Metrics()
    a.rejected.inc()
    assert "hugginggpt_admission_rejections_total 1.0" in samples(a)
    assert "hugginggpt_admission_rejections_total 0.0" in samples(b)


def test_workers_values_are_summed_from_the_shared_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    workers = []
    for pid in (101, 102):
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(process_identifier=lambda pid=pid: pid))
        worker = Metrics()
        worker.shared_dir = tmp_path
        worker.rejected.inc()
        worker.in_flight.inc(pid - 100)
        worker.http_requests.labels("/tasks", "200").inc()
        workers.append(worker)
    for worker in workers:
        lines = samples(worker)
        assert "hugginggpt_admission_rejections_total 2.0" in lines
        assert "hugginggpt_requests_in_flight 3.0" in lines
        assert 'hugginggpt_http_requests_total{route="/tasks",status="200"} 2.0' in lines


def test_an_empty_shared_folder_shows_no_series(tmp_path):
    metrics = Metrics()
    metrics.rejected.inc()
    metrics.shared_dir = tmp_path
    assert metrics.exposition() == b""


# BoundedLabel, one_of, catalog_knows


def test_bounded_label_keeps_known_names_up_to_the_cap_then_other():
    asked = []
    label = BoundedLabel(lambda v: asked.append(v) or v.startswith("ok"), cap=2)
    assert label("ok-a") == "ok-a"
    assert label("bad") == "other"
    assert label("ok-b") == "ok-b"
    assert label("ok-c") == "other"  # past the cap
    assert label("ok-a") == "ok-a"  # a name in use keeps it
    assert asked == ["ok-a", "bad", "ok-b"]  # a name in use, or one past the cap, is not looked up again
    assert label.used == {"ok-a", "ok-b"}


def test_bounded_label_default_cap_is_max_model_labels():
    label = BoundedLabel(lambda v: True)
    assert MAX_MODEL_LABELS == 200
    names = [label(f"m{i}") for i in range(MAX_MODEL_LABELS + 1)]
    assert names[:-1] == [f"m{i}" for i in range(MAX_MODEL_LABELS)]
    assert names[-1] == "other"


def test_bounded_label_without_lookup_or_with_a_failing_one_is_other():
    assert BoundedLabel()("x") == "other"

    def boom(value):
        raise RuntimeError("database gone")

    label = BoundedLabel(boom)
    assert label("x") == "other"
    assert label.used == set()


def test_bounded_label_counts_truthy_lookups_as_known():
    label = BoundedLabel(lambda v: {"a": 1, "b": 0, "c": None}.get(v))
    assert [label("a"), label("b"), label("c")] == ["a", "other", "other"]


def test_bounded_label_refuses_non_string_values():
    label = BoundedLabel(lambda v: True)
    assert label(123) == "other"  # type: ignore[arg-type]
    assert label(None) == "other"  # type: ignore[arg-type]
    assert label.used == set()


def test_bounded_label_cap_holds_for_new_names_looked_up_at_once():
    """Two new names pass the cap check together while their look-ups run: only one gets a series."""
    both = threading.Barrier(2, timeout=5)

    def known(value):
        both.wait()
        return True

    label = BoundedLabel(known, cap=1)
    got = {}
    threads = [threading.Thread(target=lambda v=v: got.__setitem__(v, label(v))) for v in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(got.values()) == sorted([next(iter(label.used)), "other"])
    assert len(label.used) == 1


def test_bounded_label_same_new_name_looked_up_at_once_keeps_it():
    both = threading.Barrier(2, timeout=5)

    def known(value):
        both.wait()
        return True

    label = BoundedLabel(known, cap=1)
    got = []
    threads = [threading.Thread(target=lambda: got.append(label("a"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert got == ["a", "a"]


def test_one_of():
    assert one_of("a", {"a", "b"}) == "a"
    assert one_of("c", {"a", "b"}) == "other"
    assert one_of("c", {"a", "b"}, "none") == "none"


def test_catalog_knows_the_curated_catalog_then_the_store():
    class Catalog:
        def get(self, model_id):
            return object() if model_id == "curated/one" else None

    class Store:
        def __init__(self):
            self.asked = []

        def known_ids(self, ids):
            self.asked.append(ids)
            return {i for i in ids if i == "stored/one"}

    store = Store()
    known = catalog_knows(SimpleNamespace(catalog=Catalog(), catalog_store=store))
    assert known("curated/one") is True
    assert store.asked == []  # the curated catalog answers first
    assert known("stored/one") is True
    assert known("nobody/knows") is False
    assert store.asked == [["stored/one"], ["nobody/knows"]]


def test_catalog_knows_without_a_store_open():
    catalog = SimpleNamespace(get=lambda model_id: None)
    assert catalog_knows(SimpleNamespace(catalog=catalog))("x") is False
    assert catalog_knows(SimpleNamespace(catalog=catalog, catalog_store=None))("x") is False


def test_catalog_knows_counts_a_curated_card_whatever_its_truth_value():
    catalog = SimpleNamespace(get=lambda model_id: [])  # found, though falsy
    assert catalog_knows(SimpleNamespace(catalog=catalog))("x") is True


def test_hub_lookup_failures_are_counted_by_a_bounded_outcome():
    metrics = Metrics()
    for outcome in ("unauthorized", "rate_limited", "timeout", "ok", "a caller's words"):
        metrics.hub_failure(outcome)
    text = metrics.exposition().decode()
    for outcome, count in (("unauthorized", 1), ("rate_limited", 1), ("timeout", 1), ("error", 2)):
        assert f'hugginggpt_hub_lookup_failures_total{{outcome="{outcome}"}} {count}.0' in text, outcome
    assert "caller" not in text and 'outcome="ok"' not in text
