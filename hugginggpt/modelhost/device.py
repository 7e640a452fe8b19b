"""Which device the models server really uses (the configured one, or the CPU with one warning), what memory
it has, and whether the installed torch / transformers / diffusers are ones this server can serve."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def resolve_device(requested: str) -> tuple[str, str | None]:
    """`cuda:N` on a machine without that GPU falls back to the CPU instead of failing every call."""
    requested = (requested or "cpu").strip()
    if not requested.startswith("cuda"):
        return requested, None
    import torch

    if not torch.cuda.is_available():
        return "cpu", (f"device {requested!r} is configured but this torch has no CUDA "
                       f"({torch.__version__}); running on the CPU")
    _, _, index = requested.partition(":")
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        return "cpu", (f"device {requested!r} does not exist (this machine has {torch.cuda.device_count()} "
                       "CUDA device(s)); running on the CPU")
    return requested, None


def free_memory_reader(device: str) -> Callable[[], int] | None:
    """What the device can still give, in bytes, for the pool's decisions: on CUDA the driver's free memory
    (`torch.cuda.mem_get_info`) plus what torch's allocator holds in its cache unused; None on other devices."""
    if not device.startswith("cuda"):
        return None
    import torch

    def free() -> int:
        driver_free, _ = torch.cuda.mem_get_info(device)
        return int(driver_free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))

    return free


def memory_report(device: str) -> dict[str, Any]:
    """The process's memory as the device sees it: CUDA allocated / reserved / free / total; on the CPU the
    resident set size (Linux; absent elsewhere)."""
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return {"device_allocated_bytes": int(torch.cuda.memory_allocated(device)),
                "device_reserved_bytes": int(torch.cuda.memory_reserved(device)),
                "device_free_bytes": int(free), "device_total_bytes": int(total)}
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return {}
    return {"rss_bytes": pages * os.sysconf("SC_PAGE_SIZE")}


# The oldest versions this server's loading code runs with (pipeline(dtype=...) came in transformers 4.56;
# torch.OutOfMemoryError and mem_get_info on every device in torch 2.1; diffusers' from_pretrained(torch_dtype=)
# and the ControlNet pipelines as we call them in 0.27). Checked by tools/gpu_check.py and at the server's start.
MINIMUM_VERSIONS = {"torch": "2.1", "transformers": "4.56", "diffusers": "0.27"}


def version_problems(required: tuple[str, ...] = ("torch", "transformers")) -> list[str]:
    """One line per library that is missing (when required) or older than this server can serve."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import InvalidVersion, Version

    problems = []
    for name, least in MINIMUM_VERSIONS.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            if name in required:
                problems.append(f"{name} is not installed (this server needs {name}>={least})")
            continue
        try:
            old = Version(found).release < Version(least).release
        except InvalidVersion:
            continue
        if old:
            problems.append(f"{name} {found} is older than this server can serve: upgrade to {name}>={least}")
    return problems
