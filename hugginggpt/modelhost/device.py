"""Which device the models server really uses: the configured one, or the CPU with one warning."""

from __future__ import annotations


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
