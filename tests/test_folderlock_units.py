"""folderlock.locked_folder: one process at a time in a folder's critical section (the workers of one server
share public/uploads and the catalog's files), and one thread of this process."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from hugginggpt.folderlock import locked_folder


def other_process_could_lock(folder) -> bool:
    """What another worker process would get now: a descriptor of its own, asking without waiting."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_folder_is_held_inside_and_free_after(tmp_path):
    folder = tmp_path / "public" / "uploads"  # made, with its parents, on first use
    with locked_folder(folder):
        assert folder.is_dir()
        assert not other_process_could_lock(folder)
    assert other_process_could_lock(folder)


def test_a_failure_inside_lets_go_of_the_folder_and_the_thread_lock(tmp_path):
    lock = threading.Lock()
    with pytest.raises(OSError, match="disk full"):
        with locked_folder(tmp_path, lock):
            assert lock.locked()
            raise OSError("disk full")
    assert other_process_could_lock(tmp_path)  # not held for ever: every later writer would hang
    assert not lock.locked()


def test_the_thread_lock_keeps_this_process_s_threads_out_one_at_a_time(tmp_path):
    lock = threading.Lock()
    inside: list[int] = []
    most: list[int] = []

    def worker():
        for _ in range(20):
            with locked_folder(tmp_path, lock):
                inside.append(1)
                most.append(len(inside))
                inside.pop()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert max(most) == 1 and len(most) == 80
