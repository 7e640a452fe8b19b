"""Where a model runs: the local models server, hosted inference, or the LLM itself.

Every backend takes TaskInputs and returns a JARVIS-shaped inference result (`generated image`,
`predicted`, ...), so the rest of the pipeline never cares where a model ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..resources import Resource


@dataclass(frozen=True)
class TaskInputs:
    task: str
    text: str | None = None
    image: Resource | None = None
    audio: Resource | None = None


class Backend(Protocol):
    name: str  # "local" | "huggingface"

    def is_available(self, model_id: str) -> bool: ...

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]: ...
