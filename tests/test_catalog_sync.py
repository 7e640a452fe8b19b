"""The Hub sync against a fake Hub on loopback: paging, fields, resuming, incremental runs, the CLI."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pytest
import yaml
from huggingface_hub import HfApi, hf_hub_download, snapshot_download

from hugginggpt.catalog.embedders import HashEmbedder
from hugginggpt.catalog.hub_api import EXPAND, HubClient
from hugginggpt.catalog.store import CatalogStore
from hugginggpt.catalog.sync import Progress, sync
from tests.conftest import ROOT
from tests.fakes.hub_server import FakeHub, hub_model
from tests.fakes.llm_server import ThreadedServer

CURATED = ROOT / "data" / "p0_models.jsonl"


def make_models() -> list[dict]:
    langs = ("en", "de", "fr", "zh")
    models = []
    for i in range(23):
        a, b = langs[i % 4], langs[(i + 1) % 4]
        models.append(hub_model(f"org{i % 5}/opus-mt-{a}-{b}-v{i}", "translation", downloads=10_000 - 100 * i,
                                likes=50 - i, tags=("marian",), language=(a, b), params=74_000_000 + i,
                                providers=("hf-inference",) if i % 3 == 0 else ()))
    for i in range(9):
        models.append(hub_model(f"org{i % 3}/bart-sum-{i}", "summarization", downloads=5_000 - 10 * i, likes=i,
                                tags=("bart",), language=("en",)))
    # a curated id, in the Hub's first page: the sync must leave the curated row as the file has it
    models.append(hub_model("Helsinki-NLP/opus-mt-en-de", "translation", downloads=9_950, likes=0))
    return models


@pytest.fixture
def hub():
    fake = FakeHub(models=make_models())
    server = ThreadedServer(fake.app()).start()
    fake.url = server.url
    yield fake
    server.stop()


@pytest.fixture
def store(tmp_path) -> CatalogStore:
    s = CatalogStore.open(tmp_path / "catalog.sqlite", HashEmbedder(), curated=CURATED)
    yield s
    s.close()


def client(hub: FakeHub) -> HubClient:
    return HubClient(endpoint=hub.url, token="hf_test", max_retries=0)


def test_the_fake_hub_speaks_hfapi(hub):
    """HfApi itself parses the fake's pages: paging by Link header, expand, search, author, full."""
    api = HfApi(endpoint=hub.url, token="hf_test")
    hub.default_page = 5
    listed = list(api.list_models(pipeline_tag="translation", sort="downloads", expand=EXPAND))
    assert len(listed) == 24 and len(hub.listing_requests()) == 5  # 24 models in pages of 5
    assert [m.downloads for m in listed] == sorted((m.downloads for m in listed), reverse=True)
    first = listed[0]
    assert first.id == "org0/opus-mt-en-de-v0" and first.safetensors.total == 74_000_000
    assert listed[1].id == "Helsinki-NLP/opus-mt-en-de"
    assert first.card_data.language == ["en", "de"] and first.inference_provider_mapping[0].provider == "hf-inference"
    assert first.last_modified is not None and first.sha
    assert [m.id for m in api.list_models(author="org1", search="opus")] == [
        m["id"] for m in make_models() if m["id"].startswith("org1/opus")]
    full = next(iter(api.list_models(full=True, limit=1)))
    assert full.siblings is not None and full.sha
    assert hub.auth[-1] == "Bearer hf_test"
    ours = [m.id for p in client(hub).pages("translation", page_size=7) for m in p.items]
    assert ours == [m.id for m in listed]  # our pager reads the same listing as HfApi.list_models


def test_the_fake_hub_serves_a_never_listed_models_files(hub, tmp_path):
    hub.repos.add("tiny/never-listed", {"config.json": b'{"model_type": "bert"}', "model.bin": b"\0" * 2048},
                  pipeline_tag="text-classification")
    path = hf_hub_download("tiny/never-listed", "model.bin", endpoint=hub.url, cache_dir=tmp_path)
    assert Path(path).stat().st_size == 2048
    folder = Path(snapshot_download("tiny/never-listed", endpoint=hub.url, cache_dir=tmp_path / "snap"))
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.bin"]
    assert any(r.startswith("/api/models/tiny/never-listed/revision/") for r in hub.requests)


def test_sync_pages_by_downloads_and_maps_the_fields(hub, store):
    err = io.StringIO()
    report = sync(store, client(hub), ["translation", "summarization"], per_task=12, page_size=5,
                  progress=Progress(err, every=0))
    assert report.tasks["translation"].fetched == 12 and report.tasks["summarization"].fetched == 9
    assert report.tasks["translation"].pages == 3  # 5 + 5 + 2: it stops paging at the limit
    row = store.get("org0/opus-mt-en-de-v0")
    assert row.card.task == "translation" and row.card.downloads == 10_000 and row.library == "transformers"
    assert row.card.language == ("en", "de") and row.license == "apache-2.0" and row.providers == ("hf-inference",)
    assert row.card.size_mb == pytest.approx(74_000_000 * 4 / 2**20, rel=1e-3)
    assert "marian" in row.card.tags and "translation" in row.card.description
    assert store.get("org0/opus-mt-en-de-v11") is None  # beyond --per-task
    assert store.get("Helsinki-NLP/opus-mt-en-de").source == "curated"  # the curated row is not overwritten
    assert store.get("Helsinki-NLP/opus-mt-en-de").card.downloads == 900000
    assert "cards/s" in err.getvalue() and "ETA" in err.getvalue() and "translation: 12/12" in err.getvalue()
    top = store.search("translation", "translate English into German", limit=3)
    assert top and all(c.card.task == "translation" for c in top)
    assert store.pending_count() == 0 and not store.index_stale()


def test_an_interrupted_sync_continues_where_it_stopped(hub, store):
    def stop_after(pages: int):
        if pages == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sync(store, client(hub), ["translation"], page_size=5, on_page=stop_after)
    assert store.tasks()["translation"] == 10 + 9  # two pages kept (one of their ten is a curated id)
    before = len(hub.listing_requests())
    report = sync(store, client(hub), ["translation"], page_size=5)
    resumed = hub.listing_requests()[before]
    assert "cursor=" in resumed  # the next page, not the first one again
    assert report.tasks["translation"].resumed and report.tasks["translation"].fetched == 24 - 10
    assert store.tasks()["translation"] == 10 + 23


def test_a_network_error_mid_sync_leaves_whole_pages_and_the_next_run_finishes(hub, store):
    hub.fail_at = 3
    with pytest.raises(Exception, match="500"):
        sync(store, client(hub), ["translation"], page_size=5)
    assert store.tasks()["translation"] == 10 + 9  # pages 1 and 2, nothing of page 3
    hub.fail_at = None
    sync(store, client(hub), ["translation"], page_size=5)
    assert store.tasks()["translation"] == 10 + 23


def test_a_second_sync_fetches_only_what_changed(hub, store):
    sync(store, client(hub), ["translation"], page_size=5)
    vec_before = store._r.execute("SELECT count(*) FROM vectors").fetchone()[0]
    changed = next(m for m in hub.models if m["id"] == "org2/opus-mt-fr-zh-v2")
    changed.update(lastModified="2099-01-01T00:00:00.000Z", downloads=20_000, tags=[*changed["tags"], "new-tag"])
    hub.models.append(hub_model("new/opus-mt-en-ja", "translation", downloads=30, last_modified="2099-01-02T00:00:00.000Z"))
    before = len(hub.listing_requests())
    report = sync(store, client(hub), ["translation"], page_size=5)
    requests = hub.listing_requests()[before:]
    assert len(requests) == 1 and "sort=lastModified" in requests[0]  # one page, newest first, then it stops
    assert report.tasks["translation"].mode == "changes" and report.tasks["translation"].fetched == 2
    assert report.tasks["translation"].embedded == 2  # the changed card and the new one, nothing else
    assert store.get("org2/opus-mt-fr-zh-v2").card.downloads == 20_000 and "new-tag" in store.get(
        "org2/opus-mt-fr-zh-v2").card.tags
    assert store._r.execute("SELECT count(*) FROM vectors").fetchone()[0] == vec_before + 1
    # nothing changed: still one listing request, nothing written
    report = sync(store, client(hub), ["translation"], page_size=5)
    assert report.tasks["translation"].written == 0 and report.tasks["translation"].pages == 1


def test_hf_endpoint_and_token_are_honoured(hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    c = HubClient(token="hf_secret", max_retries=0)
    assert c.endpoint == hub.url
    assert next(iter(c.pages("summarization"))).items
    assert hub.auth[-1] == "Bearer hf_secret"


def test_the_cli_syncs_the_store_the_config_names(hub, tmp_path, monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_catalog", ROOT / "tools" / "build_catalog.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    store_path = tmp_path / "hub.sqlite"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"root": str(ROOT), "catalog_store": str(store_path), "semantic_ranking": False,
                                      "catalog_sync": {"endpoint": hub.url}, "huggingface": {"token": "hf_cli"}}))
    assert tool.main(["sync", "--config", str(config), "--per-task", "4", "--tasks", "summarization",
                      "--retries", "0"]) == 0
    err = capsys.readouterr().err
    assert "4 cards fetched" in err and "cards/s" in err
    assert hub.auth[-1] == "Bearer hf_cli"
    s = CatalogStore(store_path, HashEmbedder())
    assert s.tasks()["summarization"] == 8 + 4  # the curated ones and the Hub's top 4
    s.close()
    hub.fail_at = len(hub.listing_requests()) + 1
    assert tool.main(["sync", "--config", str(config), "--tasks", "translation", "--retries", "0"]) == 1
    assert "run again to continue" in capsys.readouterr().err


def test_the_store_is_ignored_by_git():
    import subprocess

    path = Path(tempfile.gettempdir())  # noqa: F841 - the default path is what matters
    out = subprocess.run(["git", "check-ignore", "data/catalog.sqlite", "data/catalog.sqlite.index/manifest.json"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out
