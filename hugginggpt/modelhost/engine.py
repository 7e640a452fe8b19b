"""Engines: what the models server's app calls to run one request on one model.

An engine answers `registry`, `device`, `loaded()` and `infer(spec, inputs)`. `LocalEngine` composes the
two rooms of this process: the pool keeps models loaded (and evicts them), the handlers turn a request body
into a pipeline call. `RayEngine` (`ray_engine.py`) does the same on Ray Serve replicas.
"""

from __future__ import annotations

from typing import Any, Protocol

from .handlers import Inputs, handle
from .pool import ModelPool
from .registry import ModelSpec, Registry


class Engine(Protocol):
    registry: Registry
    device: str

    def loaded(self) -> dict[str, Any]: ...  # model id -> an object with `nbytes`

    def infer(self, spec: ModelSpec, inputs: Inputs) -> Any: ...


class LocalEngine:
    """Models in this process: take the model from the pool (loading it if needed), run its task's handler."""

    def __init__(self, pool: ModelPool):
        self.pool = pool
        self.registry = pool.registry
        self.device = pool.device

    def loaded(self) -> dict[str, Any]:
        return self.pool.loaded()

    def infer(self, spec: ModelSpec, inputs: Inputs) -> Any:
        with self.pool.use(spec) as loaded:
            return handle(spec.task, loaded, inputs)
