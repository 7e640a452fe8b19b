"""The whole Hub as the catalog, end to end: a model nobody listed by hand is synced from a fake Hub into the
store, chosen by the orchestrator, downloaded by the real models server and run; its health is recorded and
kept across a restart of the orchestrator."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import requests

from hugginggpt.catalog.store import CatalogStore
from tests.conftest import ROOT, start_server, stop_server, write_config
from tests.fakes.hub_server import FakeHub, hub_model
from tests.fakes.llm_server import ThreadedServer
from tests.test_discover import NER, tiny_files
from tests.test_discover_server import start_discovering_server
from tests.tiny_models import token_classifier

NAMES = "Anna lives in Berlin"


def plan_ner() -> str:
    return json.dumps([{"task": "token-classification", "id": 0, "dep": [-1], "args": {"text": NAMES}}])


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hub")
    token_classifier(folder / "src")
    fake = FakeHub(models=[hub_model(NER, "token-classification", downloads=5_000_000, likes=900,
                                     tags=("ner",), language=("en",), params=40_000)])
    fake.repos.add(NER, tiny_files(folder / "src"), pipeline_tag="token-classification")
    srv = ThreadedServer(fake.app()).start()
    yield fake, srv.url, folder
    srv.stop()


def sync_store(config, hub_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_ENDPOINT"] = hub_url
    return subprocess.run([sys.executable, str(ROOT / "tools" / "build_catalog.py"), "sync", "--config", str(config),
                           "--tasks", "token-classification"], capture_output=True, text=True, timeout=120, env=env,
                          cwd=ROOT)


def test_a_never_listed_hub_model_is_chosen_downloaded_and_run(hub, tmp_path, llm, public_dir):
    fake, hub_url, _ = hub
    proc, models_url, _ = start_discovering_server(tmp_path / "models-srv", hub_url, ["discovered_models: local"])
    try:
        config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                              choose_model="ranking")
        done = sync_store(config, hub_url)
        assert done.returncode == 0, done.stderr[-2000:]
        assert CatalogStore(tmp_path / "catalog.sqlite", None).get(NER) is not None  # the sync put it there

        llm.on("parse_task", plan_ner())
        srv = start_server(config, tmp_path)
        try:
            record = srv.post("/results", {"messages": [{"role": "user", "content": f"find the names: {NAMES}"}]},
                              timeout=120).json()["0"]
            search = requests.get(f"{srv.url}/models/search?task=token-classification&q=ner&limit=20",
                                  timeout=30).json()
        finally:
            stop_server(srv)
        # the curated NER models have no weights at this deployment level: the Hub model is the only one that runs
        assert record["choose model result"]["id"] == NER, record
        assert "error" not in record["inference result"], record["inference result"]
        assert fake.repos.downloads_of(NER, "model.safetensors") == 1
        assert NER in [c["id"] for c in search]
        health = CatalogStore(tmp_path / "catalog.sqlite", None).health.get(NER)
        assert health is not None and health.ok == 1 and health.failed == 0  # the run was recorded
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_model_that_failed_ranks_lower_after_a_restart(tmp_path, llm, models, models_server, public_dir):
    """A failure is recorded in the store: the next orchestrator (a restart) ranks that model down."""
    broken = "Salesforce/blip-image-captioning-large"
    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                          choose_model="ranking")
    query = "task=image-to-text&q=caption+a+photo&limit=50"
    srv = start_server(config, tmp_path)
    try:
        before = requests.get(f"{srv.url}/models/search?{query}", timeout=30).json()
        models.broken.add(broken)
        llm.on("parse_task", json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1],
                                          "args": {"image": "/examples/red.png"}}]))
        record = srv.post("/results", {"messages": [{"role": "user", "content": "caption it"}]}).json()["0"]
        assert record["inference result"]["fallback"]["tried"][0]["model"] == broken  # it ran first, and failed
    finally:
        stop_server(srv)
    srv = start_server(config, tmp_path)  # a restart: a new process reading the same store
    try:
        after = requests.get(f"{srv.url}/models/search?{query}", timeout=30).json()
        models.broken.discard(broken)
        record = srv.post("/results", {"messages": [{"role": "user", "content": "caption it"}]}).json()["0"]
    finally:
        stop_server(srv)
    score = {c["id"]: c["score"] for c in before}
    later = {c["id"]: c["score"] for c in after}
    assert before[0]["id"] == broken and after[0]["id"] != broken
    assert later[broken] < score[broken] - 0.2  # the health penalty
    assert record["choose model result"]["id"] != broken  # the next request does not start with it
    assert re.search(r"(meaning|popularity|language|size|latency|availability|health) [+-]\d",
                     record["choose model result"]["reason"])  # the reason names what decided
