"""End to end: the real models server runs a Hub model nobody listed, fetched from a fake Hub on first use."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import requests

from hugginggpt.backends import TaskInputs
from hugginggpt.backends.local import LocalModelsServer
from hugginggpt.modelhost.app import create_app
from hugginggpt.modelhost.discover import Discovery, DiscoveryPolicy
from hugginggpt.modelhost.engine import LocalEngine
from hugginggpt.modelhost.pool import ModelPool
from hugginggpt.modelhost.registry import Registry
from tests.conftest import make_public, sse
from tests.fakes.hub_repo import FakeHubServer
from tests.test_discover import NER, add_repos, tiny_files
from tests.test_models_server import start_models_server
from tests.tiny_models import token_classifier


def start_discovering_server(folder: Path, hub_url: str, extra: list[str]) -> tuple[subprocess.Popen, str, Path]:
    """models_server.py with HF_ENDPOINT at the fake Hub and its own HF_HOME; returns once /running answers."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "HUGGINGFACE_ACCESS_TOKEN"}
    env.update(HF_ENDPOINT=hub_url, HF_HOME=str(folder / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1")
    proc, url = start_models_server(folder, folder / "models", make_public(folder / "public"), deployment="minimal",
                                    extra=("huggingface: {token: null}", *extra), env=env)
    return proc, url, proc.log_path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("discover-srv")
    token_classifier(folder / "src")
    with FakeHubServer() as hub:
        add_repos(hub.repos, tiny_files(folder / "src"))
        proc, url, log_path = start_discovering_server(
            folder, hub.url, ["discovered_models: local", "discovered_authors_deny: [evil-org]"])
        try:
            yield url, hub, folder, log_path
        finally:
            proc.terminate()
            proc.wait(10)


def test_a_model_nobody_listed_downloads_on_first_use_and_runs(served):
    url, hub, folder, log_path = served
    before = requests.get(f"{url}/status/{NER}", timeout=10).json()
    assert before["loaded"] is False and before["loadable"] is True and before["task"] == "token-classification"
    assert LocalModelsServer(url, folder / "public", status_timeout=10).is_available(NER)
    assert hub.repos.downloads_of(NER, "model.safetensors") == 0  # status never downloads

    out = requests.post(f"{url}/models/{NER}", json={"text": "anna lives in berlin"}, timeout=60)
    assert out.status_code == 200, out.text
    entities = out.json()
    assert entities and all(set(e) >= {"entity_group", "score", "word", "start", "end"} for e in entities)
    assert hub.repos.downloads_of(NER, "model.safetensors") == 1
    assert (folder / "models" / NER / "model.safetensors").is_file()
    assert not (folder / "models" / NER / "vocab.txt").is_symlink()
    logged = log_path.read_text()
    assert f"{NER}: not curated; downloading" in logged and f"{NER}: downloaded in" in logged

    asked = len(hub.repos.requests)
    again = requests.post(f"{url}/models/{NER}", json={"text": "the red fox"}, timeout=60)
    assert again.status_code == 200, again.text
    # the orchestrator's client of this server, as a task routed to the discovered model calls it
    via_backend = LocalModelsServer(url, folder / "public").infer(NER, TaskInputs("token-classification", "anna"))
    assert "error" not in via_backend and via_backend.get("predicted") is not None, via_backend
    assert len(hub.repos.requests) == asked  # on disk and loaded: the Hub is not asked again
    assert requests.get(f"{url}/status/{NER}", timeout=10).json()["loaded"] is True
    rows = {r["id"]: r for r in requests.get(f"{url}/models", timeout=10).json()["models"]}
    assert rows[NER]["discovered"] is True and rows[NER]["servable"] and rows[NER]["loaded"]
    assert rows[NER]["task"] == "token-classification"


@pytest.mark.parametrize("path, status, kind", [
    ("evil-org/tiny-ner", 403, "author_denied"),
    ("tiny-org/remote-code", 422, "remote_code"),
    ("tiny-org/gated-ner", 403, "gated"),
    ("tiny-org/rl-agent", 422, "no_generic_loader"),
    ("tiny-org/nothing-here", 404, "not_on_hub"),
    ("tiny-org/%2E%2E", 400, "bad_model_id"),
    ("tiny-org/a/b", 400, "bad_model_id"),
    ("tiny-org/na--me", 400, "bad_model_id"),
    ("tiny-org/" + "x" * 100, 400, "bad_model_id"),
])
def test_refusals_are_clear_4xx(served, path, status, kind):
    url, hub, folder, _ = served
    resp = requests.post(f"{url}/models/{path}", json={"text": "anna lives in berlin"}, timeout=30)
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["type"] == kind and err["message"]
    state = requests.get(f"{url}/status/{path}", timeout=10).json()
    assert state["loaded"] is False and state["loadable"] is False and state["problem"]
    assert not LocalModelsServer(url, folder / "public", status_timeout=10).is_available(path)
    assert not [r for r in hub.repos.requests if ("/resolve/" in r[1] or "/cdn/" in r[1]) and "tiny-ner" not in r[1]]


@pytest.mark.parametrize("mode", ["off", "hosted"])
def test_without_local_discovery_an_unlisted_id_is_unknown(tmp_path, mode):
    """`off` and `hosted` (the default) leave the models server as it was: the catalog only, nothing asked."""
    registry = Registry("minimal", tmp_path / "models")
    discovery = Discovery(DiscoveryPolicy(mode=mode), tmp_path / "models", endpoint="http://127.0.0.1:9")
    app = create_app(LocalEngine(ModelPool(registry)), make_public(tmp_path / "public"), discovery=discovery)
    client = app.test_client()
    resp = client.post(f"/models/{NER}", json={"text": "anna"})
    assert resp.status_code == 404 and "unknown model" in resp.get_json()["error"]["message"]
    assert client.get(f"/status/{NER}").get_json() == {"loaded": False, "in_memory": False}
    assert client.get("/models").get_json()["discovered_models"] == mode


def big_token_classifier(folder: Path) -> None:
    """The tiny tokenizer and a BERT whose feed-forward layers make about 31 MB of weights: over three of
    huggingface_hub's 10 MiB download chunks, so a download reports its bytes more than once."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    from tests.tiny_models import WORDS, bert_tokenizer

    torch.manual_seed(0)
    bert_tokenizer(folder)
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    BertForTokenClassification(BertConfig(
        vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64000,
        max_position_embeddings=128, num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={v: k for k, v in enumerate(labels)})).save_pretrained(folder)


def test_a_watched_first_use_shows_the_download_s_bytes_rising_to_its_total_then_the_load(served):
    url, hub, folder, _ = served
    big = "tiny-org/big-ner"
    big_token_classifier(folder / "big-src")
    hub.repos.add(big, tiny_files(folder / "big-src"), pipeline_tag="token-classification")
    weights = len((folder / "big-src" / "model.safetensors").read_bytes())
    assert weights > 30 * 2**20
    hub.repos.paces["model.safetensors"] = 0.03  # a MiB every 30 ms: about a second for the whole file
    try:
        resp = requests.post(f"{url}/models/{big}", json={"text": "anna lives in berlin"}, timeout=120,
                             headers={"Accept": "text/event-stream"}, stream=True)
        events = sse(resp)
    finally:
        hub.repos.paces.clear()
    assert events[-1][0] == "result" and events[-1][1][0]["word"], events[-1]
    phases = [e["phase"] for name, e in events if name == "progress"]
    assert phases[0] == "downloading" and phases.index("loading") > phases.index("downloading")
    readings = [(e["bytes"], e["total_bytes"]) for name, e in events if name == "progress" and "bytes" in e]
    assert len(readings) >= 3, readings  # 10 MiB, 20 MiB, 30 MiB and the rest
    assert [b for b, _ in readings] == sorted(b for b, _ in readings) and readings[0][0] < readings[-1][0]
    assert readings[-1] == (weights, weights)  # rising to the total, which is the weights' size
    assert all(0 < e["fraction"] <= 1 for name, e in events if name == "progress" and "bytes" in e)
    assert hub.repos.downloads_of(big, "model.safetensors") == 1
