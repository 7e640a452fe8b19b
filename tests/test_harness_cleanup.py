"""A test run leaves nothing behind: every process a test starts (a server, and what it starts in turn) exits
when the run that started it is gone, however it ended (killed, timed out, a mutant stopped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT, free_port, wait_until

# A stand-in for a test run: it starts the real orchestrator the way the fixtures do (its environment carries the
# run's pid and the child site), prints the server's pid, and waits to be killed.
RUN = """
import os, subprocess, sys, time
os.environ["HUGGINGGPT_TEST_RUNNER"] = str(os.getpid())
from tests import mutmut_hits
mutmut_hits.start()
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(server.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is gone for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_process_a_test_run_started_exits_when_the_run_is_killed():
    env = {k: v for k, v in os.environ.items() if k not in ("HUGGINGGPT_TEST_RUNNER", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT)
    run = subprocess.Popen([sys.executable, "-c", RUN], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        child = int(run.stdout.readline())
        time.sleep(1.0)
        assert alive(child)  # it runs while the run does
        run.send_signal(signal.SIGKILL)  # the run ends without any teardown
        run.wait(10)
        wait_until(lambda: not alive(child), 10, "the run's server to exit")
    finally:
        run.kill()


def test_a_child_of_the_run_starts_without_a_word_on_stderr():
    """The child site loads quietly (a process whose stderr a test reads sees only its own output)."""
    run = subprocess.run([sys.executable, "-c", "import sys, threading; print(sorted(t.name for t in "
                          "threading.enumerate()))"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stderr == ""
    assert "test-runner-watch" in run.stdout  # and it watches this run


def test_this_runs_children_know_who_to_watch():
    assert os.environ.get("HUGGINGGPT_TEST_RUNNER") == str(os.getpid())
    assert str(ROOT / "tests" / "mutmut_child") in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    assert free_port()  # the fixtures' helpers still import
