"""The DAG runner: each task starts the moment its last dependency finishes.

A tiny state machine per task (pending -> running -> done | failed; pending -> skipped) driven by
completion callbacks on a thread pool: no polling loop, no sleeps. Knows nothing of models or HTTP.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from .requestctx import ContextThreadPool

log = logging.getLogger(__name__)

PENDING, RUNNING, DONE, FAILED, SKIPPED, TIMEOUT, CANCELLED = (
    "pending", "running", "done", "failed", "skipped", "timeout", "cancelled",
)


class TaskFailed(Exception):
    """Raised by a task body to fail with a payload (e.g. a JARVIS-shaped result holding `error`)."""

    def __init__(self, message: str, payload: Any = None):
        super().__init__(message)
        self.payload = payload


@dataclass
class Outcome:
    task_id: int
    state: str = PENDING
    result: Any = None
    error: str | None = None
    started_at: float | None = None  # time.perf_counter()
    finished_at: float | None = None

    @property
    def ok(self) -> bool:
        return self.state == DONE


EventSink = Callable[[str, dict[str, Any]], None]


def _no_event(name: str, payload: dict[str, Any]) -> None:
    """The event sink of a scheduler nobody watches."""


class Scheduler:
    """Run `body(task_id)` for every task added, each as soon as its dependencies are done.

    Tasks arrive through `add` (the streaming planner adds them as the plan is read), nothing starts before
    `start` (or `run`), `close_input` says no more will come, and `run` waits for them all. `of_graph` is the
    same machine fed a whole graph at once.
    """

    def __init__(self, body: Callable[[int], Any], *, max_workers: int = 8, on_event: EventSink | None = None,
                 executor: Executor | None = None):
        """max_workers: how many of its tasks run at once. executor: threads shared with other schedulers (no
        thread is started per request); without one the scheduler has a pool of its own."""
        self._body = body
        self._emit = on_event or _no_event
        self._lock = threading.Lock()
        self._all_done = threading.Event()
        # tasks added before `start` wait for it
        self._started = False  # pragma: no mutate: only its truth is read (None would do as well)
        self._closed = False  # pragma: no mutate: only its truth is read (None would do as well)
        self._closed_as: tuple[str, str] | None = None  # how cancel() or the deadline settled what was open
        self._outcomes: dict[int, Outcome] = {}
        self._waiting: dict[int, set[int]] = {}
        self._dependents: dict[int, list[int]] = defaultdict(list)
        self._open = 0
        self._input_open = True
        self._limit = max(1, max_workers)
        self._running = 0  # tasks handed to the executor and not finished
        self._backlog: deque[int] = deque()  # started while `_limit` tasks were running: they go next
        self._futures: list[Future] = []
        self._own_pool = executor is None
        self._pool = executor or ContextThreadPool(max_workers=self._limit, thread_name_prefix="task")

    @classmethod
    def of_graph(cls, graph: dict[int, list[int]], body: Callable[[int], Any], *,
                 failed_upfront: dict[int, str] | None = None, **kwargs: Any) -> Scheduler:
        """A whole DAG {id: [dependency ids]} at once; dependencies outside the graph are ignored."""
        scheduler = cls(body, **kwargs)
        failed_upfront = failed_upfront or {}
        for tid, deps in graph.items():
            scheduler.add(tid, [d for d in deps if d in graph], failed=failed_upfront.get(tid))
        scheduler.close_input()
        return scheduler

    # -- public -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every task whose dependencies are done; from now on an added task starts on arrival."""
        with self._lock:
            if self._started:
                return
            self._started = True
            starters = [t for t, deps in self._waiting.items() if not deps and self._outcomes[t].state == PENDING]
        for tid in starters:
            self._start(tid)

    def run(self, timeout: float | None = None) -> dict[int, Outcome]:
        """Start what is ready and block until every task is settled, the deadline passes, or cancel()."""
        self.start()
        finished = self._all_done.wait(timeout)
        with self._lock:
            if not finished:
                self._close(TIMEOUT, "deadline passed before the task finished")
            self._closed = True
            result = {tid: Outcome(**vars(o)) for tid, o in self._outcomes.items()}
        if self._own_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)  # pragma: no mutate: wait=None is false too
        else:
            for future in self._futures:  # what still waits in the shared executor never runs
                future.cancel()
        return result

    def add(self, tid: int, deps: list[int], failed: str | None = None) -> None:
        """One more task: once started, it runs at once if its dependencies are done, later otherwise.

        A task added after `cancel` (or the deadline) is settled the way the tasks open then were."""
        events: list[tuple[str, dict[str, Any]]] = []
        ready: list[int] = []  # this task, when it can start now
        with self._lock:
            if tid in self._outcomes or (not self._input_open and not self._closed):
                return
            if self._closed:  # cancelled (or past the deadline) before it came: it is reported as such
                if self._closed_as is not None:
                    state, reason = self._closed_as
                    self._outcomes[tid] = Outcome(tid, state, error=reason, finished_at=time.perf_counter())
                return
            deps = [d for d in dict.fromkeys(deps) if d != tid and d != -1]
            self._outcomes[tid] = Outcome(tid)
            self._open += 1
            dead = [d for d in deps if d in self._outcomes and self._outcomes[d].state not in (PENDING, RUNNING, DONE)]
            if failed:
                _, skipped = self._settle(tid, FAILED, None, failed)
                events.append(("task_failed", {"id": tid, "result": None, "error": failed, "seconds": 0.0}))
                events += [("task_skipped", {"id": s, "error": self._outcomes[s].error}) for s in skipped]
            elif dead:
                reason = f"skipped: task {dead[0]} it depends on did not finish ({self._outcomes[dead[0]].error})"
                _, skipped = self._settle(tid, SKIPPED, None, reason)
                events.extend(("task_skipped", {"id": s, "error": self._outcomes[s].error}) for s in [tid, *skipped])
            else:
                waiting = {d for d in deps if not (d in self._outcomes and self._outcomes[d].state == DONE)}
                self._waiting[tid] = waiting
                for d in waiting:
                    self._dependents[d].append(tid)
                if not waiting and self._started:
                    ready.append(tid)
        for name, payload in events:
            self._emit(name, payload)
        for r in ready:
            self._start(r)

    def close_input(self) -> None:
        """No more tasks will be added; a task still waiting for one that never came is skipped."""
        events: list[tuple[str, dict[str, Any]]] = []
        with self._lock:
            self._input_open = False  # pragma: no mutate: only its truth is read (None would do as well)
            for tid, waiting in list(self._waiting.items()):
                missing = [d for d in waiting if d not in self._outcomes]
                if missing and self._outcomes[tid].state == PENDING:  # its dependents are skipped with it
                    _, skipped = self._settle(tid, SKIPPED, None,
                                              f"skipped: it depends on task {missing[0]}, which is not in the plan")
                    events += [("task_skipped", {"id": s, "error": self._outcomes[s].error}) for s in [tid, *skipped]]
            if self._open == 0:
                self._all_done.set()
        for name, payload in events:
            self._emit(name, payload)

    def outcomes(self) -> dict[int, Outcome]:
        """A copy of every task's outcome now (also after `run` returned)."""
        with self._lock:
            return {tid: Outcome(**vars(o)) for tid, o in self._outcomes.items()}

    def cancel(self, reason: str = "cancelled by the client") -> None:
        with self._lock:
            if not self._closed:
                self._close(CANCELLED, reason)
                self._closed = True
        self._all_done.set()

    # -- internals ----------------------------------------------------------------------------

    def _close(self, state: str, reason: str) -> None:
        self._closed_as = (state, reason)
        for o in self._outcomes.values():
            if o.state in (PENDING, RUNNING):
                o.state, o.error = state, reason
                o.finished_at = time.perf_counter()

    def _start(self, tid: int) -> None:
        with self._lock:
            if self._outcomes[tid].state != PENDING:  # settled meanwhile (closing settles every pending task)
                return
            self._outcomes[tid].state = RUNNING
            self._outcomes[tid].started_at = time.perf_counter()
            if self._running >= self._limit:
                self._backlog.append(tid)
                return
            self._running += 1
        self._submit(tid)

    def _submit(self, tid: int) -> None:
        try:
            future = self._pool.submit(self._work, tid)
        except RuntimeError:  # pool shut down by a deadline that passed meanwhile
            return
        with self._lock:
            self._futures.append(future)

    def _work(self, tid: int) -> None:
        try:
            self._emit("task_started", {"id": tid})
            try:
                result = self._body(tid)
                state, error = DONE, None
            except TaskFailed as exc:
                result, state, error = exc.payload, FAILED, str(exc)
            except Exception as exc:  # noqa: BLE001 - a task's crash must not take the request down
                log.exception("task %s crashed", tid)
                result, state, error = None, FAILED, f"{exc.__class__.__name__}: {exc}"
        finally:
            with self._lock:  # the slot goes to the next task that was waiting for one
                following = self._backlog.popleft() if self._backlog and not self._closed else None
                if following is None:
                    self._running -= 1
        if following is not None:
            self._submit(following)
        with self._lock:
            if self._closed:
                return
            ready, skipped = self._settle(tid, state, result, error)
        outcome = self._outcomes[tid]
        seconds = outcome.finished_at - outcome.started_at  # type: ignore[operator]  # both set: started, then settled
        payload = {"id": tid, "result": result, "error": error, "seconds": round(seconds, 4)}
        self._emit("task_finished" if state == DONE else "task_failed", payload)
        for s in skipped:
            self._emit("task_skipped", {"id": s, "error": self._outcomes[s].error})
        for r in ready:
            self._start(r)

    def _settle(self, tid: int, state: str, result: Any, error: str | None) -> tuple[list[int], list[int]]:
        """Record an outcome (lock held); return (dependents now ready, dependents now skipped)."""
        now = time.perf_counter()
        o = self._outcomes[tid]
        o.state, o.result, o.error, o.finished_at = state, result, error, now
        self._open -= 1
        ready: list[int] = []
        skipped: list[int] = []
        if state == DONE:
            for d in self._dependents[tid]:
                self._waiting[d].discard(tid)
                if not self._waiting[d] and self._outcomes[d].state == PENDING:
                    ready.append(d)
        else:
            stack = [(d, tid) for d in self._dependents[tid]]
            while stack:
                d, cause = stack.pop()
                od = self._outcomes[d]
                if od.state != PENDING:
                    continue
                od.state, od.finished_at = SKIPPED, now
                od.error = f"skipped: task {cause} it depends on did not finish ({self._outcomes[cause].error})"
                skipped.append(d)
                self._open -= 1
                stack += [(x, d) for x in self._dependents[d]]
        if self._open == 0 and not self._input_open:
            self._all_done.set()
        return ready, skipped
