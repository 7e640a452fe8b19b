"""Ray and Ray Serve as the models server's Ray engine uses them, in one process, for tests where Ray (an extra)
is absent or too slow to start per mutant. Each part keeps the contract of Ray's own (ray/serve/api.py,
ray/serve/multiplex.py, ray/serve/batching.py, ray/serve/handle.py, as of ray 2.60):

- `multiplexed(max_num_models_per_replica=n)`: the decorated `async (self, model_id)` loads a model on its first
  use in a replica and keeps at most n, least recently used out first; n must be a positive int (or -1).
- `batch(max_batch_size=, batch_wait_timeout_s=)`: the decorated method is called with one item and answers that
  item's result; the function itself gets a list. Here every batch holds one item (Serve's gathering is timing);
  the wrapper tells its settings as Serve's does (`_get_max_batch_size`, `_get_batch_wait_timeout_s`).
- `get_multiplexed_model_id()`: the id the caller set with `handle.options(multiplexed_model_id=...)`.
- `deployment(cls, **options)`, `.options(**more)`, `.bind(*args)`, `run(app, name=, route_prefix=)`: `run`
  starts `num_replicas` instances of the class and answers a handle; `handle.options(...).infer.remote(body)`
  answers a response (`result(timeout_s=)`, raising TimeoutError when late; `cancel()`), and with
  `stream=True` a response generator over the method's async generator.
- `ray.init(...)` and `ray.shutdown()` are recorded.

Every call is recorded in `calls`, so a test reads what the engine asked of Ray."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections import OrderedDict
from typing import Any

_MODEL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("multiplexed_model_id", default="")


class Ray:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append(("init", kwargs))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", {}))


class Serve:
    def __init__(self, fail_delete: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_delete = fail_delete
        self.loop = asyncio.new_event_loop()  # the replicas' event loop, on a thread of its own as in Serve
        threading.Thread(target=self.loop.run_forever, daemon=True, name="stand-in-serve").start()

    # -- the decorators a replica class uses -------------------------------------------------------------------

    @staticmethod
    def multiplexed(max_num_models_per_replica: int = 3):
        if not isinstance(max_num_models_per_replica, int):
            raise TypeError("max_num_models_per_replica must be an integer.")
        if max_num_models_per_replica != -1 and max_num_models_per_replica <= 0:
            raise ValueError("max_num_models_per_replica must be positive.")

        def decorate(func):
            @functools.wraps(func)
            async def wrapper(self, model_id: str):
                held: OrderedDict = self.__dict__.setdefault("_stand_in_models", OrderedDict())
                if model_id in held:
                    held.move_to_end(model_id)
                    return held[model_id]
                if max_num_models_per_replica != -1 and len(held) >= max_num_models_per_replica:
                    held.popitem(last=False)
                held[model_id] = await func(self, model_id)
                return held[model_id]
            wrapper.max_num_models_per_replica = max_num_models_per_replica
            return wrapper
        return decorate

    @staticmethod
    def batch(max_batch_size: int = 10, batch_wait_timeout_s: float = 0.01):
        def decorate(func):
            @functools.wraps(func)
            async def wrapper(self, item):
                [result] = await func(self, [item])
                return result
            wrapper._get_max_batch_size = lambda: max_batch_size
            wrapper._get_batch_wait_timeout_s = lambda: batch_wait_timeout_s
            return wrapper
        return decorate

    @staticmethod
    def get_multiplexed_model_id() -> str:
        return _MODEL_ID.get()

    # -- deploying ---------------------------------------------------------------------------------------------

    def start(self, **kwargs: Any) -> None:
        self.calls.append(("start", kwargs))

    def deployment(self, cls: type, **options: Any) -> Deployment:
        self.calls.append(("deployment", {"cls": cls, **options}))
        return Deployment(cls, options)

    def run(self, app: Application, name: str, route_prefix: Any = "/") -> Handle:
        self.calls.append(("run", {"options": app.deployment.settings, "args": app.args, "name": name,
                                   "route_prefix": route_prefix}))
        replicas = [app.deployment.cls(*app.args) for _ in range(app.deployment.settings.get("num_replicas", 1))]
        return Handle(self, replicas, {})

    def delete(self, name: str) -> None:
        self.calls.append(("delete", {"name": name}))
        if self.fail_delete:
            raise RuntimeError(f"the controller did not answer while deleting {name}")

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class Deployment:
    def __init__(self, cls: type, settings: dict[str, Any]) -> None:
        self.cls, self.settings = cls, settings

    def options(self, **more: Any) -> Deployment:
        return Deployment(self.cls, {**self.settings, **more})

    def bind(self, *args: Any) -> Application:
        return Application(self, args)


class Application:
    def __init__(self, deployment: Deployment, args: tuple) -> None:
        self.deployment, self.args = deployment, args


class Handle:
    """A deployment handle: each call goes to the first replica (Serve routes a model to a replica holding it)."""

    def __init__(self, serve: Serve, replicas: list[Any], opts: dict[str, Any]) -> None:
        self.serve, self.replicas, self.opts = serve, replicas, opts

    def options(self, **more: Any) -> Handle:
        return Handle(self.serve, self.replicas, {**self.opts, **more})

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            def remote(self, *args: Any) -> Any:
                call = getattr(handle.replicas[0], method)
                ctx = contextvars.copy_context()
                ctx.run(_MODEL_ID.set, handle.opts.get("multiplexed_model_id", ""))
                if handle.opts.get("stream"):
                    return ResponseGenerator(handle.serve.loop, ctx, call(*args))
                future = asyncio.run_coroutine_threadsafe(_task(ctx, call(*args)), handle.serve.loop)
                return Response(future)
        return Method()


async def _task(ctx: contextvars.Context, coro: Any) -> Any:
    return await asyncio.get_running_loop().create_task(coro, context=ctx)


class Response:
    def __init__(self, future: Any) -> None:
        self.future = future

    def result(self, timeout_s: float | None = None) -> Any:
        import concurrent.futures

        try:
            return self.future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"timed out after {timeout_s}s") from None

    def cancel(self) -> None:
        self.future.cancel()


class ResponseGenerator:
    """A stream: each item is the next of the method's async generator. `cancel()`, as Serve's, ends the request: a
    step in progress is cancelled (the generator's `finally` runs) and the waiting iteration raises."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ctx: contextvars.Context, agen: Any) -> None:
        self.loop, self.ctx, self.agen = loop, ctx, agen
        self.cancelled = False
        self.step: Any = None  # the running __anext__, a concurrent future

    def __iter__(self) -> ResponseGenerator:
        return self

    def __next__(self) -> Any:
        import concurrent.futures

        if self.cancelled:
            raise RuntimeError("the request was cancelled")
        self.step = asyncio.run_coroutine_threadsafe(_task(self.ctx, self.agen.__anext__()), self.loop)
        try:
            return self.step.result()
        except StopAsyncIteration:
            raise StopIteration from None
        except concurrent.futures.CancelledError:
            raise RuntimeError("the request was cancelled") from None

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if self.step is not None and not self.step.done():
            self.step.cancel()  # the generator's step ends with CancelledError, its `finally` run
        else:
            asyncio.run_coroutine_threadsafe(self.agen.aclose(), self.loop).result(60)
