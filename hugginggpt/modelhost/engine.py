"""Engines: what the models server's app calls to run one request on one model.

An engine answers `registry`, `device`, `loaded()` and `infer(spec, inputs)`. `LocalEngine` composes the
two rooms of this process: the pool keeps models loaded (and evicts them), the handlers turn a request body
into a pipeline call; with a `Batcher`, concurrent requests of one model and a batchable task share one call
(`batching.py`). `RayEngine` (`ray_engine.py`) does the same on Ray Serve replicas.
"""

from __future__ import annotations

from typing import Any, Protocol

from .batching import Batcher, batch_size_var, each_or_batch
from .handlers import BATCHABLE, Inputs, handle
from .pool import ModelPool, is_out_of_memory
from .registry import ModelSpec, Registry


class Engine(Protocol):
    registry: Registry
    device: str

    def loaded(self) -> dict[str, Any]: ...  # model id -> an object with `nbytes`

    def infer(self, spec: ModelSpec, inputs: Inputs) -> Any: ...


class LocalEngine:
    """Models in this process: take the model from the pool (loading it if needed), run its task's handler."""

    def __init__(self, pool: ModelPool, batcher: Batcher | None = None):
        """batcher: None (or max_size 1) runs every request alone."""
        self.pool = pool
        self.registry = pool.registry
        self.device = pool.device
        self.batcher = batcher if batcher is not None and batcher.max_size > 1 else None

    def loaded(self) -> dict[str, Any]:
        return self.pool.loaded()

    def memory(self) -> dict[str, Any]:
        return self.pool.memory()

    def infer(self, spec: ModelSpec, inputs: Inputs) -> Any:
        inputs.fetch_urls()  # on this request's thread: a slow URL holds neither the model nor a compute thread
        batchable = BATCHABLE.get(spec.task) if self.batcher is not None else None
        if batchable is None:
            with self.pool.use(spec) as loaded:  # the model's turn is taken here, the work runs on a compute thread
                result = self.pool.compute.run(handle, spec.task, loaded, inputs)
            batch_size_var.set(1)
            return result
        item = batchable.prepare(inputs)  # a bad input is refused here, before it joins a batch

        def run(items: list[Any]) -> list[Any]:
            with self.pool.use(spec) as loaded:
                results = self.pool.compute.run(each_or_batch, lambda some: batchable.run(loaded, some), items)
            return [self.pool.out_of_memory(spec) if isinstance(r, Exception) and is_out_of_memory(r) else r
                    for r in results]

        result, size = self.batcher.submit((spec.id, spec.task), item, run)
        batch_size_var.set(size)
        return result
