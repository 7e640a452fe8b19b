"""Fill the catalog store from the Hub: per pipeline tag, most downloaded first; resumable and incremental.

Per task, a *pass* lists the Hub's models page by page. Each page is written in one transaction with
the URL of the next page, so an interrupted pass (Ctrl-C, a network error) resumes at that page and the
store never holds half a page. New and changed cards are embedded per page, before its transaction.

- The first pass of a task (or `full=True`) lists by downloads, up to `per_task` models.
- Later passes list by last modification, newest first, and stop at the first model not modified since
  the previous pass started (less an hour for clock skew): only what changed is fetched. A changed model
  is kept when already known or, with `per_task`, when its downloads reach the known top `per_task`.
  Download and like counts of unchanged models move slowly; a full pass (`--full`, or automatically
  after `full_every_days`) refreshes them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from .hub_api import PAGE_SIZE, HubClient, hub_row
from .store import CatalogStore

log = logging.getLogger(__name__)

# The planner's task types that are Hub pipeline tags (ControlNet tasks and `conversational` are not).
HUB_TASKS = ("token-classification", "text-classification", "text2text-generation", "summarization", "translation",
             "question-answering", "text-generation", "sentence-similarity", "tabular-classification",
             "object-detection", "image-classification", "image-to-image", "image-to-text", "text-to-image",
             "text-to-video", "visual-question-answering", "document-question-answering", "image-segmentation",
             "depth-estimation", "text-to-speech", "automatic-speech-recognition", "audio-to-audio",
             "audio-classification")
CLOCK_SKEW = timedelta(hours=1)
FULL_EVERY_DAYS = 7.0


@dataclass
class TaskReport:
    mode: str = "full"
    pages: int = 0
    fetched: int = 0
    written: int = 0
    embedded: int = 0
    resumed: bool = False


@dataclass
class SyncReport:
    tasks: dict[str, TaskReport] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def fetched(self) -> int:
        return sum(t.fetched for t in self.tasks.values())

    @property
    def rate(self) -> float:
        return self.fetched / self.seconds if self.seconds > 0 else 0.0


class Progress:
    """One line on stderr per update (at most every `every` seconds): cards so far, rate and ETA."""

    def __init__(self, out: TextIO | None = sys.stderr, every: float = 0.5):
        self.out = out
        self.every = every
        self.started = time.monotonic()
        self.last = 0.0
        self.cards = 0

    def update(self, task: str, done: int, total: int | None, added: int, final: bool = False) -> None:
        self.cards += added
        now = time.monotonic()
        if self.out is None or (not final and now - self.last < self.every):
            return
        self.last = now
        rate = self.cards / max(now - self.started, 1e-6)
        eta = f", ETA {max(total - done, 0) / rate:.0f}s" if total and rate > 0 else ""
        of = f"/{total}" if total else ""
        self.out.write(f"[sync] {task}: {done}{of} cards, {rate:.0f} cards/s{eta}\n")
        self.out.flush()


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


def _parse(value: str | None) -> datetime | None:
    if not value:
        return None
    dt = datetime.fromisoformat(value)  # Python 3.11 reads the Hub's "Z" itself
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def sync_task(store: CatalogStore, client: HubClient, task: str, *, per_task: int | None = None, full: bool = False,
              page_size: int = PAGE_SIZE, progress: Progress | None = None,
              on_page: Callable[[int], None] | None = None, now: datetime | None = None) -> TaskReport:
    state = store.sync_state(task)
    report = TaskReport()
    now = now or datetime.now(UTC)
    stale = state["completed_at"] is not None and time.time() - state["completed_at"] > FULL_EVERY_DAYS * 86400
    if state["next_url"]:
        report.mode, report.resumed = state["mode"], True
        fetched, started = state["fetched"] or 0, state["pass_started"]
    else:
        report.mode = "full" if full or stale or state["watermark"] is None else "changes"
        fetched, started = 0, _iso(now)
        # next_url and fetched are clear already: the end of every pass clears them
        store.set_sync_state(task, mode=report.mode, pass_started=started)
    watermark = _parse(state["watermark"])
    sort = "downloads" if report.mode == "full" else "lastModified"
    if per_task is not None and report.mode == "full" and fetched >= per_task:
        pages: Any = []
    else:
        pages = client.pages(task, sort=sort, start_url=state["next_url"], page_size=page_size)
    done = False  # pragma: no mutate: None reads as False wherever done is read
    for page in pages:
        rows = [hub_row(info, task) for info in page.items]
        rows = [r for r in rows if r["task"] == task]
        report.pages += 1
        if report.mode == "changes":
            changed = [r for r in rows if watermark is None or (_parse(r["last_modified"]) or now) >= watermark]
            done = len(changed) < len(rows)  # sorted newest first: the rest is older
            rows = _worth_keeping(store, task, changed, per_task)
        elif per_task is not None:
            rows = rows[:per_task - fetched]  # fewer than per_task fetched so far: see above
            done = fetched + len(rows) >= per_task
        done = done or page.next_url is None
        write, _ = store.diff(rows)
        vectors = {}
        new_text = [r for r in write if r.pop("_new_text")]
        if store.embedder is not None and new_text:
            from .store import card_from_store_row

            vecs = store.embedder.embed([card_from_store_row(r).text() for r in new_text])
            vectors = {r["id"]: v for r, v in zip(new_text, vecs, strict=True)}
        fetched += len(rows)
        with store.transaction():
            store.upsert(write, vectors=vectors)
            if done:
                store.set_sync_state(task, mode=None, next_url=None, fetched=0, completed_at=time.time(),
                                     watermark=_iso(_parse(started) - CLOCK_SKEW))
            else:
                store.set_sync_state(task, next_url=page.next_url, fetched=fetched)
        report.fetched += len(rows)
        report.written += len(write)
        report.embedded += len(vectors)
        if progress is not None:
            progress.update(task, fetched, per_task if report.mode == "full" else None, len(rows), final=done)
        if on_page is not None:
            on_page(report.pages)
        if done:
            break
    if not done:  # no page at all (per_task already reached by a resumed pass)
        store.set_sync_state(task, mode=None, next_url=None, fetched=0, completed_at=time.time(),
                             watermark=_iso(_parse(started) - CLOCK_SKEW))
    return report


def _worth_keeping(store: CatalogStore, task: str, rows: list[dict[str, Any]], per_task: int | None) -> list[dict]:
    """With a per-task limit, a changed model that is neither known nor in the known top `per_task` is skipped."""
    if per_task is None or not rows:
        return rows
    floor = store.known_downloads(task, per_task)
    known = store.known_ids([r["id"] for r in rows])
    return [r for r in rows if r["id"] in known or floor is None or r["downloads"] >= floor]


def sync(store: CatalogStore, client: HubClient, tasks: Sequence[str], *, per_task: int | None = None,
         full: bool = False, page_size: int = PAGE_SIZE, progress: Progress | None = None,
         on_page: Callable[[int], None] | None = None) -> SyncReport:
    """Sync every task, then rebuild the vector index of the tasks that changed."""
    report = SyncReport()
    started = time.monotonic()
    try:
        for task in tasks:
            report.tasks[task] = sync_task(store, client, task, per_task=per_task, full=full, page_size=page_size,
                                           progress=progress, on_page=on_page)
    finally:
        report.seconds = time.monotonic() - started
    store.embed_pending()  # rows written without a vector (e.g. the embedder changed mid-way)
    store.compile_index()
    return report


class BackgroundRefresh:
    """Re-sync every `hours` on a daemon thread; searches keep using the previous index until the swap."""

    def __init__(self, store: CatalogStore, client: HubClient, tasks: Sequence[str], hours: float,
                 per_task: int | None = None):
        self.store, self.client, self.tasks, self.hours, self.per_task = store, client, list(tasks), hours, per_task
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="catalog-refresh", daemon=True)
        self.runs = 0

    def start(self) -> BackgroundRefresh:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)  # pragma: no mutate: only tests stop a refresh (a daemon thread); how long they wait is theirs

    def _run(self) -> None:
        while not self._stop.wait(timedelta(hours=self.hours).total_seconds()):
            try:
                report = sync(self.store, self.client, self.tasks, per_task=self.per_task, progress=None)
                log.info("catalog refresh: %d cards fetched in %.1fs", report.fetched, report.seconds)
            except Exception:  # noqa: BLE001 - the next refresh tries again; searches are unaffected
                log.exception("catalog refresh failed")
            self.runs += 1
