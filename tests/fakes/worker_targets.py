"""Stand-ins for a worker process and for the processes around one (tests/test_workers_units.py).

They run in spawned children, so they import nothing heavy: a worker stand-in is what `workers.Supervisor` runs
in place of `worker_main` (`Supervisor(..., worker=partial(serve, folder))`). Each writes what it was given to
`<folder>/<index>-<pid>.json` as it starts, then behaves as its name says.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

WARMING_SECONDS = 0.5  # worker 0's warm-up: long enough that a worker started without waiting for it would see it cold
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def write(path: Path, data: Any) -> None:
    """All at once: a test polling for the file never reads half of it."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(data))
    part.replace(path)


def report(folder: str, spec: Any) -> None:
    me = multiprocessing.current_process()
    write(Path(folder) / f"{spec.index}-{os.getpid()}.json", {
        "index": spec.index, "pid": os.getpid(), "workers": spec.workers, "host": spec.host, "port": spec.port,
        "http_workers": spec.config.http_workers, "sockets": [list(s.getsockname()[:2]) for s in spec.sockets],
        "counts": list(spec.held), "warmed": spec.warmed.is_set(), "first": spec.first,
        "metrics_dir": spec.metrics_dir, "metrics_env": os.environ.get("PROMETHEUS_MULTIPROC_DIR"),
        "name": me.name, "daemon": me.daemon, "ctrl_c_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
        "forked": "tests.test_workers_units" in sys.modules,  # a forked child has its parent's modules
        "metrics_dir_exists": os.path.isdir(spec.metrics_dir), "at": time.monotonic(),
    })


def serve(folder: str, spec: Any, warms: bool = True) -> None:
    """A worker that starts fine: worker 0 warms for a while, then says so; all serve until stopped."""
    report(folder, spec)
    if spec.index == 0 and warms:
        time.sleep(WARMING_SECONDS)
        spec.warmed.set()
    while True:
        time.sleep(1)


def never_warms(folder: str, spec: Any) -> None:
    serve(folder, spec, warms=False)


def exits_at_once(index: int, folder: str, spec: Any) -> None:
    """Worker `index` exits at once, every time (a broken install); the others serve."""
    if spec.index != index:
        serve(folder, spec)
    report(folder, spec)
    sys.exit(3)


def stubborn(folder: str, spec: Any) -> None:
    """A worker that ignores SIGTERM (stuck in a C call, say): only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(folder, spec)


def removes_metrics(folder: str, spec: Any) -> None:
    """As if a temp cleaner removed the supervisor's metrics folder while the server ran."""
    if spec.index == 0:
        shutil.rmtree(spec.metrics_dir)
    serve(folder, spec)


# -- a worker's watch on its supervisor (`workers._exit_with_parent`) ---------------------------------------------


def threads() -> list[list[Any]]:
    return [[t.name, t.daemon] for t in threading.enumerate()]


def watches_then_returns(folder: str) -> None:
    """A worker that watches its parent, then ends: the watch must not keep it from exiting."""
    from hugginggpt.workers import _exit_with_parent

    _exit_with_parent()
    write(Path(folder) / "threads.json", threads())


def orphan(folder: str) -> None:
    """A worker that watches its parent and would otherwise serve on for a long while."""
    from hugginggpt.workers import _exit_with_parent

    _exit_with_parent()
    write(Path(folder) / "orphan.json", {"pid": os.getpid(), "threads": threads()})
    time.sleep(30)


def killed_supervisor(folder: str) -> None:
    """Starts `orphan`, then dies by SIGKILL (no clean-up of any kind) once the orphan watches."""
    child = multiprocessing.get_context("fork").Process(target=orphan, args=(folder,))
    child.start()
    deadline = time.monotonic() + 10
    while not (Path(folder) / "orphan.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)


def reaper(folder: str) -> None:
    """Adopts the orphan when its parent dies (a child subreaper, as an init would), so that its exit status
    can be read: writes `reaped.json` with it, or with null when the orphan was still running after 5 s."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        write(Path(folder) / "reaped.json", {"error": os.strerror(ctypes.get_errno())})
        return
    parent = multiprocessing.get_context("fork").Process(target=killed_supervisor, args=(folder,))
    parent.start()
    parent.join()
    pid = json.loads((Path(folder) / "orphan.json").read_text())["pid"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            write(Path(folder) / "reaped.json", {"status": os.waitstatus_to_exitcode(status)})
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    write(Path(folder) / "reaped.json", {"status": None})
