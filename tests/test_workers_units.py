"""Edge cases of hugginggpt/workers.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import logging
import multiprocessing
import os
import re
import select
import signal
import socket
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from hugginggpt import workers
from hugginggpt.config import load_config
from hugginggpt.workers import (
    SharedSlots,
    WorkerSpec,
    bind_listeners,
    free_lock_of_the_dead,
    shared_counts,
    worker_app,
    worker_limits,
    worker_threads,
)
from tests.conftest import make_public, write_config
from tests.fakes import worker_targets

SPAWN = multiprocessing.get_context("spawn")


def config_of(tmp_path, **extra):
    public = make_public(tmp_path / "public")
    return load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public, **extra), env={})


# -- admission counted across workers ---------------------------------------------------------------------------


def test_shared_counts_hold_one_zeroed_count_per_worker():
    held = shared_counts(SPAWN, 3)
    assert list(held) == [0, 0, 0]
    lock = held.get_lock()
    assert lock.acquire(timeout=1)
    try:  # a plain lock: the same holder cannot take it twice (so the supervisor can release it for the dead)
        assert not lock.acquire(timeout=0.01)
    finally:
        lock.release()


def test_slots_admit_up_to_the_limit_across_workers_and_count_each_workers_own():
    held = shared_counts(SPAWN, 3)
    first, third = SharedSlots(held, 0, 3), SharedSlots(held, 2, 3)
    assert first.acquire() and third.acquire() and third.acquire()
    assert list(held) == [1, 0, 2]
    assert not first.acquire() and list(held) == [1, 0, 2]  # at the limit: refused, nothing counted
    third.release()
    assert list(held) == [1, 0, 1]
    assert first.acquire() and list(held) == [2, 0, 1]


def test_a_release_with_nothing_held_never_goes_below_zero():
    held = shared_counts(SPAWN, 2)
    slots = SharedSlots(held, 1, 1)
    slots.release()
    assert list(held) == [0, 0]
    assert slots.acquire() and not slots.acquire()  # still exactly one slot, not two


def test_while_the_lock_is_lost_slots_are_refused_and_releases_leave_the_counts_alone(monkeypatch):
    monkeypatch.setattr(workers, "LOCK_SECONDS", 0.01)
    held = shared_counts(SPAWN, 2)
    slots = SharedSlots(held, 0, 5)
    assert slots.acquire()
    lock = held.get_lock()
    lock.acquire()  # a worker that died holding it
    try:
        assert not slots.acquire()
        slots.release()
    finally:
        lock.release()
    assert list(held) == [1, 0]
    assert slots.acquire() and list(held) == [2, 0]  # the lock is not left taken by the refusals


def test_the_lock_of_a_dead_worker_is_released_and_said_so(monkeypatch, caplog):
    monkeypatch.setattr(workers, "LOCK_SECONDS", 0.01)
    caplog.set_level(logging.WARNING, logger="hugginggpt.workers")
    held = shared_counts(SPAWN, 2)
    held.get_lock().acquire()  # its holder died
    free_lock_of_the_dead(held)
    slots = SharedSlots(held, 0, 1)
    assert slots.acquire()
    assert [r.getMessage() for r in caplog.records] == ["a dead worker held the admission lock; releasing it"]


def test_a_free_lock_is_left_free_and_nothing_is_said(monkeypatch, caplog):
    monkeypatch.setattr(workers, "LOCK_SECONDS", 0.01)
    caplog.set_level(logging.WARNING, logger="hugginggpt.workers")
    held = shared_counts(SPAWN, 2)
    free_lock_of_the_dead(held)
    assert SharedSlots(held, 1, 1).acquire() and list(held) == [0, 1]
    assert caplog.records == []


# -- the listening sockets ----------------------------------------------------------------------------------------


def test_the_listener_accepts_connections_and_can_be_rebound_at_once():
    [sock] = bind_listeners("127.0.0.1", 0)
    try:
        assert sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1  # a restart need not wait TIME_WAIT
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            conn, _ = sock.accept()
            conn.close()
    finally:
        sock.close()


def test_an_ipv6_listener_takes_ipv6_only_and_leaves_the_ports_ipv4_side_to_its_own_listener():
    [sock] = bind_listeners("::", 0)  # a host that resolves to both families gets a listener for each
    try:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
        with socket.socket() as ipv4:
            ipv4.bind(("0.0.0.0", sock.getsockname()[1]))
    finally:
        sock.close()


def test_a_taken_port_raises_and_leaves_no_socket_open():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gc.collect()  # what earlier tests in this process left for the collector is not this call's
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            with pytest.raises(OSError):
                bind_listeners("127.0.0.1", port)
            gc.collect()
        assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []


# -- each worker's share of the connection limits -----------------------------------------------------------------


def test_the_connection_limit_is_shared_out_rounding_up_and_the_per_client_limit_stays_each_workers_own(tmp_path):
    config = config_of(tmp_path, http_connection_limit=1000)
    limits = worker_limits(config, 3)
    assert limits.connection_limit == 334  # 3 x 334 >= 1000
    assert limits.connections_per_client == 250  # a quarter of the whole limit, as for one process
    assert limits.header_timeout == config.http_limits().header_timeout
    assert limits.read_timeout == config.http_limits().read_timeout


def test_a_per_client_limit_above_a_workers_share_is_cut_to_the_share(tmp_path):
    config = config_of(tmp_path, http_connection_limit=10, http_connections_per_client=8)
    limits = worker_limits(config, 4)
    assert limits.connection_limit == 3 and limits.connections_per_client == 3


def test_one_worker_keeps_the_whole_limit_and_a_tiny_limit_still_lets_each_worker_take_one(tmp_path):
    config = config_of(tmp_path, http_connection_limit=5, http_connections_per_client=2)
    limits = worker_limits(config, 1)
    assert limits.connection_limit == 5 and limits.connections_per_client == 2
    config = config_of(tmp_path, http_connection_limit=1)
    limits = worker_limits(config, 4)
    assert limits.connection_limit == 1 and limits.connections_per_client == 1


# -- a worker that is not anyone's child ----------------------------------------------------------------------------


def test_outside_a_supervisor_nothing_watches_for_the_parent():
    before = {t.name for t in threading.enumerate()}
    workers._exit_with_parent()
    assert "supervisor-watch" not in {t.name for t in threading.enumerate()} - before


# -- the supervisor watching its workers (process stand-ins: `_watch` only reads exitcode, pid and sentinel) ---------


class Proc:
    """A worker process as the supervisor sees it; a dead one's sentinel is ready, so `wait` returns at once."""

    def __init__(self, pid: int, exitcode: int | None = None, obeys_terminate: bool = True):
        self.pid, self.exitcode, self.obeys_terminate = pid, exitcode, obeys_terminate
        self.calls: list[str] = []
        self.timeouts: list[float | None] = []
        self._read, self._write = socket.socketpair()
        if exitcode is not None:
            self._write.send(b"x")

    def __del__(self):
        self._read.close()
        self._write.close()

    @property
    def sentinel(self):
        return self._read.fileno()

    def terminate(self):
        self.calls.append("terminate")
        self.terminated = True

    def kill(self):
        self.calls.append("kill")
        self.exitcode = -9

    def join(self, timeout=None):
        """An obedient worker finishes its shutdown within the time it is given; a stubborn one never does."""
        self.calls.append("join")
        self.timeouts.append(timeout)
        if self.exitcode is None:
            if timeout is None:
                raise AssertionError("joined a running worker without a timeout: the supervisor would hang")
            if getattr(self, "terminated", False) and self.obeys_terminate and timeout > 0:
                self.exitcode = -15


class Restarts:
    """The supervisor's `start`: records each restart, gives the new worker an age and a fate, and may ask the
    supervisor to stop (as SIGTERM would) once it has restarted `stop_after` workers."""

    def __init__(self, supervisor, started, fates, stop_after):
        self.supervisor, self.started, self.fates, self.stop_after = supervisor, started, list(fates), stop_after
        self.indexes: list[int] = []
        self.times: list[float] = []

    def __call__(self, index):
        self.indexes.append(index)
        self.times.append(time.monotonic())
        age, exitcode = self.fates.pop(0) if self.fates else (0.0, None)
        self.started[index] = workers.time.monotonic() - age
        if len(self.indexes) >= self.stop_after:
            self.supervisor._stop.set()
        return Proc(5000 + len(self.indexes), exitcode)


@pytest.fixture
def watching(tmp_path, monkeypatch):
    monkeypatch.setattr(workers, "RESTART_PAUSE_SECONDS", 0.01)
    monkeypatch.setattr(workers, "LOCK_SECONDS", 0.01)

    def make(count: int):
        supervisor = workers.Supervisor(config_of(tmp_path, http_workers=count), "127.0.0.1", 0)
        return supervisor, shared_counts(SPAWN, count), str(tmp_path)

    return make


def test_a_worker_that_died_is_started_again_with_its_slots_and_live_metrics_given_back(watching, capsys, tmp_path):
    supervisor, held, metrics_dir = watching(2)
    held[0], held[1] = 3, 2  # the dead worker's requests died with it; the other's stay counted
    (tmp_path / "gauge_livesum_4001.db").write_bytes(b"")
    (tmp_path / "gauge_livesum_4002.db").write_bytes(b"")
    held.get_lock().acquire()  # it died holding the admission lock
    procs = [Proc(4001, exitcode=1), Proc(4002)]
    started = {0: workers.time.monotonic() - 100, 1: workers.time.monotonic() - 100}
    restart = Restarts(supervisor, started, [], stop_after=1)
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 0
    assert restart.indexes == [0] and procs[0].pid == 5001 and procs[1].pid == 4002
    assert list(held) == [0, 2]
    assert not (tmp_path / "gauge_livesum_4001.db").exists() and (tmp_path / "gauge_livesum_4002.db").exists()
    assert capsys.readouterr().err == "warning: worker 0 (pid 4001) exited with status 1 after 100 s; starting it again\n"


def test_a_worker_dying_three_times_just_after_starting_stops_the_server(watching, capsys):
    supervisor, held, metrics_dir = watching(2)
    procs = [Proc(4001), Proc(4002, exitcode=3)]
    started = {0: workers.time.monotonic() - 100, 1: workers.time.monotonic()}
    restart = Restarts(supervisor, started, [(0.0, 3), (0.0, 3)], stop_after=99)
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 1
    assert restart.indexes == [1, 1]  # started again twice; the third quick death ends it
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "warning: worker 1 (pid 4002) exited with status 3 after 0 s; starting it again"
    assert err[-1] == ("error: worker 1 exited (status 3) three times within 10 s of starting; stopping the server "
                       "(see the log above)")
    assert len(err) == 3


def test_a_worker_that_lived_long_between_quick_deaths_is_not_counted_as_failing_to_start(watching, capsys):
    supervisor, held, metrics_dir = watching(1)
    procs = [Proc(4001, exitcode=1)]
    started = {0: workers.time.monotonic()}
    fates = [(0.0, 1), (100.0, 1), (0.0, 1), (0.0, 1)]  # quick, quick, a long life, quick, quick
    restart = Restarts(supervisor, started, fates, stop_after=5)
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 0
    assert restart.indexes == [0, 0, 0, 0, 0]
    assert "error" not in capsys.readouterr().err


def test_once_stopping_a_worker_that_dies_is_not_started_again(watching, capsys):
    supervisor, held, metrics_dir = watching(2)
    procs = [Proc(4001, exitcode=1), Proc(4002, exitcode=1)]
    started = {0: workers.time.monotonic() - 100, 1: workers.time.monotonic() - 100}
    restart = Restarts(supervisor, started, [], stop_after=1)  # the stop comes while worker 0 restarts
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 0
    assert restart.indexes == [0] and procs[1].pid == 4002
    assert "worker 1" not in capsys.readouterr().err


def test_stopping_terminates_the_running_workers_and_kills_those_that_do_not_stop():
    obedient, stubborn, gone = Proc(1), Proc(2, obeys_terminate=False), Proc(3, exitcode=0)
    workers.Supervisor._stop_all([obedient, stubborn, gone])
    assert obedient.calls == ["terminate", "join"]
    assert stubborn.calls == ["terminate", "join", "kill", "join"]
    assert gone.calls == ["join"]
    waits = [t for p in (obedient, stubborn, gone) for t in p.timeouts if t is not None]
    assert all(0 < t <= workers.STOP_SECONDS for t in waits)  # no worker is waited for past the grace period


def test_a_worker_that_lived_exactly_the_quick_death_time_has_not_failed_to_start(watching, monkeypatch, capsys):
    monkeypatch.setattr(workers, "time", SimpleNamespace(monotonic=lambda: 1000.0))  # a clock that stands still
    supervisor, held, metrics_dir = watching(1)
    procs = [Proc(4001, exitcode=1)]
    started = {0: 1000.0 - workers.QUICK_DEATH_SECONDS}
    fates = [(workers.QUICK_DEATH_SECONDS, 1)] * 3
    restart = Restarts(supervisor, started, fates, stop_after=4)
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 0
    assert restart.indexes == [0, 0, 0, 0]
    assert "error" not in capsys.readouterr().err


def test_a_worker_that_died_young_is_started_again_after_a_pause_and_one_that_lived_long_at_once(watching, monkeypatch):
    supervisor, held, metrics_dir = watching(1)
    monkeypatch.setattr(workers, "RESTART_PAUSE_SECONDS", 1.0)
    procs = [Proc(4001, exitcode=1)]
    started = {0: workers.time.monotonic()}  # it died young
    restart = Restarts(supervisor, started, [(100.0, 1)], stop_after=2)  # its successor lived long
    begun = time.monotonic()
    assert supervisor._watch(procs, restart, started, held, metrics_dir) == 0
    first, second = restart.times
    assert first - begun >= 1.0  # a worker failing at start is not restarted in a tight loop
    assert second - first < 0.5  # one that served a while is replaced at once


def test_a_stop_is_seen_within_half_a_second_while_every_worker_runs(watching):
    supervisor, held, metrics_dir = watching(2)
    procs = [Proc(4001), Proc(4002)]
    started = {0: workers.time.monotonic() - 100, 1: workers.time.monotonic() - 100}

    def stop_then_unblock():
        time.sleep(0.05)
        supervisor._stop.set()
        time.sleep(3)  # a broken build that waits for a worker to die without a timeout returns now, late
        with contextlib.suppress(OSError):
            procs[0]._write.send(b"x")

    threading.Thread(target=stop_then_unblock, daemon=True).start()
    begun = time.monotonic()
    assert supervisor._watch(procs, Restarts(supervisor, started, [], stop_after=99), started, held, metrics_dir) == 0
    assert time.monotonic() - begun < 1.3  # half a second between looks, and the machine's load


def test_once_the_grace_period_is_spent_the_workers_left_are_killed_without_waiting(monkeypatch):
    monkeypatch.setattr(workers, "STOP_SECONDS", 0.0)
    first, second = Proc(1, obeys_terminate=False), Proc(2, obeys_terminate=False)
    workers.Supervisor._stop_all([first, second])
    assert first.calls == second.calls == ["terminate", "join", "kill", "join"]
    assert first.timeouts == second.timeouts == [0.0, None]


# -- a worker's threads -------------------------------------------------------------------------------------------


def test_a_worker_has_http_threads_threads_or_one_per_admitted_request_and_16_more(tmp_path):
    assert worker_threads(config_of(tmp_path, max_concurrent_requests=5)) == 21
    assert worker_threads(config_of(tmp_path, max_concurrent_requests=5, http_threads=3)) == 3


# -- a worker's app (in this process: `worker_app` is `worker_main` without the signals, logging and serving) ------


@pytest.fixture
def worker_spec(tmp_path):
    """A worker's spec as the supervisor makes it, for worker `index` of two; 2 requests at once in all."""
    (tmp_path / "metrics").mkdir()

    def make(index: int, first: bool, **extra) -> WorkerSpec:
        config = config_of(tmp_path, semantic_ranking=False, max_concurrent_requests=2, **extra)
        return WorkerSpec(config, index, 2, "127.0.0.1", 0, [], shared_counts(SPAWN, 2), SPAWN.Event(),
                          str(tmp_path / "metrics"), first=first)

    return make


class Warming:
    """Stands in for the engine's warm-up (`HuggingGPT.warm`) and the start checks: records which thread ran
    them, and holds the warm-up until `done` is set."""

    def __init__(self, monkeypatch, holds: bool):
        from hugginggpt import checks
        from hugginggpt.chat import HuggingGPT

        self.done = threading.Event()
        if not holds:
            self.done.set()
        self.warmed: list[tuple[str, bool]] = []
        self.checked: list[tuple[str, bool, object]] = []
        monkeypatch.setattr(HuggingGPT, "warm", lambda engine: self.warm(engine))
        monkeypatch.setattr(checks, "print_start_checks", self.checks)

    def warm(self, engine) -> None:
        thread = threading.current_thread()
        self.warmed.append((thread.name, thread.daemon))
        assert self.done.wait(10)

    def checks(self, engine) -> None:
        thread = threading.current_thread()
        self.checked.append((thread.name, thread.daemon, engine))


def test_worker_0_answers_while_it_warms_says_once_warm_and_runs_the_start_checks(worker_spec, monkeypatch):
    warming = Warming(monkeypatch, holds=True)
    spec = worker_spec(0, first=True)
    app = worker_app(spec)
    engine = app.extensions["hugginggpt"]
    assert app.test_client().get("/health").status_code == 200  # while it warms
    assert not spec.warmed.is_set()
    warming.done.set()
    assert spec.warmed.wait(5)
    assert warming.warmed == [("warm-ranker", True)]  # in the background; a stop does not wait for it
    deadline = time.monotonic() + 5
    while not warming.checked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert warming.checked == [("start-checks", True, engine)]
    assert engine.refreshes_catalog  # worker 0 keeps the shared catalog store synced


def test_another_worker_warms_before_it_answers_and_neither_says_so_nor_runs_the_checks(worker_spec, monkeypatch):
    warming = Warming(monkeypatch, holds=False)
    spec = worker_spec(1, first=False)
    app = worker_app(spec)
    assert warming.warmed == [("MainThread", False)]  # done before the app exists
    assert not spec.warmed.is_set()  # only worker 0 says so
    time.sleep(0.1)
    assert warming.checked == []
    assert not app.extensions["hugginggpt"].refreshes_catalog


def test_worker_0_restarted_warms_before_it_answers_then_says_so_without_the_checks_again(worker_spec, monkeypatch):
    warming = Warming(monkeypatch, holds=False)
    spec = worker_spec(0, first=False)
    app = worker_app(spec)
    assert warming.warmed == [("MainThread", False)] and spec.warmed.is_set()
    time.sleep(0.1)
    assert warming.checked == []
    assert app.extensions["hugginggpt"].refreshes_catalog


def test_a_worker_admits_from_the_slots_every_worker_shares(worker_spec, monkeypatch):
    Warming(monkeypatch, holds=False)
    spec = worker_spec(1, first=False)
    client = worker_app(spec).test_client()
    spec.held[0] = 2  # worker 0 runs two requests: the server's limit
    refused = client.post("/hugginggpt", data="{", content_type="application/json")
    assert refused.status_code == 429 and "max_concurrent_requests" in refused.get_json()["error"]["message"]
    spec.held[0] = 1
    admitted = client.post("/hugginggpt", data="{", content_type="application/json")
    assert admitted.status_code == 400, admitted.get_json()  # admitted, then refused for its body
    assert list(spec.held) == [1, 0]  # its slot given back


def test_a_workers_metrics_are_every_workers_from_the_shared_folder(worker_spec, monkeypatch):
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    Warming(monkeypatch, holds=False)
    spec = worker_spec(1, first=False)
    other = MmapedDict(str(Path(spec.metrics_dir) / "counter_4001.db"))  # what worker 0 (pid 4001) counted
    other.write_value(mmap_key("hugginggpt_http_requests", "hugginggpt_http_requests_total", ["route", "status"],
                               ["/hugginggpt", "200"], "HTTP requests answered"), 7.0, 0.0)
    other.close()
    text = worker_app(spec).test_client().get("/metrics").get_data(as_text=True)
    assert 'hugginggpt_http_requests_total{route="/hugginggpt",status="200"} 7.0' in text


# -- a worker process ---------------------------------------------------------------------------------------------


def answer(conn: http.client.HTTPConnection, worker, seconds: float = 60) -> http.client.HTTPResponse:
    """The response to the request sent on `conn`; a failure as soon as the worker process is gone."""
    deadline = time.monotonic() + seconds
    while not select.select([conn.sock], [], [], 0.05)[0]:
        assert worker.is_alive(), f"the worker exited with status {worker.exitcode}"
        assert time.monotonic() < deadline, "no answer"
    return conn.getresponse()


def test_a_worker_process_serves_on_the_supervisors_socket_within_its_share_and_stops_on_sigterm(tmp_path, monkeypatch):
    log_file = tmp_path / "server.log"
    config = config_of(tmp_path, semantic_ranking=False, debug=True, log_file=str(log_file), http_workers=2,
                       http_connection_limit=40, http_connections_per_client=1, http_header_timeout=1)
    [listener] = bind_listeners("127.0.0.1", 0)
    port = listener.getsockname()[1]
    (tmp_path / "metrics").mkdir()
    monkeypatch.setenv(workers.METRICS_ENV, str(tmp_path / "metrics"))
    spec = WorkerSpec(config, 1, 2, "127.0.0.1", port, [listener], shared_counts(SPAWN, 2), SPAWN.Event(),
                      str(tmp_path / "metrics"))
    proc = SPAWN.Process(target=workers.worker_main, args=(spec,), daemon=True)
    proc.start()
    try:
        first = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        first.request("GET", "/health")
        health = answer(first, proc)  # it serves on the socket it was given
        assert health.status == 200 and json.loads(health.read())["model_ranking"] == "keyword"
        # another client (127.0.0.2 is this machine too) that sends half a request line, then nothing
        slow = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        second = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        second.request("GET", "/health")  # a second connection from the first client, past its share of one
        assert answer(second, proc).status == 429
        second.close()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        threads = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))
        assert threads >= worker_threads(config)
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C is the supervisor's to handle
        first.request("GET", "/health")
        assert answer(first, proc).status == 200
        first.close()
        assert slow.recv(100) == b""  # closed by the worker after http_header_timeout
        slow.close()
        os.kill(proc.pid, signal.SIGTERM)
        proc.join(10)
        assert proc.exitcode == 0
    finally:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
        listener.close()
    lines = log_file.read_text().splitlines()  # the log file, each line tagged with the worker
    assert any(" DEBUG w1 hugginggpt.server " in line and "closing the connection from" in line for line in lines)
    assert any(" WARNING w1 hugginggpt.server " in line and "turned away" in line for line in lines), lines


# -- a worker's watch on its supervisor -----------------------------------------------------------------------------


def test_a_workers_watch_on_its_supervisor_never_keeps_it_from_exiting(tmp_path):
    proc = SPAWN.Process(target=partial(worker_targets.watches_then_returns, str(tmp_path)), daemon=True)
    proc.start()
    proc.join(10)
    try:
        assert proc.exitcode == 0
    finally:
        if proc.exitcode is None:
            proc.kill()
    assert ["supervisor-watch", True] in json.loads((tmp_path / "threads.json").read_text())


def test_a_worker_exits_when_its_supervisor_is_killed(tmp_path):
    proc = SPAWN.Process(target=partial(worker_targets.reaper, str(tmp_path)))  # not a daemon: it has children
    proc.start()
    proc.join(20)
    assert json.loads((tmp_path / "reaped.json").read_text()) == {"status": 0}
    assert ["supervisor-watch", True] in json.loads((tmp_path / "orphan.json").read_text())["threads"]


# -- the supervisor (run here, in the main thread where signals land, with worker stand-ins that import nothing) ---


class Stopper(threading.Thread):
    """Sends `signum` to this process (to the supervisor's handler) once `ready()` holds. Should the supervisor not
    have returned `seconds` after the start, it stops it through its flag: a broken build fails, not hangs."""

    def __init__(self, supervisor, ready, signum: int, seconds: float):
        super().__init__(daemon=True)
        self.supervisor, self.ready, self.signum, self.seconds = supervisor, ready, signum, seconds
        self.lock = threading.Lock()
        self.running = True
        self.signalled: float | None = None
        self.forced = False

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        while True:
            with self.lock:  # never after `run` returned: the test run's own handlers are back by then
                if not self.running:
                    return
                if self.signalled is None and self.ready is not None and self.ready():
                    os.kill(os.getpid(), self.signum)
                    self.signalled = time.monotonic()
            if time.monotonic() > deadline:
                self.forced = True
                self.supervisor._stop.set()
                return
            time.sleep(0.02)


@dataclass
class Supervised:
    status: int | None
    err: str
    reports: list[dict]
    port: int
    stopper: Stopper
    ended: float


@pytest.fixture
def supervise(tmp_path, monkeypatch, capsys):
    """Runs a Supervisor of `count` workers running `worker` (from tests/fakes/worker_targets.py, given the folder
    they report to) on a free port; `stop_when(reports)`: when to send it `signum`."""
    from tests.conftest import free_port

    monkeypatch.setattr(workers, "RESTART_PAUSE_SECONDS", 0.01)
    monkeypatch.setattr(workers, "STOP_SECONDS", 1.0)
    monkeypatch.setattr(workers, "WARM_WAIT_SECONDS", 10.0)
    monkeypatch.setenv(workers.METRICS_ENV, "unset")  # `run` sets it for its workers: put back after
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the metrics folder is made
    folder = tmp_path / "reports"
    folder.mkdir()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in handlers:  # until `run` sets its own, a signal sent early must not stop the test run
        signal.signal(sig, lambda *_: None)

    def reports() -> list[dict]:
        found = [json.loads(p.read_text()) for p in folder.glob("*.json")]
        return sorted(found, key=lambda r: r["at"])

    def supervise(worker, count: int = 2, stop_when=None, signum=signal.SIGTERM, seconds: float = 20) -> Supervised:
        port = free_port()
        supervisor = workers.Supervisor(config_of(tmp_path, http_workers=count), "127.0.0.1", port,
                                        worker=partial(worker, str(folder)))
        stopper = Stopper(supervisor, stop_when and (lambda: stop_when(reports())), signum, seconds)
        stopper.start()
        try:
            status = supervisor.run()
        finally:
            with stopper.lock:
                stopper.running = False
            ended = time.monotonic()
            stopper.join()
        return Supervised(status, capsys.readouterr().err, reports(), port, stopper, ended)

    yield supervise
    for sig, handler in handlers.items():
        signal.signal(sig, handler)
    for child in multiprocessing.active_children():  # left by a broken build only
        child.kill()


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_the_supervisor_starts_worker_0_then_once_it_has_warmed_the_others_and_stops_them_all(supervise, tmp_path):
    run = supervise(worker_targets.stubborn, stop_when=lambda reports: len(reports) == 2)
    assert run.status == 0 and not run.stopper.forced
    config = config_of(tmp_path, http_workers=2)
    assert run.err == (f"HuggingGPT server on http://127.0.0.1:{run.port} (LLM: {config.llm.summary()}; "
                       "2 worker processes)\n")
    w0, w1 = run.reports
    assert (w0["index"], w0["first"], w0["warmed"]) == (0, True, False)
    assert (w1["index"], w1["first"], w1["warmed"]) == (1, False, True)  # started once worker 0 had warmed
    assert w1["at"] - w0["at"] < 5  # and then at once, not when the time allowed for warming (10 s here) was up
    metrics_dir = w0["metrics_dir"]
    for w in (w0, w1):
        assert w["name"] == f"hugginggpt-worker-{w['index']}" and w["daemon"]
        assert (w["workers"], w["http_workers"], w["host"], w["port"]) == (2, 2, "127.0.0.1", run.port)
        assert w["sockets"] == [["127.0.0.1", run.port]]  # the supervisor's listener, inherited
        assert w["counts"] == [0, 0]
        assert w["metrics_dir"] == w["metrics_env"] == metrics_dir and w["metrics_dir_exists"]
        assert w["ctrl_c_ignored"]  # from its first instruction: Ctrl-C reaches the whole process group
        assert not w["forked"]  # spawned: nothing of the supervisor's memory (threads, model sessions) copied
    assert Path(metrics_dir).parent == tmp_path / "tmp" and Path(metrics_dir).name.startswith("hugginggpt-metrics-")
    assert not Path(metrics_dir).exists()  # removed on the way out
    # workers that ignore SIGTERM were killed once the grace period (1 s here) was spent
    assert all(gone(w["pid"]) for w in (w0, w1))
    assert 1.0 <= run.ended - run.stopper.signalled < 10
    bind_listeners("127.0.0.1", run.port)[0].close()  # the port is free again


def test_ctrl_c_while_worker_0_warms_stops_the_server_before_any_other_worker_starts(supervise):
    run = supervise(worker_targets.never_warms, stop_when=lambda reports: len(reports) == 1, signum=signal.SIGINT)
    assert run.status == 0 and not run.stopper.forced
    assert [w["index"] for w in run.reports] == [0]
    assert run.ended - run.stopper.signalled < 5  # at the signal, not when the time allowed for warming was up
    assert gone(run.reports[0]["pid"])


def test_a_worker_0_exiting_before_it_warmed_does_not_hold_the_others_back_and_three_quick_exits_stop_the_server(
        supervise, monkeypatch):
    monkeypatch.setattr(workers, "RESTART_PAUSE_SECONDS", 0.3)
    run = supervise(partial(worker_targets.exits_at_once, 0))
    assert run.status == 1 and not run.stopper.forced
    zeros = [w for w in run.reports if w["index"] == 0]
    assert [w["first"] for w in zeros] == [True, False, False]  # the start checks are not run again
    assert [(w["index"], w["first"], w["warmed"]) for w in run.reports if w["index"] == 1] == [(1, False, False)]
    err = run.err.splitlines()
    assert len(err) == 4
    for line, w in zip(err[1:3], zeros[:2], strict=True):  # how long each lived depends on the machine's load
        assert re.fullmatch(rf"warning: worker 0 \(pid {w['pid']}\) exited with status 3 after \d s; starting it again",
                            line), line
    assert err[3] == ("error: worker 0 exited (status 3) three times within 10 s of starting; stopping the server "
                      "(see the log above)")


def test_a_metrics_folder_removed_while_the_server_ran_does_not_fail_its_stop(supervise):
    run = supervise(worker_targets.removes_metrics, stop_when=lambda reports: len(reports) == 2)
    assert run.status == 0 and not run.stopper.forced
    assert run.err.count("\n") == 1  # the start line, no traceback


def test_a_port_in_use_is_one_line_and_status_2(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        supervisor = workers.Supervisor(config_of(tmp_path, http_workers=2), "127.0.0.1", port)
        assert supervisor.run() == 2
    assert capsys.readouterr().err == (f"error: 127.0.0.1:{port} is already in use; choose another with --port (or "
                                       "http_listen.port in the config)\n")


def test_no_shared_memory_for_the_counts_is_one_line_and_status_1_and_leaves_nothing_behind(supervise, monkeypatch):
    def no_shm(ctx, count):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(workers, "shared_counts", no_shm)
    run = supervise(worker_targets.serve)
    assert run.status == 1 and not run.stopper.forced
    assert run.err.splitlines()[1:] == ["error: starting the worker processes failed ([Errno 2] No such file or "
                                        "directory); set http_workers: 1 to run one process"]
    assert list(Path(tempfile.tempdir).iterdir()) == []  # its metrics folder removed
    bind_listeners("127.0.0.1", run.port)[0].close()
