"""Where model work runs (the flask engine's pool, a Ray replica): a few long-lived threads, each with its share
of the cores.

Why not on the web server's own threads: torch runs its CPU kernels on an OpenMP team that belongs to the
thread that called them, and a team lives as long as its thread. The server answers on up to
`max_concurrent_requests` + 16 threads; when each ran models itself, every one that ever did kept a team as
large as the machine, and once the teams' threads outnumber the cores, libgomp stops spinning between kernels
and puts its threads to sleep after each one. On 2 cores the tiny diffusion pipeline then took 3x as long
through the server as the same call made from a script (`bench/progress_cost.py` prints both). So loads and
calls go to `threads` threads here, each running torch on `cores // threads` threads of its own: the teams
together never outnumber the cores, whichever web thread took the request.

Only the work itself comes here. Waiting for a model another request is using, or for another load, happens on
the caller's thread first (pool.py, ray_engine.in_turn), and so does fetching a request's input URLs
(handlers.Inputs.fetch_urls): a compute thread never waits for a lock or a peer. On the CPU's one thread a call
of one model does wait behind another model's running call, and a watched call says so (`queued`, "behind
other models' calls"). The caller's context comes along, so a watched call reports its steps and stops when its
client leaves, as before.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ..cancel import Cancelled
from . import progress

T = TypeVar("T")
log = logging.getLogger(__name__)

CPU_THREADS = 1  # on the CPU calls take turns: each has every core, and the first to come finishes first
ACCELERATOR_THREADS = 4  # on a GPU the cores feed the device; calls of different models overlap there


def cores() -> int:
    """The cores torch would use: OMP_NUM_THREADS where set, else the cores this process may run on."""
    configured = (os.environ.get("OMP_NUM_THREADS") or "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1  # pragma: no mutate: never runs on Linux, where this is tested


class Compute:
    """`run(fn, *args)` runs `fn(*args)` on one of `threads` compute threads, in the caller's context, and
    returns its result or raises its exception in the caller's thread.

    The threads are daemons started on first use: a server stopped with Ctrl-C in the middle of a long diffusion
    call exits at once, as it did when the web threads (daemons too) ran the models.
    """

    def __init__(self, threads: int, torch_threads: int | None = None):
        """torch_threads: torch's threads for each compute thread (default: the cores shared among them)."""
        if threads < 1:
            raise ValueError("compute threads must be at least 1")
        self.threads = threads
        self.torch_threads = torch_threads or max(1, cores() // threads)
        self._work: queue.SimpleQueue[tuple[Future, Callable[[], Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._calls = 0  # calls between run's start and end: running, or waiting for a thread

    def run(self, fn: Callable[..., T], *args: Any, resume: str = progress.RUNNING) -> T:
        return self.submit(fn, *args, resume=resume).result()

    def submit(self, fn: Callable[..., T], *args: Any, resume: str = progress.RUNNING) -> Future[T]:
        """`run` without waiting: the future of `fn(*args)` (a Ray replica awaits it on its event loop). A future
        cancelled before its turn never runs, nor does one whose client left while it waited. `resume`: the
        phase a watched call that had to wait reports when its turn comes (`loading` for a load)."""
        with self._lock:
            wait = self._calls >= self.threads
            self._calls += 1
            if self._started < min(self._calls, self.threads):
                self._started += 1
                threading.Thread(target=self._serve, name=f"model-compute-{self._started}", daemon=True).start()
        if wait:
            progress.phase(progress.QUEUED, "behind other models' calls")
        done: Future[T] = Future()
        done.add_done_callback(self._cancelled)
        self._work.put((done, functools.partial(contextvars.copy_context().run, _started, wait, resume, fn, *args)))
        return done

    def _cancelled(self, done: Future[Any]) -> None:
        if done.cancelled():  # it never reaches a thread: counted out here (the others in _serve)
            self._given_back()

    def _given_back(self) -> None:
        with self._lock:
            self._calls -= 1

    def _serve(self) -> None:
        try:
            import torch

            torch.set_num_threads(self.torch_threads)
        except Exception as exc:  # noqa: BLE001 - the thread must serve anyway, or every call would wait for ever
            log.warning("compute thread: torch's threads left as they were (%s: %s)", exc.__class__.__name__, exc)
        while True:
            done, work = self._work.get()
            if not done.set_running_or_notify_cancel():  # its caller gave up while it waited
                del done, work
                continue
            try:
                result = work()
            except BaseException as exc:  # noqa: BLE001 - the caller's to handle, in its own thread
                self._given_back()  # before its caller wakes: its next call is not told it waits behind itself
                done.set_exception(exc)
            else:
                self._given_back()
                done.set_result(result)
                del result
            # hold nothing while idle: the last call's model and answer are the caller's, and an evicted model
            # must give its memory back
            del done, work


def _started(waited: bool, resume: str, fn: Callable[..., T], *args: Any) -> T:
    watch = progress.current()
    if watch is not None and watch.stopped:  # its client left while it waited: nobody to run it for
        raise Cancelled("the client left while the call waited for a compute thread")
    if waited:  # the queued phase ends here; a task with steps reports them next
        progress.phase(resume)
    return fn(*args)


def default_threads(device: str) -> int:
    return CPU_THREADS if device == "cpu" else ACCELERATOR_THREADS


def for_device(device: str, threads: int | None = None) -> Compute:
    """The compute threads of a server or replica on `device`: `threads` (the `compute_threads` setting) or the
    device's default."""
    return Compute(threads or default_threads(device))
