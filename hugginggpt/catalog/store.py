"""The catalog store: every known model (the curated rows and the Hub's), their embeddings, and health.

One SQLite file (WAL: readers never wait for the sync that writes) holds one row per model and its
embedding (float16 bytes); it is the source of truth and every write is a transaction. Ranking reads a
derived vector index beside it (`<store>.index/`): per task, memory-mapped NumPy arrays of

  - sign bits of each embedding (dim/8 bytes a card: 24 MB for 500k cards), scanned in full per query;
  - the float16 embeddings themselves, of which only the best `rescore` rows by Hamming distance are read;
  - the static prior (popularity) and size of each card, so the first stage already weighs popularity.

Opening maps the files (milliseconds, nothing read); the index is rebuilt per task when that task's rows
changed and swapped in by an atomic rename of its manifest, so a reader never sees half an index.
Why this and not HNSW (usearch) or brute force: see bench/README.md "Catalog at Hub scale".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..folderlock import locked_folder
from .cards import ModelCard, RankQuery, card_from_row, language_fit, languages_in, words
from .cards import popularity as card_popularity
from .embedders import Embedder
from .health import Health
from .scoring import AVAILABILITY, SIZE_REFERENCE_MB, Factors, Weights, explain, latency_fit, popularity, score, size_fit

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ROW_CACHE = 50_000  # decoded rows kept for searches (a few KB each at most)
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS models(
  rowid INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  task TEXT NOT NULL,
  source TEXT NOT NULL,            -- curated | hub
  library TEXT,
  downloads INTEGER NOT NULL DEFAULT 0,
  likes INTEGER NOT NULL DEFAULT 0,
  tags TEXT NOT NULL DEFAULT '[]',
  languages TEXT NOT NULL DEFAULT '[]',
  license TEXT,
  gated TEXT,
  params INTEGER,
  weight_bytes INTEGER,
  size_mb REAL,
  last_modified TEXT,
  sha TEXT,
  providers TEXT NOT NULL DEFAULT '[]',
  description TEXT NOT NULL DEFAULT '',
  local TEXT,                      -- the curated row's `local` object (how the models server loads it)
  text_hash TEXT NOT NULL,
  updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS models_by_task ON models(task, downloads DESC);
CREATE TABLE IF NOT EXISTS vectors(rowid INTEGER PRIMARY KEY, text_hash TEXT NOT NULL, vec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS task_versions(task TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS sync_state(
  task TEXT PRIMARY KEY,
  mode TEXT,                       -- full | changes: what the pass in progress lists
  next_url TEXT,                   -- the Hub's next page of the pass in progress (NULL: none in progress)
  fetched INTEGER NOT NULL DEFAULT 0,
  pass_started TEXT,               -- ISO time the pass in progress started
  watermark TEXT,                  -- lastModified at the start of the last complete pass
  completed_at REAL
);
"""
COLUMNS = ("id", "task", "source", "library", "downloads", "likes", "tags", "languages", "license", "gated", "params",
           "weight_bytes", "size_mb", "last_modified", "sha", "providers", "description", "local")
STORED = (*COLUMNS, "text_hash", "updated_at")  # what a write stores of a row (its rowid aside)
RESCORE = 1000  # rows read exactly after the bit scan (the measured recall/latency trade-off)
CHUNK = 500  # ids per `IN (...)` query: within SQLite's limit on bound variables (999 before 3.32)


def text_hash(card: ModelCard) -> str:
    return hashlib.blake2b(card.text().encode(), digest_size=8).hexdigest()


def _task_file(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task)


@dataclass(frozen=True)
class Candidate:
    """One ranked model: its card, its score and the factors that made it."""

    card: ModelCard
    score: float
    factors: Factors
    library: str | None = None
    local: dict | None = None
    providers: tuple[str, ...] = ()
    gated: str | None = None
    license: str | None = None
    source: str = "hub"
    # the runner-up's factors and the weights, for `reason`
    versus: tuple[Factors | None, Weights] | None = field(default=None, repr=False, compare=False)

    @property
    def reason(self) -> str:
        """The factors that put it ahead of the next candidate. Worked out when read: a selection reads the
        reason of the one model it picks, not of the ten it ranked."""
        return explain(self.factors, *self.versus) if self.versus is not None else ""

    def to_json(self) -> dict[str, Any]:
        c = self.card
        return {"id": c.id, "task": c.task, "downloads": c.downloads, "likes": c.likes, "score": round(self.score, 4),
                "library": self.library, "tags": list(c.tags), "language": list(c.language), "size_mb": c.size_mb,
                "description": c.description, "providers": list(self.providers), "local": self.local is not None,
                "source": self.source, "factors": self.factors.as_dict()}


@dataclass
class TaskIndex:
    """One task's memory-mapped arrays (read-only)."""

    rowids: np.ndarray  # int64 (n,)
    bits: np.ndarray  # uint64 (dim/64, n): sign bits, word-major
    vectors: np.ndarray  # float16 (n, dim)
    prior: np.ndarray  # float32 (n,): popularity 0..1
    size: np.ndarray  # float32 (n,): MB, NaN unknown

    @classmethod
    def load(cls, folder: Path, stem: str) -> TaskIndex:
        def m(kind: str) -> np.ndarray:
            return np.load(folder / f"{stem}.{kind}.npy", mmap_mode="r")

        return cls(m("rowids"), m("bits"), m("vec"), m("prior"), m("size"))


@dataclass
class IndexView:
    """An immutable snapshot of the manifest; arrays open lazily per task."""

    folder: Path
    manifest: dict[str, Any]
    _tasks: dict[str, TaskIndex] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def task(self, task: str) -> TaskIndex | None:
        entry = self.manifest.get("tasks", {}).get(task)
        if entry is None or not entry["n"]:
            return None
        with self._lock:
            if task not in self._tasks:
                self._tasks[task] = TaskIndex.load(self.folder, entry["stem"])
            return self._tasks[task]


class CatalogStore:
    """Open with `CatalogStore.open(path, embedder)`; thread-safe (one writer connection, one reader)."""

    def __init__(self, path: Path, embedder: Embedder | None, weights: Weights | None = None,
                 budget_mb: float | None = None, rescore: int = RESCORE):
        self.path = Path(path)
        self.index_dir = self.path.with_name(self.path.name + ".index")
        self.embedder = embedder
        self.weights = weights or Weights()
        self.budget_mb = budget_mb
        self.rescore = rescore
        # the Inference Providers hosted execution may use (`huggingface.providers`); None: any (auto)
        self.allowed_providers: frozenset[str] | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wlock = threading.RLock()
        self._rlock = threading.Lock()
        self._depth = 0
        self._w = self._connect()
        with self._wlock:
            self._w.executescript(SCHEMA)
            self._set_meta_default("schema_version", str(SCHEMA_VERSION))
        self._r = self._connect()
        self.health = Health(self._w, self._wlock, half_life_hours=self.weights.health_half_life_hours,
                             reader=(self._r, self._rlock))
        self._view: IndexView | None = None  # pragma: no mutate: reload() below sets it either way
        self._rows: dict[int, dict[str, Any]] = {}  # decoded rows searches read (see `_fetch`)
        self._task_counts: dict[str, int] | None = None
        self._manifest_mtime: float | None = None  # pragma: no mutate: any non-number differs from every mtime
        self._checked = 0.0  # pragma: no mutate: any start long past: the first search looks for a newer index
        if embedder is not None:
            self._use_embedder(embedder)
        self.reload()

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike, embedder: Embedder | None, *, curated: Path | None = None,
             weights: Weights | None = None, budget_mb: float | None = None, embed_limit: int = 5000) -> CatalogStore:
        """Open (creating if needed), import the curated catalog when it changed, embed what is missing (up to
        `embed_limit` cards: the rest is the sync's job) and rebuild a stale index."""
        store = cls(Path(path), embedder, weights=weights, budget_mb=budget_mb)
        if curated is not None:
            store.import_curated(curated)
        if embedder is not None and 0 < store.pending_count() <= embed_limit:
            store.embed_pending()
        if store.index_stale():
            store.compile_index()
        return store

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False,  # one connection serves every request thread
                               isolation_level=None,  # pragma: no mutate: each write opens BEGIN IMMEDIATE itself
                               timeout=30,  # pragma: no mutate: busy_timeout below sets the same wait again
                               )
        conn.execute("PRAGMA journal_mode=WAL")  # pragma: no mutate: SQL ignores case
        conn.execute("PRAGMA synchronous=NORMAL")  # pragma: no mutate: SQL ignores case
        conn.execute("PRAGMA busy_timeout=30000")  # pragma: no mutate: SQL ignores case
        return conn

    def close(self) -> None:
        with self._wlock:
            self._w.close()
        with self._rlock:
            self._r.close()

    def _set_meta_default(self, key: str, value: str) -> None:
        self._w.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)",  # pragma: no mutate: SQL ignores case
                        (key, value))

    def meta(self, key: str) -> str | None:
        with self._rlock:
            row = self._r.execute("SELECT value FROM meta WHERE key=?",  # pragma: no mutate: SQL ignores case
                              (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction():
            self._w.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",  # pragma: no mutate: SQL ignores case
                        (key, value))

    def _use_embedder(self, embedder: Embedder) -> None:
        """A different embedder than the vectors were made with: drop them (they are re-embedded)."""
        name = f"{embedder.name}/{embedder.dim}"
        if self.meta("embedder") != name:
            with self.transaction():
                had = self._w.execute(
                    "SELECT count(*) FROM vectors",  # pragma: no mutate: SQL ignores case
                ).fetchone()[0]
                self._w.execute("DELETE FROM vectors")  # pragma: no mutate: SQL ignores case
                self._w.execute("UPDATE task_versions SET version = version + 1")  # pragma: no mutate: SQL ignores case
                self.set_meta("embedder", name)
            if had:
                log.info("catalog store %s: embedder is now %s; %d vectors will be re-embedded", self.path, name, had)

    # -- writing ------------------------------------------------------------------------------------

    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """All writes inside commit together or not at all (re-entrant; the outermost commits)."""
        with self._wlock:
            if self._depth == 0:
                self._w.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield self._w
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self._w.execute("ROLLBACK")
                raise
            self._depth -= 1
            if self._depth == 0:
                self._w.execute("COMMIT")
                self._rows.clear()  # what a search read before may have changed
                self._task_counts = None

    transaction = contextlib.contextmanager(_transaction)  # wrapped, not decorated: mutmut skips decorated functions

    def _bump(self, tasks: Iterable[str]) -> None:
        for task in set(tasks):
            self._w.execute("INSERT INTO task_versions(task, version) VALUES (?, 1) "  # pragma: no mutate: SQL ignores case
                            "ON CONFLICT(task) DO UPDATE SET version = version + 1",  # pragma: no mutate: SQL ignores case
                            (task,))

    def diff(self, rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Split Hub rows into (to write, unchanged); a row whose text changed needs a new embedding.

        Curated ids are never overwritten by the Hub (the curated file is their source)."""
        ids = [r["id"] for r in rows]
        existing: dict[str, tuple] = {}
        with self._rlock:
            for i in range(0, len(ids), CHUNK):
                chunk = ids[i:i + CHUNK]
                q = f"SELECT id, source, text_hash, downloads, likes, sha, last_modified, task FROM models WHERE id IN " \
                    f"({','.join('?' * len(chunk))})"
                existing.update({r[0]: r[1:] for r in self._r.execute(q, chunk)})
        write, same = [], []
        for row in rows:
            old = existing.get(row["id"])
            if old is not None and old[0] == "curated":
                same.append(row)
                continue
            row = {**row, "text_hash": text_hash(card_from_store_row(row))}
            if old is not None and (old[1], old[2], old[3], old[4], old[5], old[6]) == (
                    row["text_hash"], row.get("downloads") or 0, row.get("likes") or 0, row.get("sha"),
                    row.get("last_modified"), row["task"]):
                same.append(row)
            else:
                row["_new_text"] = old is None or old[1] != row["text_hash"]
                write.append(row)
        return write, same

    def upsert(self, rows: Sequence[dict[str, Any]], source: str = "hub",
               vectors: dict[str, np.ndarray] | None = None) -> int:
        """Insert or update rows (and their vectors, keyed by id), in one transaction. Returns rows written."""
        now = time.time()
        with self.transaction() as w:
            old_tasks = {}
            ids = [r["id"] for r in rows]
            for i in range(0, len(ids), CHUNK):
                chunk = ids[i:i + CHUNK]
                old_tasks.update(dict(w.execute(f"SELECT id, task FROM models WHERE id IN ({','.join('?' * len(chunk))})",
                                                chunk).fetchall()))
            for row in rows:
                values = _row_values(row, source) + (text_hash(card_from_store_row(row)), now)
                w.execute(f"INSERT INTO models({', '.join(STORED)}) VALUES ({', '.join('?' * len(STORED))}) "
                          f"ON CONFLICT(id) DO UPDATE SET {', '.join(f'{c}=excluded.{c}' for c in STORED[1:])}", values)
                if vectors is not None and row["id"] in vectors:
                    w.execute("INSERT OR REPLACE INTO vectors(rowid, text_hash, vec) "  # pragma: no mutate: SQL ignores case
                              "SELECT rowid, ?, ? FROM models WHERE id=?",  # pragma: no mutate: SQL ignores case
                              (values[-2], vectors[row["id"]].astype(np.float16).tobytes(), row["id"]))
            self._bump([r["task"] for r in rows] + [t for t in old_tasks.values()])
        return len(rows)

    def bulk_insert(self, rows: Sequence[dict[str, Any]], vectors: np.ndarray | None = None,
                    source: str = "hub") -> None:
        """Many new rows at once (ids not in the store yet), with their vectors in row order; one transaction."""
        now = time.time()
        with self.transaction() as w:
            last = w.execute("SELECT max(rowid) FROM models").fetchone()[0]  # pragma: no mutate: SQL ignores case
            start = (last or 0) + 1
            values = []
            for row in rows:
                h = row.get("text_hash") or text_hash(card_from_store_row(row))
                values.append(_row_values(row, source) + (h, now))
            w.executemany(f"INSERT INTO models(rowid, {', '.join(STORED)}) VALUES (?, {', '.join('?' * len(STORED))})",
                          ((start + i, *v) for i, v in enumerate(values)))
            if vectors is not None:
                v16 = np.asarray(vectors, dtype=np.float16)
                w.executemany(
                    "INSERT INTO vectors(rowid, text_hash, vec) VALUES (?, ?, ?)",  # pragma: no mutate: SQL ignores case
                    ((start + i, values[i][-2], v16[i].tobytes()) for i in range(len(values))))
            self._bump(r["task"] for r in rows)

    def import_curated(self, path: Path) -> int:
        """The curated catalog (data/p0_models.jsonl) as rows with source=curated; skipped when unchanged."""
        text = Path(path).read_text(encoding="utf-8")  # pragma: no mutate: codec names ignore case
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        if self.meta("curated_hash") == digest:
            return 0
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(curated_row(json.loads(line)))
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path}:{n}: bad catalog row ({exc})") from None
        with self.transaction() as w:
            keep = {r["id"] for r in rows}
            gone = [(mid, task) for mid, task in w.execute(
                "SELECT id, task FROM models WHERE source='curated'",  # pragma: no mutate: SQL ignores case
            ) if mid not in keep]
            for mid, _ in gone:
                w.execute("DELETE FROM vectors WHERE rowid="  # pragma: no mutate: SQL ignores case
                          "(SELECT rowid FROM models WHERE id=?)",  # pragma: no mutate: SQL ignores case
                          (mid,))
                w.execute("DELETE FROM models WHERE id=?", (mid,))  # pragma: no mutate: SQL ignores case
            self._bump(t for _, t in gone)
            self.upsert(rows, source="curated")
            self.set_meta("curated_hash", digest)
        log.info("catalog store %s: imported %d curated models from %s", self.path, len(rows), path)
        return len(rows)

    def pending_count(self) -> int:
        with self._rlock:
            return self._r.execute(
                "SELECT count(*) FROM models m LEFT JOIN vectors v ON v.rowid = m.rowid "  # pragma: no mutate: SQL ignores case
                "WHERE v.rowid IS NULL OR v.text_hash != m.text_hash",  # pragma: no mutate: SQL ignores case
            ).fetchone()[0]

    def embed_pending(self, batch_size: int = 256, on_batch=None) -> int:
        """Embed every card without a current vector, a batch per transaction. Returns the number embedded."""
        if self.embedder is None:
            return 0
        done = 0
        while True:
            with self._rlock:
                rows = self._r.execute(
                    f"SELECT m.rowid, {', '.join(f'm.{c}' for c in COLUMNS)}, m.text_hash FROM models m "
                    "LEFT JOIN vectors v ON v.rowid = m.rowid "  # pragma: no mutate: SQL ignores case
                    "WHERE v.rowid IS NULL OR v.text_hash != m.text_hash LIMIT ?",  # pragma: no mutate: SQL ignores case
                    (batch_size,)).fetchall()
            if not rows:
                return done
            cards = [card_from_store_row(_decode(r[1:-1])) for r in rows]
            vecs = self.embedder.embed([c.text() for c in cards]).astype(np.float16)
            with self.transaction() as w:
                w.executemany("INSERT OR REPLACE INTO vectors(rowid, text_hash, vec) "  # pragma: no mutate: SQL ignores case
                              "VALUES (?, ?, ?)",  # pragma: no mutate: SQL ignores case
                              [(r[0], r[-1], v.tobytes()) for r, v in zip(rows, vecs, strict=True)])
                self._bump(c.task for c in cards)
            done += len(rows)
            if on_batch is not None:
                on_batch(done)

    # -- the vector index ---------------------------------------------------------------------------

    def _versions(self) -> dict[str, int]:
        with self._rlock:
            return dict(self._r.execute(
                "SELECT task, version FROM task_versions",  # pragma: no mutate: SQL ignores case
            ).fetchall())

    def index_stale(self) -> bool:
        if self.embedder is None:
            return False
        manifest = self._read_manifest()
        have = {t: e["version"] for t, e in manifest.get("tasks", {}).items()}
        return manifest.get("embedder") != self.meta("embedder") or have != self._versions()

    def _read_manifest(self) -> dict[str, Any]:
        try:
            return json.loads((self.index_dir / "manifest.json").read_text())
        except (OSError, ValueError):
            return {}

    def compile_index(self) -> list[str]:
        """Rebuild the arrays of every task whose rows changed; swap the manifest atomically. Returns the tasks.
        One process at a time (an flock on the index folder): each removes the arrays its manifest does not name,
        so two at once (a worker's start and another's Hub refresh, or a sync beside the server) could remove
        each other's new ones."""
        if self.embedder is None:
            return []
        with locked_folder(self.index_dir):
            return self._compile_index()

    def _compile_index(self) -> list[str]:
        old = self._read_manifest()
        embedder = self.meta("embedder")
        tasks = dict(old.get("tasks", {})) if old.get("embedder") == embedder else {}
        versions = self._versions()
        rebuilt = []
        for task, version in sorted(versions.items()):
            if tasks.get(task, {}).get("version") == version:
                continue
            stem = f"{_task_file(task)}-{version}-{os.getpid()}-{time.time_ns()}"
            tasks[task] = {"version": version, "stem": stem, "n": self._write_task(task, stem)}
            rebuilt.append(task)
        for task in set(tasks) - set(versions):
            del tasks[task]
        manifest = {"embedder": embedder, "dim": self.embedder.dim, "tasks": tasks, "built_at": time.time()}
        tmp = self.index_dir / f"manifest.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(manifest))
        os.replace(tmp, self.index_dir / "manifest.json")
        live = {e["stem"] for e in tasks.values()}
        for f in self.index_dir.glob("*.npy"):
            if f.name.split(".")[0] not in live:
                with contextlib.suppress(OSError):
                    f.unlink()  # a reader that mapped it keeps its pages
        self.reload()
        return rebuilt

    def _write_task(self, task: str, stem: str) -> int:
        dim = self.embedder.dim
        with self._rlock:
            rows = self._r.execute(
                "SELECT m.rowid, m.likes, m.downloads, m.size_mb, v.vec FROM models m "  # pragma: no mutate: SQL ignores case
                "JOIN vectors v ON v.rowid = m.rowid AND v.text_hash = m.text_hash "  # pragma: no mutate: SQL ignores case
                "WHERE m.task = ? ORDER BY m.rowid",  # pragma: no mutate: SQL ignores case
                (task,)).fetchall()
        n = len(rows)
        rowids = np.array([r[0] for r in rows], dtype=np.int64)  # pragma: no mutate: Python ints read as int64 anyway
        prior = popularity([r[1] for r in rows], [r[2] for r in rows])  # likes, downloads
        size = np.array([r[3] for r in rows], dtype=np.float32)  # None (unknown) is NaN
        vec = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.float16).reshape(n, dim)
        self._save_arrays(stem, rowids, vec, prior.astype(np.float32), size)  # pragma: no mutate: float64 ranks alike
        return n

    def _save_arrays(self, stem: str, rowids: np.ndarray, vec: np.ndarray, prior: np.ndarray, size: np.ndarray) -> None:
        bits = np.ascontiguousarray(pack_bits(vec).T)  # (words, n): each word's column is read in one pass
        for kind, arr in (("rowids", rowids), ("vec", vec), ("bits", bits), ("prior", prior), ("size", size)):
            np.save(self.index_dir / f"{stem}.{kind}.npy", arr)

    def reload(self) -> None:
        """Pick up a newer index (written by this process or by a sync in another one)."""
        path = self.index_dir / "manifest.json"
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            self._view = None
            return
        if mtime != self._manifest_mtime:
            self._view = IndexView(self.index_dir, self._read_manifest())
            self._manifest_mtime = mtime
            self._rows.clear()  # another process (a sync) may have rewritten rows
            self._task_counts = None

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked > 1.0:  # pragma: no mutate: a look at exactly 1 s or just after is the same look
            self._checked = now
            self.reload()

    # -- reading ------------------------------------------------------------------------------------

    def tasks(self) -> dict[str, int]:
        """Cards per task; counted once until the next write or index swap (a count over 500k rows is slow)."""
        self._maybe_reload()
        counts = self._task_counts
        if counts is None:
            with self._rlock:
                counts = dict(self._r.execute(
                    "SELECT task, count(*) FROM models GROUP BY task",  # pragma: no mutate: SQL ignores case
                ).fetchall())
            self._task_counts = counts
        return dict(counts)

    def count(self) -> int:
        with self._rlock:
            return self._r.execute("SELECT count(*) FROM models").fetchone()[0]  # pragma: no mutate: SQL ignores case

    def get(self, model_id: str) -> Candidate | None:
        with self._rlock:
            row = self._r.execute(f"SELECT rowid, {', '.join(COLUMNS)} FROM models WHERE id=?", (model_id,)).fetchone()
        if row is None:
            return None
        decoded = _decode(row[1:])
        return self._candidate(decoded, Factors(), 0.0, _row_card(decoded))

    def known_ids(self, ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        with self._rlock:
            for i in range(0, len(ids), CHUNK):
                chunk = list(ids[i:i + CHUNK])
                q = f"SELECT id FROM models WHERE id IN ({','.join('?' * len(chunk))})"
                out.update(r[0] for r in self._r.execute(q, chunk))
        return out

    def _fetch(self, rowids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Rows by rowid, decoded; the ones searches read often are kept (until the next write or index swap),
        so a selection does not query and parse the same few dozen rows on every request."""
        rows = self._rows
        out = {r: rows[r] for r in map(int, rowids) if r in rows}
        missing = [int(r) for r in rowids if int(r) not in out]
        with self._rlock:
            for i in range(0, len(missing), CHUNK):
                chunk = missing[i:i + CHUNK]
                q = f"SELECT rowid, {', '.join(COLUMNS)} FROM models WHERE rowid IN ({','.join('?' * len(chunk))})"
                out.update({r[0]: _decode(r[1:]) for r in self._r.execute(q, chunk)})
        if len(rows) > ROW_CACHE:
            rows.clear()
        rows.update((r, out[r]) for r in missing if r in out)
        return out

    def search(self, task: str, text: str = "", *, limit: int = 10, query_vector: np.ndarray | None = None,
               language: str | None = None, max_size_mb: float | None = None,
               availability: dict[str, str] | None = None, exclude: Iterable[str] = (),
               weights: Weights | None = None) -> list[Candidate]:
        """The `limit` best models for `task` and the request `text`, best first.

        availability: id -> a key of scoring.AVAILABILITY, what the caller knows now ("loaded" after a /status
        check); otherwise the store's static knowledge (curated local row -> "local", a live provider -> "hosted").
        exclude: ids never returned (e.g. those that already failed in this request)."""
        w = weights or self.weights
        exclude = set(exclude)
        self._maybe_reload()
        self.health.sync()  # failures another worker recorded count here too
        view = self._view
        try:
            index = view.task(task) if view is not None and self.embedder is not None else None
        except FileNotFoundError:  # another process swapped in a newer index (and removed these arrays) since
            self.reload()  # this view was read, and this task's arrays were not mapped yet: read the new one
            view = self._view
            index = view.task(task) if view is not None else None
        if index is None:
            return self._keyword_search(task, text, limit, language, max_size_mb, availability, exclude, w)
        q = query_vector if query_vector is not None else self.embedder.embed([f"{task}. {text}"])[0]
        q = np.asarray(q, dtype=np.float32)  # pragma: no mutate: another dtype changes only the sums' precision
        n = len(index.rowids)
        # within the size cap (None: no cap); an unknown size (NaN) is no reason to leave a model out
        ok = ~(np.asarray(index.size) > max_size_mb) if max_size_mb else None
        if n > self.rescore:
            qbits = pack_bits(q[None, :])[0]
            dist = np.zeros(n, dtype=np.uint16)  # pragma: no mutate: a wider count ranks alike, only slower
            for j, word in enumerate(qbits):  # one contiguous pass per 64-bit word (bits are stored word-major)
                dist += np.bitwise_count(np.bitwise_xor(index.bits[j], word))
            # cosine ~ 1 - 2 * hamming / dim; the constant is dropped
            approx = np.float32(w.popularity) * index.prior - np.float32(2.0 * w.meaning / q.shape[0]) * dist
            if ok is not None:
                approx = np.where(ok, approx, -np.inf)  # over the size cap: shortlisted last...
            top = np.argpartition(-approx, self.rescore)[:self.rescore]
            if ok is not None:
                top = top[ok[top]]  # ...and left out when fewer than `rescore` are within the cap
        else:
            top = np.arange(n) if ok is None else np.flatnonzero(ok)
        top = np.sort(top)  # sequential reads of the mapped matrix
        sims = index.vectors[top] @ q  # float16 rows times the float32 query: float32
        budget = self.budget_mb or max_size_mb
        static = w.meaning * sims + w.popularity * index.prior[top] + w.size * size_fit(index.size[top], budget)
        keep = min(len(top), max(3 * limit, 20) + len(exclude))
        order = np.argsort(-static, stable=True)[:keep]
        rows = self._fetch(index.rowids[top[order]].tolist())
        scored = []
        for j in order:
            row = rows.get(int(index.rowids[top[j]]))
            if row is None or row["id"] in exclude:
                continue
            scored.append((row, float(sims[j])))
        return self._finish(scored, text, limit, language, availability, w, budget)

    def _keyword_search(self, task, text, limit, language, max_size_mb, availability, exclude, w) -> list[Candidate]:
        """No vectors (no embedder, or the task is not embedded yet): word overlap over the most downloaded."""
        with self._rlock:
            rows = [_decode(r) for r in self._r.execute(
                f"SELECT {', '.join(COLUMNS)} FROM models WHERE task=? ORDER BY downloads DESC LIMIT 2000", (task,))]
        q = words(f"{task} {text}")
        scored = []
        for row in rows:
            if row["id"] in exclude or (max_size_mb and row.get("size_mb") and row["size_mb"] > max_size_mb):
                continue
            overlap = len(q & words(card_from_store_row(row).text())) / (1 + len(q))
            scored.append((row, overlap))
        return self._finish(scored, text, limit, language, availability, w, self.budget_mb or max_size_mb)

    def _finish(self, scored, text, limit, language, availability, w, budget) -> list[Candidate]:
        wanted = languages_in(text) | ({language} if language else set())
        ranked = []
        for row, meaning in scored:
            card = _row_card(row)
            f = Factors(
                meaning=meaning,
                popularity=card_popularity(card),
                language=language_fit(card, wanted),
                size=_size_fit1(card.size_mb, budget),
                latency=latency_fit(self.health.ewma_seconds(card.id), card.size_mb),
                availability=AVAILABILITY[(availability or {}).get(card.id) or static_availability(row, self.allowed_providers)],
                health=self.health.penalty(card.id),
            )
            ranked.append((score(f, w), f, row, card))
        ranked.sort(key=lambda r: -r[0])  # stable: equal scores keep the static order
        out = []
        for i, (s, f, row, card) in enumerate(ranked[:limit]):  # the reason: what put it ahead of the next
            out.append(self._candidate(row, f, s, card, versus=(ranked[i + 1][1] if i + 1 < len(ranked) else None, w)))
        return out

    def _candidate(self, row: dict[str, Any], f: Factors, s: float, card: ModelCard,
                   versus: tuple[Factors | None, Weights] | None = None) -> Candidate:
        return Candidate(card=card, score=s, factors=f, library=row.get("library"),
                         local=row.get("local"), providers=tuple(row.get("providers") or ()), gated=row.get("gated"),
                         license=row.get("license"), source=row["source"], versus=versus)

    def ranked(self, query: RankQuery, limit: int, **kw: Any) -> list[tuple[ModelCard, float]]:
        """Drop-in for `Catalog.ranked(query, ranker, limit)`: (card, score) pairs, best first."""
        return [(c.card, c.score) for c in self.search(query.task, query.text, limit=limit, language=query.language,
                                                       max_size_mb=query.max_size_mb, **kw)]

    # -- sync bookkeeping ---------------------------------------------------------------------------

    def sync_state(self, task: str) -> dict[str, Any]:
        keys = ("mode", "next_url", "fetched", "pass_started", "watermark", "completed_at")
        with self._rlock:
            row = self._r.execute(f"SELECT {', '.join(keys)} FROM sync_state WHERE task=?", (task,)).fetchone()
        if row is None:
            return dict.fromkeys(keys)
        return dict(zip(keys, row, strict=True))  # pragma: no mutate: the query reads these six keys' columns

    def set_sync_state(self, task: str, **values: Any) -> None:
        with self.transaction() as w:
            w.execute("INSERT OR IGNORE INTO sync_state(task) VALUES (?)", (task,))  # pragma: no mutate: SQL ignores case
            for k, v in values.items():
                w.execute(f"UPDATE sync_state SET {k}=? WHERE task=?", (v, task))

    def known_downloads(self, task: str, rank: int) -> int | None:
        """The downloads of the `rank`-th most downloaded model known for `task` (None: fewer known)."""
        with self._rlock:
            row = self._r.execute("SELECT downloads FROM models WHERE task=? "  # pragma: no mutate: SQL ignores case
                                  "ORDER BY downloads DESC LIMIT 1 OFFSET ?",  # pragma: no mutate: SQL ignores case
                                  (task, rank - 1)).fetchone()
        return row[0] if row else None


def pack_bits(vectors: np.ndarray) -> np.ndarray:
    """Sign bits of each row, as uint64 words (dim padded to a multiple of 64)."""
    v = np.asarray(vectors)
    pad = (-v.shape[1]) % 64
    signs = v > 0
    if pad:
        signs = np.pad(signs, ((0, 0), (0, pad)))
    return np.packbits(signs, axis=1).view(np.uint64)


def _size_fit1(size_mb: float | None, budget_mb: float | None) -> float:
    """scoring.size_fit for one card, without NumPy's per-call cost."""
    if size_mb is None or size_mb != size_mb:
        return 0.5
    if budget_mb:
        return min(1.0, max(0.0, 1.0 - size_mb / budget_mb))
    return 1.0 / (1.0 + size_mb / SIZE_REFERENCE_MB)


def static_availability(row: dict[str, Any], providers: frozenset[str] | None = None) -> str:
    """Where the row's model can run, from what the catalog knows: a curated local row, else hosted when some
    Inference Provider the config allows (`providers`; None: any) serves it."""
    if row.get("local"):
        return "local"
    if any(providers is None or p in providers for p in row.get("providers") or ()):
        return "hosted"
    return "unknown"


def _row_values(row: dict[str, Any], source: str) -> tuple:
    def js(v: Any) -> str:
        return json.dumps(list(v or []))

    local = row.get("local")
    return (row["id"], row["task"], source, row.get("library"), int(row.get("downloads") or 0),
            int(row.get("likes") or 0), js(row.get("tags")), js(row.get("language")), row.get("license"),
            None if row.get("gated") in (None, False) else str(row.get("gated")), row.get("params"),
            row.get("weight_bytes"), row.get("size_mb"), row.get("last_modified"), row.get("sha"),
            js(row.get("providers")), row.get("description") or "", json.dumps(local) if local else None)


def _decode(values: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(COLUMNS, values, strict=True))  # pragma: no mutate: every query here reads COLUMNS' columns
    row["tags"] = json.loads(row["tags"])
    row["language"] = json.loads(row.pop("languages"))
    row["providers"] = json.loads(row["providers"])
    row["local"] = json.loads(row["local"]) if row["local"] else None
    return row


def _row_card(row: dict[str, Any]) -> ModelCard:
    """The row's card, made once per decoded row (rows read often are cached, and so is their card)."""
    card = row.get("_card")
    if card is None:
        card = row["_card"] = card_from_store_row(row)
    return card


def card_from_store_row(row: dict[str, Any]) -> ModelCard:
    return card_from_row({k: row.get(k) for k in ("id", "task", "likes", "downloads", "tags", "language",
                                                  "description", "size_mb")})


def curated_row(row: dict[str, Any]) -> dict[str, Any]:
    card = card_from_row(row)
    return {"id": card.id, "task": card.task, "likes": card.likes, "downloads": card.downloads, "tags": list(card.tags),
            "language": list(card.language), "description": card.description, "size_mb": card.size_mb,
            "local": row.get("local"), "library": row.get("library")}


def open_store(config, embedder: Embedder | None = None) -> CatalogStore:
    """The store a Config names (`catalog_store`), with its curated rows, weights and size budget."""
    from .embedders import default_embedder

    budget = config.max_model_size_mb or (config.memory_budget_gb * 1024 if config.memory_budget_gb else None)
    if embedder is None:
        embedder = default_embedder(config.semantic_ranking, config.cache_dir, config.embedding_precision)
    return CatalogStore.open(config.catalog_store, embedder, curated=config.catalog_path,
                             weights=Weights.from_dict(config.catalog_weights), budget_mb=budget)
