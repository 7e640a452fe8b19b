"""The engine's start-up and health parts (hugginggpt/chat.py) in-process: `HuggingGPT.checks` (what /health and
the start-up lines report per dependency), `warm` (the ranker loaded, the catalog store opened, `ranking` going
from "warming" to "semantic"), `open_catalog_store` (the embedder chosen, the curated rows imported, health
recorded, the background refresh per `catalog_refresh_hours`) and `StreamedStart.stop`.

The server-level tests reach these only in a subprocess; these pin what users see of them against loopback
servers that count what they are asked, fast enough for the mutation audit (docs/TESTING.md)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hugginggpt.catalog import KeywordRanker
from hugginggpt.chat import HuggingGPT, StreamedStart
from hugginggpt.config import load_config
from hugginggpt.plan import Task
from hugginggpt.request import ChatRequest, RequestState
from tests.conftest import free_port, make_public, wait_until, write_config
from tests.fakes.hub_server import FakeHub, hub_model
from tests.fakes.llm_server import ThreadedServer

CARDS = [
    {"id": "google/vit-base-patch16-224", "task": "image-classification", "downloads": 900, "likes": 90,
     "description": "an image classifier trained on imagenet"},
    {"id": "facebook/detr-resnet-50", "task": "object-detection", "downloads": 800, "likes": 80,
     "description": "finds and boxes objects in a picture"},
    {"id": "dslim/bert-base-NER", "task": "token-classification", "downloads": 700, "likes": 70,
     "description": "names of people, places and organisations in english text"},
]
DIM = 8
TOKEN = "tok-chat-units"


class Dependencies:
    """A loopback server standing in for the LLM (`GET /v1/models`, counted) and the models server (`GET /running`,
    which answers only with the bearer token `TOKEN`, after `delay` seconds)."""

    def __init__(self):
        self.llm_requests = 0
        self.running_requests = 0
        self.delay = 0.0
        deps = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/v1/models":
                    deps.llm_requests += 1
                    self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
                elif self.path == "/running":
                    deps.running_requests += 1
                    time.sleep(deps.delay)
                    if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                        self._send(401, {"error": "needs the token"})
                    else:
                        self._send(200, {"running": True})
                else:
                    self._send(404, {})

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def deps():
    running = Dependencies()
    yield running
    running.stop()


@pytest.fixture
def site(tmp_path) -> Path:
    return make_public(tmp_path / "public")


def catalog_file(folder: Path) -> Path:
    path = folder / "catalog.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CARDS))
    return path


def make_engine(folder: Path, llm_url: str, models_url: str, public: Path, ranker=None, **extra) -> HuggingGPT:
    extra.setdefault("catalog", str(catalog_file(folder)))
    config = load_config(write_config(folder, llm_url, models_url, public, semantic_ranking=False, **extra))
    return HuggingGPT(config, ranker=ranker if ranker is not None else KeywordRanker())


def one_hot(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return v


class StandInRanker(KeywordRanker):
    """A sentence-model ranker without a model: `warm`, `load`, `card_vector` (one-hot per curated card) and
    `embed` (a constant vector, unlike every card vector), recording what it is asked."""

    precision = "fp32"
    model_path = Path("/models/stand-in-minilm")

    def __init__(self, cards: list[dict] = CARDS, fail_warm: bool = False):
        self.order = [c["id"] for c in cards]
        self.fail_warm = fail_warm
        self.warmed_with: list[str] = []
        self.loads = 0
        self.embedded: list[str] = []

    def warm(self, cards) -> None:
        self.warmed_with = [c.id for c in cards]
        if self.fail_warm:
            raise RuntimeError("no model weights here")

    def load(self) -> None:
        self.loads += 1

    def card_vector(self, card) -> np.ndarray | None:
        return one_hot(self.order.index(card.id)) if card.id in self.order else None

    def embed(self, texts, max_tokens: int | None = None) -> np.ndarray:
        self.embedded.extend(texts)
        return np.full((len(texts), DIM), 1 / np.sqrt(DIM), dtype=np.float32)


def stored_embedder(store_path: Path) -> str:
    with sqlite3.connect(store_path) as conn:
        return conn.execute("SELECT value FROM meta WHERE key='embedder'").fetchone()[0]


def stored_vectors(store_path: Path) -> dict[str, np.ndarray]:
    with sqlite3.connect(store_path) as conn:
        rows = conn.execute("SELECT m.id, v.vec FROM models m JOIN vectors v ON v.rowid = m.rowid").fetchall()
    return {model_id: np.frombuffer(vec, dtype=np.float16).astype(np.float32) for model_id, vec in rows}


# -- checks -----------------------------------------------------------------------------------------------------


def test_checks_are_none_when_the_llm_and_the_models_server_answer(tmp_path, site, deps):
    engine = make_engine(tmp_path, deps.url, deps.url, site, models_server_token=TOKEN)
    assert engine.checks() == {"llm": None, "models_server": None}
    assert deps.llm_requests == 1 and deps.running_requests == 1


def test_the_llm_check_is_cached_for_a_few_seconds_and_fresh_asks_again(tmp_path, site, deps):
    engine = make_engine(tmp_path, deps.url, deps.url, site, models_server_token=TOKEN)
    engine.checks()
    engine.checks()
    assert deps.llm_requests == 1  # /health polled twice: the LLM asked once
    assert deps.running_requests == 2  # the models server is asked each time
    assert engine.checks(fresh=True) == {"llm": None, "models_server": None}
    assert deps.llm_requests == 2


def test_checks_name_each_dependency_that_is_down_in_one_line(tmp_path, site):
    down = f"http://127.0.0.1:{free_port()}"
    engine = make_engine(tmp_path, down, down, site)
    assert engine.checks() == {
        "llm": f"the LLM at {down}/v1 is unreachable (connection refused: nothing listens there)",
        "models_server": f"the models server at {down} is down (connection refused: nothing listens there)",
    }


def test_the_models_server_check_sends_the_models_server_token(tmp_path, site, deps):
    engine = make_engine(tmp_path, deps.url, deps.url, site)  # no token configured: refused
    assert engine.checks()["models_server"] == (f"the models server at {deps.url} answered HTTP 401, "
                                                'not {"running": true}')


def test_the_models_server_check_waits_status_timeout_only(tmp_path, site, deps):
    deps.delay = 2.5
    engine = make_engine(tmp_path, deps.url, deps.url, site, models_server_token=TOKEN, status_timeout=0.3)
    started = time.monotonic()
    assert engine.checks()["models_server"] == f"the models server at {deps.url} is down (no answer in time)"
    assert time.monotonic() - started < 2.0


def test_a_models_server_is_unused_when_inference_mode_has_no_local_backend(tmp_path, site, deps):
    engine = make_engine(tmp_path, deps.url, deps.url, site, inference_mode="huggingface")
    assert engine.checks() == {"llm": None, "models_server": "unused"}
    assert deps.running_requests == 0


# -- warm --------------------------------------------------------------------------------------------------------


def test_warming_with_the_keyword_ranker_opens_the_store(tmp_path, site, caplog):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site)
    assert engine.ranking == "keyword" and not engine.warmed.is_set()
    assert engine.catalog_store is None
    with caplog.at_level(logging.INFO, logger="hugginggpt.chat"):
        engine.warm()
    assert engine.warmed.is_set() and engine.ranking == "keyword"
    assert engine.catalog_store is not None and engine.catalog_store.path == tmp_path / "catalog.sqlite"
    assert [r.levelno for r in caplog.records if r.name == "hugginggpt.chat"] == [logging.INFO]
    assert stored_embedder(tmp_path / "catalog.sqlite") == "hash-bow-256/256"


def test_warming_a_semantic_ranker_warms_and_loads_it_then_ranking_is_semantic(tmp_path, site):
    ranker = StandInRanker()
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, ranker=ranker)
    assert engine.ranking == "warming"
    engine.warm()
    assert ranker.warmed_with == [c["id"] for c in CARDS]
    assert ranker.loads == 2  # after warming, and again for the store's embedder
    assert engine.warmed.is_set() and engine.ranking == "semantic"
    assert engine.catalog_store is not None


def test_a_ranker_that_fails_to_warm_is_logged_and_warming_still_finishes(tmp_path, site, caplog):
    ranker = StandInRanker(fail_warm=True)
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, ranker=ranker)
    with caplog.at_level(logging.INFO, logger="hugginggpt.chat"):
        engine.warm()
    failed = [r for r in caplog.records if r.name == "hugginggpt.chat" and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == ["warming the model ranker failed"]
    assert str(failed[0].exc_info[1]) == "no model weights here"
    assert engine.warmed.is_set() and engine.ranking == "semantic"
    assert engine.catalog_store is not None  # the store opens all the same


def test_a_store_that_fails_to_open_is_logged_and_selection_keeps_the_curated_catalog(tmp_path, site, caplog):
    (tmp_path / "a-file").write_text("not a folder")
    store = tmp_path / "a-file" / "catalog.sqlite"
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, catalog_store=str(store))
    with caplog.at_level(logging.INFO, logger="hugginggpt.chat"):
        engine.warm()
    failed = [r for r in caplog.records if r.name == "hugginggpt.chat" and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == [
        f"opening the catalog store {store} failed; choosing from {tmp_path / 'catalog.jsonl'}"]
    assert failed[0].exc_info is not None
    assert engine.warmed.is_set() and engine.catalog_store is None
    task = Task(0, "image-classification", [-1], {"image": "/examples/red.png"})
    assert [c.card.id for c in engine.selector.candidates("a classifier for this photo", task)] == [
        "google/vit-base-patch16-224"]


# -- open_catalog_store ------------------------------------------------------------------------------------------


def test_the_store_imports_the_curated_rows_and_says_so(tmp_path, site, caplog):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site)
    with caplog.at_level(logging.INFO, logger="hugginggpt.chat"):
        engine.open_catalog_store()
    store = engine.catalog_store
    assert [r.getMessage() for r in caplog.records if r.name == "hugginggpt.chat"] == [
        f"catalog store {tmp_path / 'catalog.sqlite'}: 3 models in 3 tasks"]
    assert store.count() == 3
    assert store.tasks() == {"image-classification": 1, "object-detection": 1, "token-classification": 1}
    assert store.allowed_providers is None  # `huggingface.providers: auto`
    assert engine.selector.store is store
    assert stored_embedder(tmp_path / "catalog.sqlite") == "hash-bow-256/256"


def test_a_ranker_with_card_vectors_embeds_the_store_with_them(tmp_path, site):
    ranker = StandInRanker()
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, ranker=ranker)
    engine.open_catalog_store()
    assert stored_embedder(tmp_path / "catalog.sqlite") == f"st:stand-in-minilm/{DIM}"
    vectors = stored_vectors(tmp_path / "catalog.sqlite")
    assert sorted(vectors) == sorted(c["id"] for c in CARDS)
    for i, card in enumerate(CARDS):  # the ranker's own card vectors, not embedded again
        assert vectors[card["id"]].tolist() == one_hot(i).tolist()
    assert ranker.embedded == ["dimension probe"]


def test_the_store_keeps_the_configured_providers_only(tmp_path, site):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site,
                         huggingface={"providers": ["groq", "together"]})
    engine.open_catalog_store()
    assert engine.catalog_store.allowed_providers == frozenset({"groq", "together"})


def test_model_runs_are_recorded_in_the_store_health_table(tmp_path, llm, models, models_server):
    engine = make_engine(tmp_path, llm.base_url, models_server[1], models.public, url_allowlist=["127.0.0.1"])
    engine.open_catalog_store()
    llm.on("parse_task", json.dumps([{"task": "image-classification", "id": 0, "dep": [-1],
                                      "args": {"image": "/examples/red.png"}}]))
    results = engine.run(ChatRequest([{"role": "user", "content": "what is in /examples/red.png"}]), mode="results")
    assert results[0]["choose model result"]["id"] == "google/vit-base-patch16-224"
    assert results[0]["inference result"]["predicted"][0]["label"] == "tabby cat"
    with sqlite3.connect(tmp_path / "catalog.sqlite") as conn:
        recorded = conn.execute("SELECT model, ok, failed FROM health").fetchall()
    assert recorded == [("google/vit-base-patch16-224", 1, 0)]


class RecordedRefresh:
    """Starts the real BackgroundRefresh and keeps it, so that the test stops it."""

    def __init__(self, monkeypatch):
        import hugginggpt.catalog.sync as sync_mod

        self.started: list[Any] = []
        real = sync_mod.BackgroundRefresh
        recorded = self

        class Recorded(real):
            def start(self):
                recorded.started.append(self)
                return super().start()

        monkeypatch.setattr(sync_mod, "BackgroundRefresh", Recorded)

    def stop(self) -> None:
        for refresh in self.started:
            refresh.stop()


@pytest.fixture
def refreshes(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing leaves this machine
    recorded = RecordedRefresh(monkeypatch)
    yield recorded
    recorded.stop()


@pytest.fixture
def hub():
    fake = FakeHub(models=[hub_model(f"hub/translator-{i}", "translation", downloads=100 - i) for i in range(4)]
                   + [hub_model("hub/summarizer", "summarization", downloads=50)])
    server = ThreadedServer(fake.app()).start()
    fake.url = server.url
    yield fake
    server.stop()


def test_catalog_refresh_hours_syncs_the_store_in_the_background(tmp_path, site, hub, refreshes):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site,
                         catalog_refresh_hours=0.2 / 3600,  # 0.2 s
                         catalog_sync={"tasks": ["translation"], "per_task": 2, "endpoint": hub.url},
                         huggingface={"token": "hf_chat_units"})
    engine.open_catalog_store()
    assert len(refreshes.started) == 1
    store = engine.catalog_store
    wait_until(lambda: store.count() == 5, timeout=10, what="the refresh adding two Hub models")
    assert store.known_ids(["hub/translator-0", "hub/translator-1", "hub/translator-2"]) == {
        "hub/translator-0", "hub/translator-1"}
    listings = hub.listing_requests()
    assert listings and all("pipeline_tag=translation" in r for r in listings)
    assert set(hub.auth) == {"Bearer hf_chat_units"}


@pytest.mark.parametrize("hours", [0, None])
def test_no_refresh_when_catalog_refresh_hours_is_0_or_unset(tmp_path, site, hub, refreshes, hours):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, catalog_refresh_hours=hours,
                         catalog_sync={"tasks": ["translation"], "endpoint": hub.url})
    engine.open_catalog_store()
    assert refreshes.started == []
    assert engine.catalog_store.count() == 3


def test_only_the_worker_that_refreshes_the_catalog_starts_a_refresh(tmp_path, site, hub, refreshes):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site, catalog_refresh_hours=1.0,
                         catalog_sync={"tasks": ["translation"], "endpoint": hub.url})
    engine.refreshes_catalog = False  # another worker process keeps the shared store synced
    engine.open_catalog_store()
    assert refreshes.started == []


# -- StreamedStart.stop ------------------------------------------------------------------------------------------


def test_stopping_a_streamed_start_cancels_its_round_and_forgets_its_selections(tmp_path, site):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site)
    request = ChatRequest([{"role": "user", "content": "draw a fox"}])
    state = RequestState(request, engine.llm_for(request), None, 30)
    streamed = StreamedStart(engine, state)
    streamed.round = engine.executor.begin(state)
    scheduler = streamed.round.scheduler
    from concurrent.futures import Future

    choosing = Future()  # the model choice is still being made: the task, started, waits for it
    state.selections[0] = choosing  # before the task is added: it may start at once, and reads its selection
    streamed.round.add(Task(0, "text-classification", [-1], {"text": "hi"}))
    wait_until(lambda: scheduler.outcomes()[0].state == "running", 5, "the task to start")
    streamed.stop()
    assert streamed.round is None and state.selections == {}
    outcome = scheduler.outcomes()[0]
    assert (outcome.state, outcome.error) == ("cancelled", "the full plan replaced the streamed one")
    choosing.cancel()  # the waiting task's thread goes on, to an outcome nobody reads
    time.sleep(0.05)
    assert scheduler.outcomes()[0].state == "cancelled"


def test_stopping_a_streamed_start_without_a_round_forgets_its_selections(tmp_path, site):
    engine = make_engine(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", site)
    request = ChatRequest([{"role": "user", "content": "draw a fox"}])
    state = RequestState(request, engine.llm_for(request), None, 30)
    streamed = StreamedStart(engine, state)
    state.selections[3] = None
    streamed.stop()
    assert streamed.round is None and state.selections == {}
