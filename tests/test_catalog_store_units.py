"""The catalog store (hugginggpt/catalog/store.py) in-process: writes, the curated import, embedding, the vector
index and its files, each pinned where a user (or an operator reading the store's folder and log) would notice
it broken. Mutation audit: docs/TESTING.md."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hugginggpt.catalog.embedders import HashEmbedder
from hugginggpt.catalog.store import CatalogStore, open_store
from tests.test_catalog_units import AxisEmbedder


def row(model_id, task="translation", **kw):
    return {"id": model_id, "task": task, **kw}


def write_curated(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")


def axis(word):
    """The unit vector AxisEmbedder gives a text of that one word."""
    return AxisEmbedder().embed([word])[0]


def axis_store(tmp_path, rows, **kw):
    store = CatalogStore(tmp_path / "axis.sqlite", AxisEmbedder(), **kw)
    store.upsert(rows)
    store.embed_pending()
    store.compile_index()
    return store


def ids(candidates):
    return [c.card.id for c in candidates]


def index_files(store):
    return sorted(f.name for f in store.index_dir.glob("*.npy"))


# ---------------------------------------------------------------------------------------------- writing


def test_rows_written_with_their_vectors_need_no_embedding_and_rank_by_them(tmp_path):
    # the sync embeds a page's new texts itself and hands the vectors to upsert: nothing is left pending
    store = CatalogStore(tmp_path / "s.sqlite", AxisEmbedder())
    store.upsert([row("org/a", description="x"), row("org/b", description="y")],
                 vectors={"org/a": axis("german"), "org/b": axis("english")})
    assert store.pending_count() == 0
    store.compile_index()
    assert ids(store.search("translation", "german", limit=2)) == ["org/a", "org/b"]
    assert store.search("translation", "german", limit=1)[0].factors.meaning == pytest.approx(1.0)
    # a new vector for a known id replaces its old one (the row keeps its place)
    store.upsert([row("org/a", description="z")], vectors={"org/a": axis("english")})
    assert store.pending_count() == 0 and store.count() == 2
    store.compile_index()
    assert store.search("translation", "english", limit=2)[0].factors.meaning == pytest.approx(1.0)
    assert [round(c.factors.meaning, 3) for c in store.search("translation", "german", limit=2)] == [0.0, 0.0]
    store.close()


def test_a_page_of_1001_rows_is_looked_up_in_three_queries_not_one_per_row(tmp_path):
    # a Hub sync compares and writes pages of up to a thousand rows, 500k rows in all: one lookup per row
    # (or per id) would make it quadratic
    store = CatalogStore(tmp_path / "s.sqlite", None)
    rows = [row(f"org/m{i:04d}", downloads=i) for i in range(1001)]
    seen = []
    store._r.set_trace_callback(seen.append)
    write, same = store.diff(rows)
    store._r.set_trace_callback(None)
    assert len(write) == 1001 and same == []
    assert len([s for s in seen if s.startswith("SELECT id, source, text_hash")]) == 3
    seen.clear()
    store._w.set_trace_callback(seen.append)
    assert store.upsert(write) == 1001
    store._w.set_trace_callback(None)
    assert len([s for s in seen if s.startswith("SELECT id, task FROM models")]) == 3
    # every id of the page was compared: the same page again is all unchanged
    write, same = store.diff(rows)
    assert write == [] and len(same) == 1001
    store.close()


def test_a_model_moved_to_another_task_leaves_the_old_tasks_ranking_even_last_in_a_large_page(tmp_path):
    store = axis_store(tmp_path, [row("org/mover", description="german"), row("org/stay", description="german")])
    assert ids(store.search("translation", "german", limit=5)) == ["org/mover", "org/stay"]
    page = [row(f"org/s{i:04d}", "summarization", description="news") for i in range(1000)]
    store.upsert(page + [row("org/mover", "summarization", description="german")])
    store.embed_pending()
    store.compile_index()
    assert ids(store.search("translation", "german", limit=5)) == ["org/stay"]
    assert "org/mover" in ids(store.search("summarization", "german", limit=3))
    store.close()


# ---------------------------------------------------------------------------------------------- curated import


def test_the_curated_import_says_what_it_imported_and_from_where(tmp_path, caplog):
    path = tmp_path / "p0.jsonl"
    write_curated(path, [row("org/a"), row("org/b", "summarization")])
    store = CatalogStore(tmp_path / "c.sqlite", None)
    with caplog.at_level(logging.INFO, logger="hugginggpt.catalog.store"):
        assert store.import_curated(path) == 2
    assert caplog.messages == [f"catalog store {store.path}: imported 2 curated models from {path}"]
    store.close()


def test_a_store_that_recorded_this_curated_file_keeps_it_without_importing_again(tmp_path):
    # a store file written by an earlier run records the file's digest (16 hex digits of its SHA-256): the same
    # file is not imported again on the next start, by this version or the one before
    path = tmp_path / "p0.jsonl"
    write_curated(path, [row("org/a")])
    store = CatalogStore(tmp_path / "c.sqlite", None)
    store.set_meta("curated_hash", hashlib.sha256(path.read_bytes()).hexdigest()[:16])
    assert store.import_curated(path) == 0 and store.count() == 0
    store.set_meta("curated_hash", "an older file")
    assert store.import_curated(path) == 1 and store.count() == 1
    assert store.meta("curated_hash") == hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    store.close()


# ---------------------------------------------------------------------------------------------- embedding


def test_embedding_reports_its_progress_after_each_batch_of_256(tmp_path):
    store = CatalogStore(tmp_path / "s.sqlite", HashEmbedder(32))
    store.upsert([row(f"org/m{i}", description=f"model {i}") for i in range(300)])
    progress = []
    assert store.embed_pending(on_batch=progress.append) == 300
    assert progress == [256, 300] and store.pending_count() == 0
    store.close()


class ShortEmbedder:
    """Answers one vector fewer than it was asked for, once (a broken model server, a bad batch)."""

    def __init__(self):
        self.dim = 8
        self.name = "short-8"
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        out = AxisEmbedder().embed(texts)
        return out[:-1] if self.calls == 1 else out


def test_an_embedder_answering_fewer_vectors_than_cards_is_an_error_not_a_silent_gap(tmp_path):
    store = CatalogStore(tmp_path / "s.sqlite", ShortEmbedder())
    store.upsert([row("org/a", description="german"), row("org/b", description="english")])
    with pytest.raises(ValueError):
        store.embed_pending()
    assert store.pending_count() == 2  # nothing of the bad batch was written
    assert store.embed_pending() == 2 and store.pending_count() == 0
    store.close()


# ---------------------------------------------------------------------------------------------- opening


class RecordingRanker:
    """What default_embedder makes of an installed sentence model, recording how it was made."""

    made: list = []

    def __init__(self, path, cache_dir, precision="int8"):
        self.model_path = Path("/models/all-MiniLM-L6-v2")
        self.precision = precision
        RecordingRanker.made.append((path, cache_dir, precision))

    def load(self):
        pass

    def card_vector(self, card):
        return None

    def embed(self, texts, max_tokens=64):
        return [np.array([1.0, float(len(t))]) for t in texts]


def test_open_store_makes_the_configured_sentence_embedder(tmp_path, monkeypatch):
    import hugginggpt.catalog.semantic as semantic

    monkeypatch.setattr(semantic, "default_model_path", lambda: tmp_path)
    monkeypatch.setattr(semantic, "SemanticRanker", RecordingRanker)
    monkeypatch.setattr(RecordingRanker, "made", [])
    path = tmp_path / "p0.jsonl"
    write_curated(path, [row("org/de", description="german")])
    config = SimpleNamespace(max_model_size_mb=None, memory_budget_gb=None, semantic_ranking=True,
                             cache_dir=tmp_path / "cache", embedding_precision="fp32",
                             catalog_store=tmp_path / "s.sqlite", catalog_path=path, catalog_weights={})
    store = open_store(config)
    assert RecordingRanker.made == [(tmp_path, tmp_path / "cache", "fp32")]
    assert store.embedder.name == "st:all-MiniLM-L6-v2" and store.meta("embedder") == "st:all-MiniLM-L6-v2/2"
    assert store.pending_count() == 0
    store.close()
    config.embedding_precision, config.catalog_store = "int8", tmp_path / "t.sqlite"
    store = open_store(config)
    assert RecordingRanker.made[-1] == (tmp_path, tmp_path / "cache", "int8")
    assert store.embedder.name == "st:all-MiniLM-L6-v2:int8"
    store.close()


def test_opening_embeds_even_a_single_missing_card(tmp_path):
    path = tmp_path / "p0.jsonl"
    write_curated(path, [row("org/de", description="german")])
    store = CatalogStore.open(tmp_path / "s.sqlite", AxisEmbedder(), curated=path)
    assert store.pending_count() == 0
    assert ids(store.search("translation", "german", limit=1)) == ["org/de"]
    store.close()


def test_opening_with_nothing_to_embed_skips_the_embedding_pass(tmp_path, monkeypatch):
    # the pass reads the whole store again (a join over 500k rows at Hub scale) to find nothing
    axis_store(tmp_path, [row("org/de", description="german")]).close()
    passes = []
    monkeypatch.setattr(CatalogStore, "embed_pending", lambda self, *a, **kw: passes.append(a) or 0)
    store = CatalogStore.open(tmp_path / "axis.sqlite", AxisEmbedder())
    assert passes == [] and store.pending_count() == 0
    store.close()


def bulk(path, n):
    store = CatalogStore(path, None)
    store.bulk_insert([row(f"org/m{i}", description="german") for i in range(n)])
    store.close()


def test_opening_embeds_up_to_5000_cards_and_leaves_more_to_the_sync(tmp_path):
    bulk(tmp_path / "many.sqlite", 5001)
    store = CatalogStore.open(tmp_path / "many.sqlite", AxisEmbedder())
    assert store.pending_count() == 5001  # the sync's job: opening must not take minutes
    store.close()
    bulk(tmp_path / "some.sqlite", 5000)
    store = CatalogStore.open(tmp_path / "some.sqlite", AxisEmbedder())
    assert store.pending_count() == 0
    store.close()


# ---------------------------------------------------------------------------------------------- the index


def test_a_hub_model_of_unknown_size_is_indexed_and_ranked_with_a_neutral_size_fit(tmp_path):
    store = axis_store(tmp_path, [row("org/unknown", description="german"),
                                  row("org/small", description="german", size_mb=10.0)])
    found = store.search("translation", "german", limit=5, max_size_mb=100)  # unknown: no reason to leave it out
    assert sorted(ids(found)) == ["org/small", "org/unknown"]
    assert {c.card.id: c.factors.size for c in found}["org/unknown"] == 0.5
    store.close()


def test_only_the_tasks_whose_rows_changed_are_rebuilt(tmp_path):
    store = axis_store(tmp_path, [row("org/sum", "summarization", description="news"),
                                  row("org/de", description="german")])
    assert store.compile_index() == []
    store.upsert([row("org/fr", description="french")])  # the later task (in name order) changed
    store.embed_pending()
    assert store.compile_index() == ["translation"] and not store.index_stale()
    assert ids(store.search("translation", "french", limit=1)) == ["org/fr"]
    store.upsert([row("org/sum2", "summarization", description="music")])
    store.embed_pending()
    assert store.compile_index() == ["summarization"]
    assert ids(store.search("summarization", "music", limit=1)) == ["org/sum2"]
    store.close()


def test_a_manifest_without_tasks_is_rebuilt_in_full(tmp_path):
    # e.g. written by hand, or by a tool that knows only the embedder
    store = axis_store(tmp_path, [row("org/de", description="german")])
    manifest = store.index_dir / "manifest.json"
    manifest.write_text(json.dumps({"embedder": store.meta("embedder")}))
    assert store.index_stale()
    assert store.compile_index() == ["translation"]
    assert not store.index_stale()
    assert ids(store.search("translation", "german", limit=1)) == ["org/de"]
    store.close()


def test_an_old_array_that_cannot_be_removed_yet_is_left_for_later(tmp_path, monkeypatch):
    # on Windows a file another process still maps cannot be deleted; the rebuild must finish anyway
    store = axis_store(tmp_path, [row("org/de", description="german")])
    old = index_files(store)

    def refuse(self, missing_ok=False):
        raise PermissionError(13, "in use", str(self))

    monkeypatch.setattr(Path, "unlink", refuse)
    store.upsert([row("org/fr", description="french")])
    store.embed_pending()
    assert store.compile_index() == ["translation"]
    assert set(old) < set(index_files(store))  # the old arrays are still there, beside the new ones
    assert ids(store.search("translation", "french", limit=1)) == ["org/fr"]
    monkeypatch.undo()
    store.upsert([row("org/en", description="english")])
    store.embed_pending()
    store.compile_index()
    assert not set(old) & set(index_files(store))  # the next rebuild removes them
    store.close()


def test_the_index_files_are_named_after_their_task(tmp_path):
    # an operator reading the index folder sees which arrays are whose; characters a file name cannot hold
    # are replaced, letters of either case are kept
    store = axis_store(tmp_path, [row("org/a", "Custom/Task v2", description="german")])
    names = index_files(store)
    assert len(names) == 5 and all(n.startswith("Custom_Task_v2-") for n in names)
    assert ids(store.search("Custom/Task v2", "german", limit=1)) == ["org/a"]
    store.close()


# ---------------------------------------------------------------------------------------------- embedder change


def test_a_new_embedder_says_how_many_vectors_it_dropped(tmp_path, caplog):
    path = tmp_path / "e.sqlite"
    store = CatalogStore(path, HashEmbedder(32))
    store.upsert([row("org/a"), row("org/b")])
    store.embed_pending()
    store.close()
    with caplog.at_level(logging.INFO, logger="hugginggpt.catalog.store"):
        CatalogStore(path, HashEmbedder(64)).close()
    assert caplog.messages == [f"catalog store {path}: embedder is now hash-bow-64/64; 2 vectors will be re-embedded"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hugginggpt.catalog.store"):
        CatalogStore(path, HashEmbedder(16)).close()  # nothing was embedded with the 64 one: nothing to say
    assert caplog.messages == []


# ---------------------------------------------------------------------------------------------- reading


def test_a_search_after_a_write_reads_the_rows_as_written_not_as_a_search_read_them_before(tmp_path):
    """Searches keep the rows they decode; a sync that rewrites a model (its downloads, its likes) is what the
    next search shows, before the index is compiled again (the text, and so the vector, did not change)."""
    store = axis_store(tmp_path, [row("org/a", description="german", downloads=10, likes=1)])
    [before] = store.search("translation", "german", limit=1)
    assert (before.card.downloads, before.card.likes) == (10, 1)
    store.upsert([row("org/a", description="german", downloads=5000, likes=70)])
    assert store.pending_count() == 0  # the text is the same: nothing to embed, and no index compiled since
    [after] = store.search("translation", "german", limit=1)
    assert (after.card.downloads, after.card.likes) == (5000, 70)
    store.close()


def test_task_counts_are_counted_once_until_the_next_write(tmp_path):
    store = CatalogStore(tmp_path / "s.sqlite", None)
    store.upsert([row("org/a"), row("org/b"), row("org/s", "summarization")])
    seen = []
    store._r.set_trace_callback(seen.append)
    assert store.tasks() == {"translation": 2, "summarization": 1}
    assert store.tasks() == {"translation": 2, "summarization": 1}
    assert len([s for s in seen if "GROUP BY" in s]) == 1
    store.upsert([row("org/c")])
    assert store.tasks() == {"translation": 3, "summarization": 1}
    assert len([s for s in seen if "GROUP BY" in s]) == 2
    store._r.set_trace_callback(None)
    store.close()


# ---------------------------------------------------------------------------------------------- the file and its readers


def test_the_store_file_may_sit_in_folders_not_made_yet_and_its_index_sits_beside_it(tmp_path):
    # `catalog_store: data/cache/x/catalog.sqlite` on a fresh box: the folders are made; the index is the
    # folder an operator finds next to the file (and what an upgrade must find again instead of rebuilding)
    path = tmp_path / "a" / "b" / "catalog.sqlite"
    store = CatalogStore(path, AxisEmbedder())
    store.upsert([row("org/a", description="german")])
    store.embed_pending()
    store.compile_index()
    assert path.is_file()
    assert (tmp_path / "a" / "b" / "catalog.sqlite.index" / "manifest.json").is_file()
    store.close()


def test_a_cards_parameter_count_and_weight_bytes_are_kept_in_the_file(tmp_path):
    # what the Hub sync read about a model's size is in the file for an operator's query (sqlite3 catalog.sqlite)
    import sqlite3

    path = tmp_path / "s.sqlite"
    store = CatalogStore(path, None)
    store.upsert([row("org/a", params=110_000_000, weight_bytes=440_000_000, size_mb=420.0)])
    store.close()
    with sqlite3.connect(path) as conn:
        got = conn.execute("SELECT params, weight_bytes, size_mb FROM models WHERE id='org/a'").fetchone()
    assert got == (110_000_000, 440_000_000, 420.0)


def test_the_text_hash_of_a_card_is_what_earlier_releases_stored():
    # vectors are kept per text hash: another hash for the same text re-embeds every card of an upgraded store
    from hugginggpt.catalog import card_from_row
    from hugginggpt.catalog.store import text_hash

    card = card_from_row({"id": "org/a", "task": "translation", "description": "German to English"})
    assert text_hash(card) == "63054344e8633e9b"  # blake2b, 8 bytes, of the card's text


@pytest.mark.parametrize("indexed", [False, True], ids=["keyword-only", "indexed"])
def test_a_store_opened_again_counts_the_cards_already_in_it(tmp_path, indexed):
    # a server restarting on a synced store lists its tasks before anything is written
    path = tmp_path / "s.sqlite"
    first = CatalogStore(path, AxisEmbedder() if indexed else None)
    first.upsert([row("org/a", description="german"), row("org/b"), row("org/s", "summarization")])
    if indexed:
        first.embed_pending()
        first.compile_index()
    first.close()
    again = CatalogStore(path, AxisEmbedder() if indexed else None)
    assert again.tasks() == {"translation": 2, "summarization": 1}
    again.close()


def test_an_unchanged_index_is_not_read_again(tmp_path):
    # every search looks for a newer index (at most once a second); only a new manifest opens new arrays
    store = axis_store(tmp_path, [row("org/a", description="german")])
    view = store._view
    store.reload()
    assert store._view is view
    store.upsert([row("org/b", description="english")])
    store.embed_pending()
    store.compile_index()
    assert store._view is not view
    store.close()


# ---------------------------------------------------------------------------------------------- threads


def test_a_store_is_read_and_written_from_other_threads_than_its_own(tmp_path):
    # the server opens the store once and serves each request on a thread of its own
    import threading

    store = axis_store(tmp_path, [row("org/a", description="german")])
    got, errors = [], []

    def work():
        try:
            got.append(ids(store.search("translation", "german", limit=1)))
            store.upsert([row("org/b", description="english")])
            store.health.record("org/a", ok=False, error="boom")
            got.append(store.tasks())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join(30)
    assert errors == [] and got == [["org/a"], {"translation": 2}]
    store.close()


def test_health_is_read_while_another_thread_holds_a_write_open(tmp_path):
    # a search's look at other workers' failures reads with the reader connection: a long sync write is no wait
    import threading

    store = CatalogStore(tmp_path / "s.sqlite", None)
    store.upsert([row("org/a")])
    inside, release = threading.Event(), threading.Event()

    def hold():
        with store.transaction():
            inside.set()
            release.wait(30)

    writer = threading.Thread(target=hold)
    writer.start()
    assert inside.wait(30)
    reader = threading.Thread(target=store.health.sync)
    reader.start()
    reader.join(10)
    blocked = reader.is_alive()
    release.set()
    writer.join(30)
    reader.join(30)
    assert not blocked
    store.close()


def test_a_failure_recorded_during_a_write_that_rolls_back_is_kept(tmp_path):
    # health shares the store's write lock: its record waits for the other write instead of joining it
    import sqlite3
    import threading

    path = tmp_path / "s.sqlite"
    store = CatalogStore(path, None)
    inside, release = threading.Event(), threading.Event()

    def sync_that_fails():
        try:
            with store.transaction() as w:
                w.execute("INSERT INTO meta(key, value) VALUES ('half', 'written')")
                inside.set()
                release.wait(30)
                raise RuntimeError("the sync failed")
        except RuntimeError:
            pass

    writer = threading.Thread(target=sync_that_fails)
    writer.start()
    assert inside.wait(30)
    recorder = threading.Thread(target=store.health.record, args=("org/a", False), kwargs={"error": "boom"})
    recorder.start()
    recorder.join(0.5)  # with the lock shared it waits here; without, it writes into the sync's transaction
    release.set()
    writer.join(30)
    recorder.join(30)
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT failed, last_error FROM health WHERE model='org/a'").fetchall() == [(1, "boom")]
        assert conn.execute("SELECT value FROM meta WHERE key='half'").fetchall() == []


def test_a_record_never_changes_the_health_table_another_thread_is_reading(tmp_path):
    # a search iterates the failures (failed_since) while an execution on another thread records one: changing
    # the dict under it would fail that search with "dictionary changed size during iteration"
    store = CatalogStore(tmp_path / "s.sqlite", None)
    store.health.record("org/a", ok=False, error="boom")
    being_read = store.health._rows
    store.health.record("org/b", ok=False, error="boom")
    assert list(being_read) == ["org/a"]
    assert store.health.failed_since(0) == {"org/a", "org/b"}
    store.close()


def test_health_is_read_again_only_after_someone_wrote_to_it(tmp_path):
    # every search looks at other workers' failures: one PRAGMA when nothing changed, not the whole table
    store = CatalogStore(tmp_path / "s.sqlite", None)
    store.health.record("org/a", ok=False, error="boom")
    seen = []
    store._r.set_trace_callback(seen.append)
    store.health.sync()
    store.health.sync()
    store.health.sync()
    other = CatalogStore(tmp_path / "s.sqlite", None)  # another worker records a failure
    other.health.record("org/b", ok=False, error="boom")
    other.close()
    store.health.sync()
    store._r.set_trace_callback(None)
    assert len([s for s in seen if "FROM health" in s]) == 2
    assert store.health.failed_since(0) == {"org/a", "org/b"}
    store.close()
