"""Edge cases of hugginggpt/workers.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import socket
import threading
import warnings

import pytest

from hugginggpt import workers
from hugginggpt.config import load_config
from hugginggpt.workers import SharedSlots, bind_listeners, free_lock_of_the_dead, shared_counts, worker_limits
from tests.conftest import make_public, write_config

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


def test_an_ipv6_listener_takes_ipv6_only():
    [sock] = bind_listeners("::1", 0)
    try:
        assert sock.family == socket.AF_INET6
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
    finally:
        sock.close()


def test_a_taken_port_raises_and_leaves_no_socket_open():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
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

    def __call__(self, index):
        self.indexes.append(index)
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
