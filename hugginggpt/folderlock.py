"""One process at a time in a folder's critical section: the worker processes of one server share the disk.

An flock on the folder itself (no lock file is left in it, which matters for public/uploads, whose files are
served), with a thread lock around it for the threads of one process. Where there is no fcntl (Windows) only
the thread lock holds; one process serves there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path


def _hold(folder: Path, thread_lock: threading.Lock | None = None) -> Iterator[None]:
    """Hold `folder` (created if missing) against other processes, and `thread_lock` against this one's threads."""
    with thread_lock if thread_lock is not None else nullcontext():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on Windows, where a folder cannot be opened
            yield
            return
        fd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops its lock


# Wrapped here, not decorated: mutmut leaves decorated functions unmutated, and this one guards shared files.
locked_folder = contextmanager(_hold)
