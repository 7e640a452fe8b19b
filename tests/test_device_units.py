"""modelhost/device.py in-process: the device the models server really uses and the memory it reports, on a
CUDA torch stood in for by its functions (this machine has no GPU; tools/gpu_check.py runs the real ones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hugginggpt.modelhost import device as device_module
from hugginggpt.modelhost.device import free_memory_reader, memory_report, resolve_device, version_problems

GIB = 2**30


@pytest.fixture
def two_gpus(monkeypatch):
    """torch.cuda as on a machine with two GPUs: cuda:0 has 10 GiB free of 80, cuda:1 30 of 80; each allocator
    holds 3 GiB reserved, 1 GiB of it in use. Returns the devices each function was asked about."""
    asked: list[str] = []
    free = {"cuda:0": 10 * GIB, "cuda:1": 30 * GIB}

    def mem_get_info(device=None):
        asked.append(str(device))
        return free[str(device)], 80 * GIB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    # each card's allocator: cuda:0 reserved 3 GiB (1 in use), cuda:1 reserved 3 GiB (1 in use); asking with no
    # device (the current card) is what the code must not do: the current card need not be the models' card
    reserved = {"cuda:0": 3 * GIB, "cuda:1": 3 * GIB}
    allocated = {"cuda:0": 1 * GIB, "cuda:1": 1 * GIB}
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved[str(device)])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated[str(device)])
    return asked


def test_an_existing_gpu_is_used_as_configured(two_gpus):
    assert resolve_device("cuda:1") == ("cuda:1", None)
    assert resolve_device("cuda") == ("cuda", None)
    assert resolve_device(" cuda:0 ") == ("cuda:0", None)


@pytest.mark.parametrize("asked", ["cuda:2", "cuda:7", "cuda:first", "cuda:-1", "cuda:1.0"])
def test_a_gpu_that_is_not_there_falls_back_to_the_cpu_with_one_warning(two_gpus, asked):
    device, warning = resolve_device(asked)
    assert device == "cpu"
    assert warning == (f"device {asked!r} does not exist (this machine has 2 CUDA device(s)); running on the CPU")


def test_without_cuda_a_gpu_device_runs_on_the_cpu_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    device, warning = resolve_device("cuda:0")
    assert device == "cpu"
    assert warning.startswith("device 'cuda:0' is configured but this torch has no CUDA (")
    assert warning.endswith("); running on the CPU")


@pytest.mark.parametrize("other", ["cpu", "mps", "xpu:0", ""])
def test_other_devices_are_taken_as_given(monkeypatch, other):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(other) == (other or "cpu", None)


def test_free_memory_counts_the_allocator_s_unused_cache_in_bytes_on_the_configured_gpu(two_gpus):
    free = free_memory_reader("cuda:1")
    assert free() == 30 * GIB + 3 * GIB - 1 * GIB  # the driver's free, plus reserved but unused
    assert two_gpus == ["cuda:1"]  # the card the models run on, not the current one
    assert free_memory_reader("cpu") is None and free_memory_reader("mps") is None


def test_the_cuda_memory_report_names_each_reading(two_gpus):
    assert memory_report("cuda:0") == {"device_allocated_bytes": GIB, "device_reserved_bytes": 3 * GIB,
                                       "device_free_bytes": 10 * GIB, "device_total_bytes": 80 * GIB}
    assert two_gpus == ["cuda:0"]


def test_on_the_cpu_the_report_is_the_resident_set_size():
    rss = memory_report("cpu")["rss_bytes"]
    kib = int(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))
    assert abs(rss - kib * 1024) < 0.1 * kib * 1024  # resident, in bytes (not pages, not the virtual size)


def test_a_library_older_than_the_server_needs_is_named_with_the_upgrade_to_make(monkeypatch):
    from importlib.metadata import version

    from packaging.version import Version

    torch_now = ".".join(str(n) for n in Version(version("torch")).release)
    monkeypatch.setattr(device_module, "MINIMUM_VERSIONS", {"torch": "99.1", "packaging": "1.0"})
    assert version_problems() == [f"torch {version('torch')} is older than this server can serve: upgrade to torch>=99.1"]
    monkeypatch.setattr(device_module, "MINIMUM_VERSIONS", {"torch": torch_now})  # exactly the least: fine
    assert version_problems() == []


def test_a_missing_library_is_named_only_where_the_server_needs_it(monkeypatch):
    from importlib.metadata import version

    monkeypatch.setattr(device_module, "MINIMUM_VERSIONS", {"no-such-library-xyz": "1.0", "another-missing-one": "2.0",
                                                            "torch": "99.0"})
    assert version_problems(required=("no-such-library-xyz", "another-missing-one")) == [
        "no-such-library-xyz is not installed (this server needs no-such-library-xyz>=1.0)",
        "another-missing-one is not installed (this server needs another-missing-one>=2.0)",
        f"torch {version('torch')} is older than this server can serve: upgrade to torch>=99.0"]  # one missing
    assert version_problems(required=()) == [  # library does not hide the next; an optional one is not named
        f"torch {version('torch')} is older than this server can serve: upgrade to torch>=99.0"]
