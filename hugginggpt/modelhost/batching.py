"""Dynamic batching: concurrent calls that share a key (one model, one task) run as one batch.

Plain data in and out: `Batcher.submit(key, item, run)` blocks until `run(items)` has run on a batch that holds
`item`, and returns that item's own result, or raises that item's own exception. Nothing here knows of HTTP or
of models; the engine (`engine.py`) decides what a key and an item are.

How a batch forms. The first caller of a key with no open batch leads it. While the model is busy with an earlier
batch, the new batch keeps taking callers (up to `max_size`), so callers gather while they would have waited
anyway. Once the model is free for it, the batch runs at once if it is full or if the key's previous batch held
one caller (one caller at a time never waits: batching costs a lone caller nothing; a key's first batch runs at
once too, and usually loads the model while the next callers gather); otherwise it waits at most `wait_s` more
for company, which merges callers who were a few milliseconds behind into one larger batch. One batch per key
runs at a time.

Errors. `run` returns one result per item, where an item's result may be an exception (that caller's alone).
If `run` raises, every caller of the batch gets the exception: the engine's `run` uses `each_or_batch`, which
retries a failed batch one item at a time, so one bad input fails only its caller.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..cancel import Cancelled
from . import progress

log = logging.getLogger(__name__)

MAX_KEYS = 1024  # keys remembered (for their last batch's size) before idle ones are forgotten

# How many requests the batch that answered this request held (1: it ran alone); the app reports it in the
# `X-Batch-Size` header. Set in the caller's own thread by the engine.
batch_size_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("batch_size", default=None)


@dataclass
class _Batch:
    items: list[Any] = field(default_factory=list)
    watches: list[Any] = field(default_factory=list)  # each item's caller's progress watch (None: unwatched)
    outcomes: list[tuple[bool, Any]] | None = None  # (ok, result or exception) per item
    ran: int = 0  # how many of its items the batch ran (those whose callers were still there)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Key:
    runner: threading.Lock = field(default_factory=threading.Lock)  # one batch of this key runs at a time
    open: _Batch | None = None  # the batch that new callers join
    last_size: int = 0  # how many items the key's previous batch held
    users: int = 0  # callers between submit and return


class Batcher:
    """Gathers concurrent `submit` calls of one key into batches of at most `max_size` items."""

    def __init__(self, max_size: int, wait_s: float):
        if max_size < 1 or wait_s < 0:
            raise ValueError("max_size must be at least 1 and wait_s at least 0")
        self.max_size = max_size
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._keys: dict[Hashable, _Key] = {}

    def submit(self, key: Hashable, item: Any, run: Callable[[list[Any]], list[Any]]) -> tuple[Any, int]:
        """Run `item` in a batch of its key; returns (its result, the batch's size) or raises its exception.

        `run` gets the batch's items and returns one result per item (an exception instance fails its item only).
        """
        with self._lock:
            k = self._keys.get(key)
            if k is None:
                if len(self._keys) >= MAX_KEYS:  # keys are kept for their last_size; idle ones go past this many
                    for old in [o for o, ko in self._keys.items() if ko.users == 0]:
                        del self._keys[old]
                k = self._keys[key] = _Key()
            k.users += 1
            batch = k.open
            leader = batch is None
            if batch is None:
                batch = k.open = _Batch()
            index = len(batch.items)
            batch.items.append(item)
            batch.watches.append(progress.current())
            if len(batch.items) >= self.max_size:
                k.open = None  # full: the next caller starts another
                self._changed.notify_all()
        try:
            if leader:
                self._lead(k, batch, run)
            else:
                progress.phase(progress.QUEUED, "in a batch with other requests for this model")
                batch.done.wait()
        finally:
            with self._lock:
                k.users -= 1
        assert batch.outcomes is not None
        ok, value = batch.outcomes[index]
        if not ok:
            raise value
        return value, batch.ran

    def _lead(self, k: _Key, batch: _Batch, run: Callable[[list[Any]], list[Any]]) -> None:
        try:
            # it keeps filling meanwhile; a leader whose client left still leads (its item is then not run)
            with progress.waiting_for(k.runner, "behind a batch of this model", leave=False):
                with self._lock:
                    if k.last_size > 1:  # company is likely: wait a little for more of it
                        deadline = time.monotonic() + self.wait_s
                        while k.open is batch and (left := deadline - time.monotonic()) > 0:  # pragma: no mutate: float clock
                            self._changed.wait(left)
                    if k.open is batch:
                        k.open = None
                    k.last_size = len(batch.items)
                # the callers who left while the batch filled or waited are not run: nobody reads their results
                live = [i for i, w in enumerate(batch.watches) if w is None or not w.stopped]
                items = [batch.items[i] for i in live]
                outcomes: list[tuple[bool, Any]] = [(False, Cancelled("the client left before its batch ran"))] * len(
                    batch.items)
                try:
                    results = run(items) if items else []
                    if len(results) != len(items):
                        raise RuntimeError(f"a batch of {len(items)} gave {len(results)} results")
                    for i, r in zip(live, results, strict=True):
                        outcomes[i] = (not isinstance(r, BaseException), r)
                except Exception as exc:  # noqa: BLE001 - the batch's failure is every caller's
                    for i in live:
                        outcomes[i] = (False, exc)
                batch.ran = len(items)
                batch.outcomes = outcomes
        finally:
            if batch.outcomes is None:  # KeyboardInterrupt and the like: no caller may wait for ever
                batch.outcomes = [(False, RuntimeError("the batch was interrupted"))] * len(batch.items)
            batch.done.set()


def each_or_batch(run: Callable[[list[Any]], list[Any]], items: list[Any]) -> list[Any]:
    """`run(items)`; if that raises and there were several, each item again alone, so one bad item fails alone.

    Returns one result per item; an item that failed alone has its exception as its result.
    """
    try:
        results = run(items)
        if len(results) != len(items):
            raise RuntimeError(f"a batch of {len(items)} gave {len(results)} results")
        return results
    except Exception as exc:  # noqa: BLE001
        if len(items) == 1:
            return [exc]
        log.info("a batch of %d failed (%s: %s); running its items one at a time", len(items),
                 exc.__class__.__name__, str(exc)[:200])
    out: list[Any] = []
    for item in items:
        try:
            out.append(run([item])[0])
        except Exception as exc:  # noqa: BLE001
            out.append(exc)
    return out
