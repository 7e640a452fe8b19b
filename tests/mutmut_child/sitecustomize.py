"""Loaded by Python at start-up in every process that tests start (servers, CLIs, and their own children).

A child exits when the test run that started it is gone (`HUGGINGGPT_TEST_RUNNER`, its pid), however the run
ended: killed, timed out, a mutant stopped for running too long. No server is left serving after its run.

Under mutmut's stats run only: mutmut's trampolines record which functions a test reaches, but a server the
test starts as a child process records them in its own memory, where mutmut never looks: those functions would
count as reached by no test. Here the child writes each function it reaches to a file; `tests/mutmut_hits.py`
hands them to mutmut at the end of every test.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# This folder is first on PYTHONPATH only so that Python finds this file: take it off again, and run any
# sitecustomize it hid.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]


def _exit_when_runner_is_gone(runner_pid: int) -> None:
    while True:
        time.sleep(0.5)
        try:
            os.kill(runner_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass


def _forward_hits(folder: str) -> None:
    """Replace mutmut's recorder: write each function reached since the last test ended to our file."""
    import mutmut.mutation.trampoline as trampoline

    epoch_file = os.path.join(folder, "epoch")
    out = open(os.path.join(folder, f"{os.getpid()}.hits"), "a", buffering=1, encoding="utf-8")
    lock = threading.Lock()
    seen: set[str] = set()
    last_epoch = [-1]

    def record(name: str, caller: str | None = None) -> None:
        try:
            epoch = os.stat(epoch_file).st_mtime_ns
        except OSError:
            epoch = 0
        with lock:
            if epoch != last_epoch[0]:
                last_epoch[0] = epoch
                seen.clear()
            if name not in seen:
                seen.add(name)
                out.write(name + "\n")

    trampoline.record_trampoline_hit = record


if os.environ.get("HUGGINGGPT_TEST_RUNNER", "").isdigit():
    threading.Thread(target=_exit_when_runner_is_gone, args=(int(os.environ["HUGGINGGPT_TEST_RUNNER"]),),
                     daemon=True, name="test-runner-watch").start()
if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("HUGGINGGPT_MUTMUT_HITS"):
    _forward_hits(os.environ["HUGGINGGPT_MUTMUT_HITS"])

_this = sys.modules.pop("sitecustomize", None)
try:  # a sitecustomize further down the path (a distribution's own) still runs
    import sitecustomize  # noqa: F401
except ImportError:  # none: the import that is loading this file expects to find it under its name
    if _this is not None:
        sys.modules["sitecustomize"] = _this
