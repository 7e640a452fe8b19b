"""`http_workers`: several server processes on one port, started, shared and stopped as one server."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from hugginggpt.uploads import UploadStore
from hugginggpt.workers import LOCK_SECONDS, SharedSlots, free_lock_of_the_dead, shared_counts
from tests.conftest import start_server, stop_server, write_config

PLAN = json.dumps([{"task": "token-classification", "id": 0, "dep": [-1], "args": {"text": "Anna lives in Berlin"}}])
ASK = {"messages": [{"role": "user", "content": "find the names: Anna lives in Berlin"}]}


def workers_of(pid: int) -> list[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            except FileNotFoundError:
                continue
            if b"spawn_main" in cmdline:
                found.append(int(child))
    return sorted(found)


def state_of(pid: int) -> str:
    """The process's state letter (R, S, T stopped, Z zombie...), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def alive(pid: int) -> bool:
    return state_of(pid) not in ("", "Z")


def wait_for(check, seconds: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:g} s: {what}")


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.fixture
def two_workers(tmp_path, llm, models, models_server, public_dir):
    def start(**extra):
        config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                              http_workers=2, **extra)
        srv = start_server(config, tmp_path)
        started.append(srv)
        wait_for(lambda: len(workers_of(srv.proc.pid)) == 2, what="two workers running")
        seen.update(workers_of(srv.proc.pid))
        return srv

    started: list = []
    seen: set[int] = set()
    yield start
    for srv in started:
        seen.update(workers_of(srv.proc.pid) if srv.proc.poll() is None else [])
        stop_server(srv)
    for pid in seen:  # none should be left; if one is (a broken build), it must not outlive the test
        try:
            ours = b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if ours and alive(pid):
            os.kill(pid, signal.SIGKILL)


@contextmanager
def only(srv, pid: int):
    """Only worker `pid` accepts connections meanwhile: the others are stopped (SIGSTOP), so which worker
    answers is not left to the kernel (at light load one worker tends to take every connection)."""
    others = [p for p in workers_of(srv.proc.pid) if p != pid]
    for other in others:
        os.kill(other, signal.SIGSTOP)
    for other in others:  # stopped for sure (kill returns before the stop), so it cannot accept meanwhile
        wait_for(lambda other=other: state_of(other) == "T", seconds=10, what=f"worker {other} stopped")
    try:
        yield
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def fresh_post(srv, body: dict, timeout: float = 60) -> requests.Response:
    return requests.post(srv.url + "/hugginggpt", json=body, headers={"Connection": "close"}, timeout=timeout)


def test_two_workers_answer_on_one_port_and_metrics_count_them_all(two_workers, llm):
    llm.on("parse_task", PLAN)
    llm.on("response_results", "Anna is a person; Berlin is a place.")
    srv = two_workers()
    first, second = workers_of(srv.proc.pid)
    with only(srv, first):
        assert [fresh_post(srv, ASK).status_code for _ in range(3)] == [200] * 3
    with only(srv, second):
        assert [fresh_post(srv, ASK).status_code for _ in range(2)] == [200] * 2
    for pid in (first, second):  # whichever worker answers /metrics counts every worker's requests
        with only(srv, pid):
            text = requests.get(srv.url + "/metrics", headers={"Connection": "close"}, timeout=10).text
        assert metric(text, 'hugginggpt_http_requests_total{route="/hugginggpt",status="200"}') == 5
        assert metric(text, "hugginggpt_requests_in_flight") == 0

    def ask(_: int) -> int:
        with requests.Session() as http:
            return http.post(srv.url + "/hugginggpt", json=ASK, timeout=60).status_code

    with ThreadPoolExecutor(12) as pool:  # and at once, as the kernel hands the connections out
        assert list(pool.map(ask, range(12))) == [200] * 12
    assert "2 worker processes" in srv.logs()
    lines = srv.logs().splitlines()  # several processes append to one log: each line says which
    assert any(" INFO w0 hugginggpt" in line for line in lines) and any(" INFO w1 hugginggpt" in line for line in lines)


def test_max_concurrent_requests_counts_the_requests_of_every_worker(two_workers, llm):
    llm.on("parse_task", PLAN, delay=8.0)  # long enough for both refusals on a loaded machine
    llm.on("response_results", "done")
    srv = two_workers(max_concurrent_requests=1)
    first = ThreadPoolExecutor(1).submit(srv.post, "/hugginggpt", ASK, timeout=60)
    wait_for(lambda: llm.stage_requests("parse_task"), what="the first request reached the LLM")
    for pid in workers_of(srv.proc.pid):  # the worker holding the slot, and the other: both refuse
        with only(srv, pid):
            refused = fresh_post(srv, ASK, timeout=30)
        assert refused.status_code == 429, refused.text
        assert "max_concurrent_requests" in refused.json()["error"]["message"]
    assert first.result().status_code == 200
    assert srv.post("/hugginggpt", ASK, timeout=60).status_code == 200  # its slot is free again


def test_a_killed_worker_is_started_again_and_its_slots_given_back(two_workers, llm):
    llm.on("parse_task", PLAN)
    llm.on("parse_task", PLAN, delay=30.0, times=1)  # the first request hangs in the LLM until its worker dies
    llm.on("response_results", "done")
    srv = two_workers(max_concurrent_requests=1)
    old = workers_of(srv.proc.pid)
    hung = ThreadPoolExecutor(1).submit(srv.post, "/hugginggpt", ASK, timeout=60)
    wait_for(lambda: llm.stage_requests("parse_task"), what="the first request reached the LLM")
    for pid in old:  # the worker holding the slot among them
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(requests.ConnectionError):
        hung.result()
    wait_for(lambda: len(workers_of(srv.proc.pid)) == 2 and not set(workers_of(srv.proc.pid)) & set(old),
             what="both workers started again")
    wait_for(lambda: srv.post("/hugginggpt", ASK, timeout=60).status_code != 503, seconds=30,
             what="the new workers answer")
    answers = [srv.post("/hugginggpt", ASK, timeout=60) for _ in range(3)]
    assert [a.status_code for a in answers] == [200] * 3, [a.text for a in answers]  # no slot left held
    assert "exited with status -9" in srv.logs() and "starting it again" in srv.logs()
    assert srv.logs().count("check: the LLM") == 1  # once per server, not per (re)started worker


def test_stopping_the_supervisor_stops_its_workers_even_when_it_is_killed(two_workers):
    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        srv = two_workers()
        pids = workers_of(srv.proc.pid)
        os.kill(srv.proc.pid, stop)
        if stop == signal.SIGINT:  # Ctrl-C in a terminal reaches every process of the group
            for pid in pids:
                os.kill(pid, signal.SIGINT)
        srv.proc.wait(15)
        wait_for(lambda: not any(alive(p) for p in pids), seconds=15, what=f"workers gone after {stop.name}")
        if stop != signal.SIGKILL:
            assert srv.proc.returncode == 0 and "Traceback" not in srv.logs()


def test_a_taken_port_is_one_line_with_workers_too(tmp_path, llm, models_server, public_dir, capsys):
    import socket

    from hugginggpt.config import load_config
    from hugginggpt.workers import Supervisor

    config = load_config(write_config(tmp_path, llm.base_url, models_server[1], public_dir, http_workers=2), env={})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert Supervisor(config, "127.0.0.1", port).run() == 2  # the supervisor's own bind, no worker started
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is already in use; choose another with --port" in err and "Traceback" not in err


def test_http_workers_must_be_a_small_positive_number(tmp_path, llm, models_server, public_dir):
    from hugginggpt.config import load_config
    from hugginggpt.errors import ConfigError

    for bad, why in ((0, "positive"), (-1, "positive"), ("two", "http_workers"), (1000, "at most")):
        config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, http_workers=bad)
        with pytest.raises(ConfigError, match=why):
            load_config(config, env={})
    assert load_config(write_config(tmp_path, llm.base_url, models_server[1], public_dir), env={}).http_workers == 1


def test_shared_slots_count_every_workers_requests_and_give_back_only_their_own():
    held = shared_counts(multiprocessing.get_context("spawn"), 2)
    first, second = SharedSlots(held, 0, 2), SharedSlots(held, 1, 2)
    assert first.acquire() and second.acquire()
    assert not first.acquire() and not second.acquire()  # two in all, whichever worker asks
    second.release()
    assert first.acquire() and list(held) == [2, 0]
    second.release()  # nothing of its own to give back: the other worker's slots stay held
    assert not second.acquire()


def _die_holding(lock) -> None:
    lock.acquire()
    time.sleep(60)


def test_a_worker_that_dies_holding_the_admission_lock_does_not_stop_admission():
    ctx = multiprocessing.get_context("spawn")
    held = shared_counts(ctx, 2)
    holder = ctx.Process(target=_die_holding, args=(held.get_lock(),), daemon=True)
    holder.start()
    lock = held.get_lock()

    def taken() -> bool:
        if lock.acquire(block=False):
            lock.release()
            return False
        return True

    wait_for(taken, what="the other process holds the lock")
    holder.kill()  # the OOM killer, in the middle of an admission
    holder.join()
    slots = SharedSlots(held, 0, 1)
    started = time.monotonic()
    assert not slots.acquire()  # refused (not hung) while the lock is lost
    assert time.monotonic() - started < LOCK_SECONDS + 2
    free_lock_of_the_dead(held)  # what the supervisor does when it sees a worker die
    assert slots.acquire() and not slots.acquire()


def test_the_upload_quota_is_checked_under_a_lock_every_worker_takes(tmp_path):
    public = tmp_path / "public"
    one, other = UploadStore(public, 10_000, 1_000_000), UploadStore(public, 10_000, 1_000_000)
    inside = threading.Event()

    def second_worker() -> None:
        with other._exclusive():
            inside.set()

    with one._exclusive():  # what a worker holds while it checks the quota and writes
        threading.Thread(target=second_worker, daemon=True).start()
        assert not inside.wait(0.5), "a second store (another worker) got in while the first held the lock"
    assert inside.wait(5)


def test_concurrent_uploads_to_two_workers_stay_within_the_quota_together(tmp_path, llm, models_server):
    """Twelve uploads at once, over two worker processes, into a quota that holds three: three are kept, the
    others get 507, and public/uploads never holds more than the quota."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    from PIL import Image

    from tests.conftest import make_public

    noise = np.random.default_rng(7).integers(0, 255, (330, 330, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noise).save(buf, "PNG")
    data = buf.getvalue()
    mib = 1024 * 1024
    assert 0.3 * mib < len(data) < 0.34 * mib  # three fit in 1 MiB, four do not
    public = make_public(tmp_path / "public")
    srv = start_server(write_config(tmp_path, llm.base_url, models_server[1], public, semantic_ranking=False,
                                    http_workers=2, upload_quota_mb=1), tmp_path)
    try:
        wait_for(lambda: len(workers_of(srv.proc.pid)) == 2, what="two workers running")

        def upload(_: int) -> int:
            return requests.post(f"{srv.url}/upload", files={"file": ("noise.png", data, "image/png")},
                                 timeout=60).status_code

        with ThreadPoolExecutor(12) as pool:
            statuses = list(pool.map(upload, range(12)))
    finally:
        stop_server(srv)
    uploads = list((public / "uploads").iterdir())
    assert sorted(statuses) == [200] * 3 + [507] * 9, statuses
    assert len(uploads) == 3 and sum(p.stat().st_size for p in uploads) <= mib
