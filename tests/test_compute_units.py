"""The compute threads of the flask engine (modelhost/compute.py), in-process: where model work runs, how many
threads it may use, what a caller waiting for one hears, and that nothing a call made is held after it."""

from __future__ import annotations

import contextvars
import gc
import logging
import subprocess
import sys
import threading
import time
import weakref

import pytest

from hugginggpt.modelhost import progress
from hugginggpt.modelhost.compute import ACCELERATOR_THREADS, CPU_THREADS, Compute, cores, default_threads, for_device


def test_a_call_returns_its_result_and_raises_its_own_error_in_the_caller():
    compute = Compute(1)
    assert compute.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(KeyError, match="missing"):
        compute.run(lambda: {}["missing"])
    assert compute.run(str.upper, "after an error the thread still serves") == "AFTER AN ERROR THE THREAD STILL SERVES"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_callers_run_on_at_most_the_configured_threads_none_of_them_the_callers(threads):
    compute = Compute(threads)
    ran_on: set[int] = set()
    running = [0]
    most = [0]
    lock = threading.Lock()

    names: set[str] = set()

    def work() -> None:
        with lock:
            ran_on.add(threading.get_ident())
            names.add(threading.current_thread().name)  # what a debugger's thread dump shows
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    callers = [threading.Thread(target=compute.run, args=(work,)) for _ in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(30)
    assert most[0] == threads  # as many at once as there are threads, never more
    assert len(ran_on) == threads and names == {f"model-compute-{k}" for k in range(1, threads + 1)}
    assert not ran_on & {t.ident for t in callers} and threading.get_ident() not in ran_on


def test_the_callers_context_comes_along():
    var: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")
    compute = Compute(1)
    var.set("request 7")
    assert compute.run(var.get) == "request 7"
    var.set("request 8")  # a later caller's value, on the same thread
    assert compute.run(var.get) == "request 8"


def test_a_call_that_waits_for_a_thread_says_queued_then_running_and_one_that_need_not_says_nothing():
    compute = Compute(1)
    for _ in range(3):  # calls that came and went are no longer counted
        compute.run(lambda: None)
    with pytest.raises(ValueError):
        compute.run(int, "not a number")
    started, release = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(30)

    first = threading.Thread(target=compute.run, args=(hold,))
    first.start()
    assert started.wait(10)
    heard: list[dict] = []
    second_result: list[str] = []

    def second() -> None:
        with progress.watching(progress.Watch(heard.append)):
            second_result.append(compute.run(lambda: "done"))

    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(0.2)
    assert heard == [{"phase": "queued", "waiting": "behind other models' calls"}] and not second_result
    release.set()
    waiter.join(10)
    first.join(10)
    assert heard[1:] == [{"phase": "running"}] and second_result == ["done"]
    alone: list[dict] = []  # the thread is free now: nothing to say
    with progress.watching(progress.Watch(alone.append)):
        compute.run(lambda: None)
    assert alone == []


def test_each_compute_thread_runs_torch_on_its_share_of_the_cores():
    torch = pytest.importorskip("torch")
    assert Compute(1, torch_threads=1).run(torch.get_num_threads) == 1
    share = Compute(2)
    assert share.torch_threads == max(1, cores() // 2)
    assert Compute(10**6).torch_threads == 1  # never none


def test_cores_follow_omp_num_threads_where_set(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cores() == 3 and Compute(1).torch_threads == 3
    assert Compute(2).torch_threads == 1 and isinstance(Compute(2).torch_threads, int)  # a whole share
    monkeypatch.setenv("OMP_NUM_THREADS", " 1 ")
    assert cores() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cores() == len(__import__("os").sched_getaffinity(0))
    for unusable in ("", "0", "two", "-1"):
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        assert cores() == len(__import__("os").sched_getaffinity(0))


def test_the_cpu_takes_one_call_at_a_time_and_an_accelerator_four():
    assert default_threads("cpu") == CPU_THREADS == 1
    assert default_threads("cuda:0") == default_threads("mps") == ACCELERATOR_THREADS == 4
    assert for_device("cpu").threads == 1 and for_device("cuda:1").threads == 4  # compute_threads unset
    assert for_device("cpu", 3).threads == 3 and for_device("cuda:0", 2).threads == 2  # compute_threads: N
    with pytest.raises(ValueError, match="^compute threads must be at least 1$"):
        Compute(0)


def test_an_idle_thread_holds_nothing_of_its_last_call():
    """The pool evicts a model by dropping its reference; a compute thread that kept the last call's answer or
    arguments would keep the model's memory."""

    class Model:
        pass

    compute = Compute(1)
    model = Model()
    gone = weakref.ref(model)
    answer = compute.run(lambda m: [m], model)
    assert answer[0] is model
    del model, answer
    gc.collect()
    assert gone() is None
    failing = Model()
    gone = weakref.ref(failing)

    def boom(m: Model) -> None:
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        compute.run(boom, failing)
    del failing
    gc.collect()
    assert gone() is None


def test_a_process_stopped_during_a_long_call_exits_at_once():
    """Ctrl-C on a server in the middle of a long diffusion call: the process ends, the call does not hold it."""
    script = ("import threading, time\n"
              "from hugginggpt.modelhost.compute import Compute\n"
              "c = Compute(1, torch_threads=1)\n"
              "running = threading.Event()\n"
              # from the main thread: a thread started from it is no daemon unless told
              "c.submit(lambda: (running.set(), time.sleep(600)))\n"
              "assert running.wait(60)\nprint('leaving', flush=True)\n")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "leaving" in done.stdout, done.stderr
    assert time.monotonic() - t0 < 30


def test_a_call_given_up_before_its_turn_never_runs_and_leaves_no_queue_behind():
    """A Ray replica awaits `submit`'s future; a front that goes away cancels it. A cancelled call that had not
    started never runs, and the next caller is not told it waits behind it."""
    compute = Compute(1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []
    first = compute.submit(lambda: (started.set(), release.wait(30)))
    assert started.wait(10)
    given_up = compute.submit(ran.append, "the call nobody waits for")
    assert given_up.cancel()
    release.set()
    first.result(10)
    heard: list[dict] = []
    with progress.watching(progress.Watch(heard.append)):
        assert compute.submit(lambda: "next").result(10) == "next"  # a thread killed by the cancelled call: late
    assert ran == [] and heard == []


def test_a_thread_whose_torch_cannot_be_set_still_serves(monkeypatch, caplog):
    """If torch refuses its thread count (or is missing), calls still run: a compute thread that died at its
    start would leave every call waiting for ever."""
    torch = pytest.importorskip("torch")

    def refuse(_n: int) -> None:
        raise RuntimeError("set_num_threads refused")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    with caplog.at_level(logging.WARNING, logger="hugginggpt.modelhost.compute"):
        assert Compute(1).submit(lambda: "served").result(10) == "served"
    assert "compute thread: torch's threads left as they were (RuntimeError: set_num_threads refused)" in caplog.text


def hold_the_thread(compute: Compute) -> tuple[threading.Event, threading.Thread]:
    """A call that holds the only compute thread until the returned event is set."""
    started, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=compute.run, args=(lambda: (started.set(), release.wait(30)),))
    holder.start()
    assert started.wait(10)
    return release, holder


def test_a_call_whose_client_left_while_it_waited_never_runs():
    from hugginggpt.cancel import Cancelled

    compute = Compute(1)
    release, holder = hold_the_thread(compute)
    heard: list[dict] = []
    ran: list[str] = []
    watch = progress.Watch(heard.append)
    with progress.watching(watch):
        waiting = compute.submit(ran.append, "a caption nobody will read")
    assert heard == [{"phase": "queued", "waiting": "behind other models' calls"}]
    watch.stop()  # the client leaves while the call waits
    release.set()
    with pytest.raises(Cancelled, match="left while the call waited"):
        waiting.result(10)
    holder.join(10)
    assert ran == [] and compute.submit(lambda: "next").result(10) == "next"


def test_a_load_that_waited_for_its_turn_says_loading_again_not_running():
    compute = Compute(1)
    release, holder = hold_the_thread(compute)
    heard: list[dict] = []
    with progress.watching(progress.Watch(heard.append)):
        loading = compute.submit(lambda: "loaded", resume=progress.LOADING)
    release.set()
    assert loading.result(10) == "loaded"
    holder.join(10)
    assert heard == [{"phase": "queued", "waiting": "behind other models' calls"}, {"phase": "loading"}]

