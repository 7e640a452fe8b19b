"""Several orchestrator processes on one port (`http_workers`): one GIL is what limits a single process.

A request's own CPU is small (about 20 ms for three tasks), but it is Python holding the GIL, so at 50 requests
at once one process queues them on its GIL while the second core idles (bench/load.py on 2 cores: p99
1.44-1.61x one request alone with one process, 1.23-1.40x with two; bench/README.md, round 4). The
supervisor binds the listening sockets, starts `http_workers` processes (spawned, never forked: no threads or
model sessions are copied) that all accept on them, and restarts a worker that dies. The workers share, through the supervisor:

- admission: `max_concurrent_requests` counts every worker's requests (`SharedSlots`, one counter per worker in
  shared memory, so a dead worker's slots are given back);
- metrics: prometheus_client's multiprocess mode, in a folder of the supervisor's; /metrics sums all workers;
- the catalog store on disk (SQLite in WAL mode), which only worker 0 refreshes from the Hub, with the models'
  health (`catalog/health.py` reads what other workers recorded), and uploads, whose quota is checked under a
  file lock.

Worker 0 starts first and the others once it has warmed (exported the sentence model, opened the catalog
store), so caches on disk are built once. A worker exits when the supervisor does, even when it is killed.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import Config

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when a worker imports it
WARM_WAIT_SECONDS = 600.0  # worker 0's warm-up (a first ONNX export and catalog embedding) before the others start
RESTART_PAUSE_SECONDS = 1.0
QUICK_DEATH_SECONDS = 10.0  # a worker that dies this soon after starting, three times in a row, stops the server
STOP_SECONDS = 10.0
LOCK_SECONDS = 2.0  # the admission counts' lock is held for a sum over a few ints: longer means its holder died


class SharedSlots:
    """`max_concurrent_requests` across worker processes: one count per worker in a shared array, so the
    supervisor can zero a dead worker's count. Never blocks: past the limit, `acquire` is False.

    The array's lock is a plain lock (not multiprocessing's default RLock), so that when a worker dies holding
    it the supervisor can release it for the dead worker (`free_lock_of_the_dead`)."""

    def __init__(self, held: Any, index: int, limit: int):
        self.held, self.index, self.limit = held, index, limit

    def acquire(self, blocking: bool = False) -> bool:  # pragma: no mutate: `blocking` is ignored (never blocks)
        with self._counts() as counts:
            if counts is None or sum(counts) >= self.limit:  # None: its holder died; the supervisor frees it
                return False
            counts[self.index] += 1
            return True

    def release(self) -> None:
        with self._counts() as counts:
            if counts is not None:  # else the supervisor zeroes this worker's count if it dies
                counts[self.index] = max(0, counts[self.index] - 1)

    def _counting(self) -> Iterator[Any]:
        """The counts under their lock, or None when the lock cannot be had (its holder died holding it)."""
        lock = self.held.get_lock()
        if not lock.acquire(timeout=LOCK_SECONDS):
            yield None
            return
        try:
            yield self.held.get_obj()
        finally:
            lock.release()

    _counts = contextmanager(_counting)  # wrapped, not decorated: mutmut skips decorated functions


def shared_counts(ctx: Any, workers: int) -> Any:
    """The admission counts of `SharedSlots`: one int per worker, under a plain (non-recursive) lock."""
    return ctx.Array(ctypes.c_int, workers, lock=ctx.Lock())


def free_lock_of_the_dead(held: Any) -> None:
    """After a worker died: if the counts' lock stays taken, the dead worker held it (every holder keeps it for
    a sum over a few ints), so release it for the dead."""
    lock = held.get_lock()
    if lock.acquire(timeout=LOCK_SECONDS):
        lock.release()
        return
    log.warning("a dead worker held the admission lock; releasing it")
    lock.release()


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for `host:port`, resolved as waitress resolves them (a name may give IPv4 and IPv6)."""
    from waitress.adjustments import Adjustments

    sockets: list[socket.socket] = []
    try:
        for family, socktype, proto, sockaddr in Adjustments(host=host, port=port).listen:
            sock = socket.socket(family, socktype, proto)  # pragma: no mutate: proto 0 is TCP for a stream too
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, True)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, True)
            sock.bind(sockaddr)
            sock.listen(1024)  # pragma: no mutate: the accept backlog's size is not observable from a test
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def worker_limits(config: Config, workers: int):
    """Each worker's share of `http_connection_limit`, so that all of them together keep it: a worker at its
    share stops accepting and the others take the new connections. The per-client limit is each worker's own
    (it counts the connections a worker holds; halving it would refuse a client one worker took most of)."""
    limits = config.http_limits()
    share = max(1, -(-limits.connection_limit // workers))
    return replace(limits, connection_limit=share, connections_per_client=min(limits.per_client, share))


@dataclass
class WorkerSpec:
    """What a spawned worker is given (pickled to it): where its config is and what it shares."""

    config: Config  # loaded once by the supervisor: every worker, restarted ones too, runs the same settings
    index: int
    workers: int
    host: str
    port: int
    sockets: list[socket.socket]
    held: Any  # multiprocessing Array of ints: requests admitted, per worker
    warmed: Any  # multiprocessing Event: worker 0 has warmed
    metrics_dir: str
    first: bool = False  # the first start of worker 0: it serves while it warms (no other worker serves yet)


def _exit_with_parent() -> None:
    """A worker whose supervisor is gone (killed, even with SIGKILL) exits instead of serving on alone."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def worker_threads(config: Config) -> int:
    """A worker's waitress threads: `http_threads`, else one per admitted request and 16 more (health, files),
    as for a single server."""
    return config.http_threads or config.max_concurrent_requests + 16


def worker_app(spec: WorkerSpec) -> Flask:
    """The worker's app: the same as a single server's, admitting from the slots all workers share. Worker 0
    alone refreshes the shared catalog store, and says once warm (the others start then)."""
    from .chat import HuggingGPT
    from .checks import print_start_checks
    from .server import create_app

    config = spec.config
    engine = HuggingGPT(config)
    engine.refreshes_catalog = spec.index == 0
    engine.metrics.shared_dir = Path(spec.metrics_dir)

    def warm() -> None:
        try:
            engine.warm()
        finally:
            if spec.index == 0:
                spec.warmed.set()

    if spec.first:  # the server's first process answers while it warms, as a single server does
        threading.Thread(target=warm, name="warm-ranker", daemon=True).start()
    else:  # others (and restarts) join warm: a request never gets a cold worker's fallback ranking
        warm()
    if spec.first:  # once per server, not again when worker 0 is restarted
        threading.Thread(target=print_start_checks, args=(engine,), name="start-checks", daemon=True).start()
    return create_app(config, engine, admission=SharedSlots(spec.held, spec.index, config.max_concurrent_requests))


def worker_main(spec: WorkerSpec) -> None:
    """A worker process: the same app as a single server, on the supervisor's sockets."""
    _exit_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the supervisor stops us
    from .logs import setup_logging
    from .server import serve

    config = spec.config
    setup_logging(config.debug, config.log_file, tag=f"w{spec.index}")
    app = worker_app(spec)
    sys.exit(serve(app,
                   spec.host, spec.port,  # pragma: no mutate: with sockets given, they only name them
                   threads=worker_threads(config), limits=worker_limits(config, spec.workers), sockets=spec.sockets))


class Supervisor:
    """Binds the port, runs `config.http_workers` workers on it, restarts those that die, stops them all on
    SIGTERM or Ctrl-C. `run` returns the exit status."""

    def __init__(self, config: Config, host: str, port: int, worker: Callable[[WorkerSpec], None] = worker_main):
        """worker: what each worker process runs (tests give a stand-in)."""
        self.config, self.host, self.port, self.worker = config, host, port, worker
        self.count = config.http_workers
        self._stop = threading.Event()

    def run(self) -> int:
        from .server import address_problem

        try:
            sockets = bind_listeners(self.host, self.port)
        except OSError as exc:
            print(address_problem(self.host, self.port, exc), file=sys.stderr)
            return 2
        print(f"HuggingGPT server on http://{self.host}:{self.port} (LLM: {self.config.llm.summary()}; "
              f"{self.count} worker processes)", file=sys.stderr)  # stderr is line-buffered: no flush needed
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        ctx = multiprocessing.get_context("spawn")
        started: dict[int, float] = {}
        procs: list[Any] = []
        metrics_dir: str | None = None  # pragma: no mutate: None or "", there is no folder to remove yet
        try:
            metrics_dir = tempfile.mkdtemp(prefix="hugginggpt-metrics-")
            os.environ[METRICS_ENV] = metrics_dir  # before any worker imports prometheus_client
            held, warmed = shared_counts(ctx, self.count), ctx.Event()

            def start(index: int) -> Any:
                spec = WorkerSpec(self.config, index, self.count, self.host, self.port, sockets, held, warmed,
                                  str(metrics_dir), first=not started)
                proc = ctx.Process(target=self.worker, args=(spec,), name=f"hugginggpt-worker-{index}", daemon=True)
                # a worker ignores Ctrl-C (the supervisor stops it), from its first instruction: the terminal
                # sends SIGINT to the whole group, and a worker still importing would print a traceback
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    proc.start()
                finally:
                    signal.signal(signal.SIGINT, previous)
                started[index] = time.monotonic()
                return proc

            procs.append(start(0))
            deadline = time.monotonic() + WARM_WAIT_SECONDS
            while not self._stop.is_set() and not warmed.is_set() and time.monotonic() < deadline:  # pragma: no mutate: a tick
                if procs[0].exitcode is not None:
                    break  # its exit is handled (restarted) below, like any other
                warmed.wait(0.2)  # pragma: no mutate: how often the first worker is looked at while it warms
            if self._stop.is_set():
                return 0
            procs.extend(start(i) for i in range(1, self.count))
            return self._watch(procs, start, started, held, metrics_dir)  # pragma: no mutate: None reads METRICS_ENV: the same
        except OSError as exc:  # no shared memory for the counts (a container without /dev/shm), no temp folder
            print(f"error: starting the worker processes failed ({exc}); set http_workers: 1 to run one process",
                  file=sys.stderr)
            return 1
        finally:
            self._stop_all(procs)
            for sock in sockets:
                sock.close()
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)

    def _watch(self, procs: list[Any], start: Any, started: dict[int, float], held: Any, metrics_dir: str) -> int:
        from prometheus_client.multiprocess import mark_process_dead

        quick_deaths = [0] * len(procs)
        while not self._stop.is_set():
            wait([p.sentinel for p in procs], timeout=0.5)
            for index, proc in enumerate(procs):
                if proc.exitcode is None or self._stop.is_set():
                    continue
                lived = time.monotonic() - started[index]
                free_lock_of_the_dead(held)
                with held.get_lock():
                    held.get_obj()[index] = 0  # its requests died with it
                mark_process_dead(proc.pid, metrics_dir)
                quick_deaths[index] = quick_deaths[index] + 1 if lived < QUICK_DEATH_SECONDS else 0
                if quick_deaths[index] >= 3:
                    print(f"error: worker {index} exited (status {proc.exitcode}) three times within "
                          f"{QUICK_DEATH_SECONDS:g} s of starting; stopping the server (see the log above)",
                          file=sys.stderr)
                    return 1
                print(f"warning: worker {index} (pid {proc.pid}) exited with status {proc.exitcode} after "
                      f"{lived:.0f} s; starting it again", file=sys.stderr)
                self._stop.wait(RESTART_PAUSE_SECONDS if quick_deaths[index] else 0)
                if not self._stop.is_set():
                    procs[index] = start(index)
        return 0

    @staticmethod
    def _stop_all(procs: list[Any]) -> None:
        for proc in procs:
            if proc.exitcode is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join()
