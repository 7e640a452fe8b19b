"""Issue 29, hole 4: no metric label carries a value a caller chooses without a bound.

1,000 random model ids run through MCP `run_model` on a real orchestrator (the fake models server serves
them all, as a models server that discovers Hub models, or hosted inference, would): /metrics grows by the
"other" model's series, not by twenty lines per id.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests

from hugginggpt.metrics import MAX_MODEL_LABELS, Metrics
from hugginggpt.modelhost.metrics import ModelsMetrics
from tests.conftest import start_server, stop_server, write_config

CALLS = 1000


@pytest.fixture(scope="module")
def orchestrator(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("labels")
    _, models_url = models_server
    config = write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          max_concurrent_requests=16)
    running = start_server(config, folder)
    yield running
    stop_server(running)


def series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def run_model(session: requests.Session, url: str, model: str, ident: int) -> dict:
    resp = session.post(url + "/mcp", json={"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": {
        "name": "run_model", "arguments": {"task": "text-classification", "model": model, "text": "hi"}}},
        headers={"Accept": "application/json, text/event-stream"}, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()["result"]


def test_random_model_ids_through_mcp_leave_the_series_count_bounded(orchestrator, models):
    ids = [f"caller{secrets.token_hex(4)}/model-{i}" for i in range(CALLS)]
    models.models.update({model: "text-classification" for model in ids})
    url = orchestrator.url
    known = "dslim/bert-base-NER"  # a catalog model: keeps its own label
    warm = requests.Session()
    for i, model in enumerate((known, ids[0])):  # the series of every label the calls below touch exist now
        assert not run_model(warm, url, model, i)["isError"]
    before = series(requests.get(url + "/metrics", timeout=10).text)

    def call(chunk: list[str]) -> list[bool]:
        with requests.Session() as session:  # keep-alive: one connection per thread
            return [run_model(session, url, model, n)["isError"] for n, model in enumerate(chunk)]

    with ThreadPoolExecutor(4) as pool:
        errors = [e for chunk in pool.map(call, [ids[i::4] for i in range(4)]) for e in chunk]
    assert not any(errors)
    assert len({c["model"] for c in models.calls} & set(ids)) == CALLS  # every id really ran
    text = requests.get(url + "/metrics", timeout=10).text
    after = series(text)
    assert len(after) <= len(before) + 5, f"{len(after) - len(before)} new series for {CALLS} model ids"
    assert not any(model in text for model in ids)
    calls = [line for line in after if line.startswith("hugginggpt_model_calls_total{")]
    assert any(f'model="{known}"' in line for line in calls)
    other = next(line for line in calls if 'model="other"' in line and 'outcome="ok"' in line)
    assert float(other.rsplit(" ", 1)[1]) == CALLS + 1
    # nor do they grow the catalog store's health table (a row per model, kept across restarts)
    with sqlite3.connect(orchestrator.log.parent / "catalog.sqlite") as db:
        healthy = [row[0] for row in db.execute("SELECT model FROM health")]
    assert known in healthy and not any(model.startswith("caller") for model in healthy), len(healthy)


def test_the_model_label_has_a_hard_cap_even_for_known_ids():
    metrics = Metrics(known_model=lambda model: True)
    for i in range(3 * MAX_MODEL_LABELS):
        metrics.model_call(f"org/model-{i}", "local", True, 0.1)
    text = metrics.exposition().decode()
    labels = {line.split('model="', 1)[1].split('"', 1)[0] for line in series(text) if 'model="' in line}
    assert len(labels) == MAX_MODEL_LABELS + 1 and "other" in labels
    assert "org/model-0" in labels and f"org/model-{MAX_MODEL_LABELS}" not in labels


def test_backend_and_llm_labels_outside_their_sets_count_as_other():
    metrics = Metrics(known_model=lambda model: False, backends=["local"])
    metrics.model_call("x", "made-up-backend", True, 0.1)
    metrics.llm_call("made-up-api-type", True, 0.1, {"prompt_tokens": 3})
    text = metrics.exposition().decode()
    assert "made-up" not in text
    assert 'hugginggpt_model_calls_total{backend="other",model="other",outcome="ok"} 1.0' in text
    assert 'hugginggpt_llm_calls_total{backend="other",outcome="ok"} 1.0' in text


def test_models_server_counts_catalog_ids_by_name_and_bounds_the_rest():
    """Its ids come from the URL; a discovered model (any Hub id the policy allows) keeps its name only up to the
    cap."""
    engine = SimpleNamespace(registry=SimpleNamespace(catalog_ids=frozenset({"dslim/bert-base-NER"})),
                             loaded=dict, pool=None)
    metrics = ModelsMetrics(engine)
    metrics.call("dslim/bert-base-NER", True, 0.1)
    for i in range(CALLS):
        metrics.call(f"caller{secrets.token_hex(4)}/model-{i}", i % 2 == 0, 0.1)
    text = metrics.exposition().decode()
    labels = {line.split('model="', 1)[1].split('"', 1)[0] for line in series(text) if 'model="' in line}
    assert "dslim/bert-base-NER" in labels and "other" in labels
    assert len(labels) <= MAX_MODEL_LABELS + 2
    assert json.dumps(sorted(labels)).count("caller") <= MAX_MODEL_LABELS
