"""What the server learned by running models: successes, failures and latency, kept in the catalog store.

`Health.record(model_id, ok, seconds)` is called once per execution; `penalty(model_id)` (0..1) ranks a
model that failed recently lower, decaying with time; `ewma_seconds` feeds the expected-latency factor.
Rows live in the store's SQLite file, so a restart keeps them; reads come from an in-memory copy, which `sync`
refreshes when the file changed since (a write by this process or by another worker process of the server).
A record reads the row, updates it and writes it back in one write transaction, so two workers never lose
each other's counts.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE IF NOT EXISTS health(
  model TEXT PRIMARY KEY,
  ok INTEGER NOT NULL DEFAULT 0,
  failed INTEGER NOT NULL DEFAULT 0,
  consecutive_failures INTEGER NOT NULL DEFAULT 0,
  last_ok REAL,
  last_failure REAL,
  last_error TEXT,
  ewma_seconds REAL
);
"""
EWMA_ALPHA = 0.3
# SQL is written in triple quotes: its keywords and names are case-insensitive, and mutmut leaves such strings alone
COLUMNS = "model, ok, failed, consecutive_failures, last_ok, last_failure, last_error, ewma_seconds"


@dataclass
class ModelHealth:
    model: str
    ok: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    last_ok: float | None = None
    last_failure: float | None = None
    last_error: str | None = None
    ewma_seconds: float | None = None


class Health:
    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock | None = None, half_life_hours: float = 6.0,
                 clock=time.time, reader: tuple[sqlite3.Connection, threading.Lock] | None = None):
        """conn, lock: the store's writer connection and its lock. reader: a second connection (and its lock)
        that `sync` reads with, so a search never waits behind a write; it sees this process's writes too."""
        self.conn = conn
        self.lock = lock or threading.RLock()
        self.reader, self.reader_lock = reader if reader is not None else (conn, self.lock)
        self.half_life_s = half_life_hours * 3600.0
        self.clock = clock
        self._version: int | None = None  # pragma: no mutate: any non-int differs from every data_version
        with self.lock:
            conn.executescript(SCHEMA)
        self.sync()

    def sync(self) -> None:
        """Take in what other connections (the server's other workers) recorded since the last look: one cheap
        PRAGMA when nothing changed."""
        with self.reader_lock:
            version = self.reader.execute("""PRAGMA data_version""").fetchone()[0]
            if version == self._version:
                return
            rows = self.reader.execute(f"SELECT {COLUMNS} FROM health").fetchall()
            self._version = version
        # swapped in whole, without the write lock: a search here never waits for a sync's long write
        self._rows = {r[0]: ModelHealth(*r) for r in rows}

    def record(self, model_id: str, ok: bool, seconds: float | None = None, error: str | None = None) -> None:
        """One execution of `model_id`: persisted before returning."""
        now = self.clock()
        with self.lock:
            own = not self.conn.in_transaction
            if own:
                self.conn.execute("""BEGIN IMMEDIATE""")  # another worker's record waits for this one
            try:
                row = self.conn.execute(f"SELECT {COLUMNS} FROM health WHERE model=?", (model_id,)).fetchone()
                h = ModelHealth(*row) if row else ModelHealth(model_id)
                self._update(h, ok, seconds, error, now)
                self.conn.execute(
                    """INSERT OR REPLACE INTO health(model, ok, failed, consecutive_failures, last_ok, last_failure,
                    last_error, ewma_seconds) VALUES (?,?,?,?,?,?,?,?)""",
                    (h.model, h.ok, h.failed, h.consecutive_failures, h.last_ok, h.last_failure, h.last_error,
                     h.ewma_seconds))
                if own:
                    self.conn.execute("""COMMIT""")
            except BaseException:
                if own and self.conn.in_transaction:
                    self.conn.execute("""ROLLBACK""")
                raise
            self._rows = {**self._rows, model_id: h}  # a new dict: one being read is never changed under it

    @staticmethod
    def _update(h: ModelHealth, ok: bool, seconds: float | None, error: str | None, now: float) -> None:
        """One run's outcome added to the row as it stands in the file."""
        if ok:
            h.ok += 1
            h.consecutive_failures = 0
            h.last_ok = now
            if seconds is not None:
                h.ewma_seconds = seconds if h.ewma_seconds is None else (
                    EWMA_ALPHA * seconds + (1 - EWMA_ALPHA) * h.ewma_seconds)
        else:
            h.failed += 1
            h.consecutive_failures += 1
            h.last_failure = now
            h.last_error = (error or "")[:500] or None

    def get(self, model_id: str) -> ModelHealth | None:
        return self._rows.get(model_id)

    def penalty(self, model_id: str) -> float:
        """0 (healthy or never run) .. 1: one recent failure gives 0.5, two or more 1, halving every half-life."""
        h = self._rows.get(model_id)
        if h is None or h.last_failure is None:  # never failed (after a success, consecutive_failures is 0)
            return 0.0
        age = max(0.0, self.clock() - h.last_failure)
        return min(1.0, h.consecutive_failures / 2) * 0.5 ** (age / self.half_life_s)

    def ewma_seconds(self, model_id: str) -> float | None:
        h = self._rows.get(model_id)
        return h.ewma_seconds if h else None

    def failed_since(self, since: float) -> set[str]:
        """Models whose last failure is at or after `since` (a request's start: not retried by its replan)."""
        return {m for m, h in self._rows.items() if h.last_failure is not None and h.last_failure >= since
                and h.consecutive_failures}
