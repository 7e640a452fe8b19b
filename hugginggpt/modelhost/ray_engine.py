"""The models server's engine on Ray Serve: models live in replicas, placed by model multiplexing.

The JARVIS protocol stays in the Flask app (`app.py`), which now forwards each inference to a Ray Serve
deployment through a handle with `multiplexed_model_id=<model id>`: Serve routes the request to a replica
that already holds that model (loading it on one otherwise), and each replica keeps at most
`models_per_replica` models, least recently used out first. Models that need different GPU shares (from the
registry) go to different deployments, so a replica's `num_gpus` fits what it holds.

Concurrent requests for one model and a batchable task (handlers.BATCHABLE) are gathered by Ray Serve's own
`@serve.batch` (at most `max_batch_size`, waiting at most `batch_wait_ms`) and run as one batch, split by model
(a replica may hold several): each request gets its own result or error, and a batch that fails is run again
one request at a time (batching.each_or_batch).

Inputs are resolved at the front (public/ paths, URLs under the URL policy) and travel to the replica as
bytes; files a replica generates come back as bytes and are written into the front's public/, so replicas
on other machines need no shared disk.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from ..cancel import Cancelled
from ..errors import BadRequest
from ..resources import OUTPUT_PATH
from .batching import batch_size_var, each_or_batch
from .compute import Compute, for_device
from .handlers import BATCHABLE, URL_FIELDS, Inputs
from .pool import InferenceFailed, ModelUnavailable
from .progress import CURRENT, LOADING, QUEUED, Watch, current, phase, watching
from .registry import ModelSpec, Registry

log = logging.getLogger(__name__)

APP_NAME = "hugginggpt-models"
T = TypeVar("T")


def replica_class(models_per_replica: int, max_batch_size: int, batch_wait_s: float, compute_threads: int | None,
                  serve: Any = None):
    """The deployment class; built lazily so that importing this module never imports Ray. A shell that gives a
    `Replica` Serve's model multiplexing (`get_model`) and gathering (`batched`): what a replica does is there.

    max_batch_size 1: every request runs alone. `serve`: Ray Serve's API (`ray.serve` when None; tests pass a
    stand-in that keeps Serve's contract, as Ray is an extra)."""
    if serve is None:
        from ray import serve

    class ModelReplica:
        def __init__(self, deployment: str, models_dir: str, catalog_path: str, device: str, max_pixels: int):
            registry = Registry(deployment, Path(models_dir), catalog_path=Path(catalog_path))
            # torch's teams never outnumber the cores (compute.py)
            self.work = Replica(registry, device, max_pixels, for_device(device, compute_threads), max_batch_size)

        @serve.multiplexed(max_num_models_per_replica=models_per_replica)
        async def get_model(self, model_id: str) -> Any:
            return await self.work.load(model_id)

        async def infer(self, body: dict[str, Any]) -> dict[str, Any]:
            return await self._dispatch(body)

        async def infer_watched(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
            async for item in self.work.watched(lambda: self._dispatch(body)):
                yield item

        async def _dispatch(self, body: dict[str, Any]) -> dict[str, Any]:
            return await self.work.dispatch(serve.get_multiplexed_model_id(), body, self.get_model, self.batched)

        @serve.batch(max_batch_size=max(1, max_batch_size), batch_wait_timeout_s=batch_wait_s)
        async def batched(self, requests: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
            return await self.work.gather(requests, self.get_model)

    return ModelReplica


GetModel = Callable[[str], Awaitable[Any]]


class Replica:
    """What one replica does, without Ray (so that it is tested in-process): load a model it was asked for, run
    each request under its model's lock on the replica's compute threads, or a batchable task's requests as
    batches, and answer in plain data ({"result", "files"} or {"error": {"kind", "message"}}) that travels
    back to the front. Serve's multiplexing and batching come in as `get_model` and `batched`."""

    def __init__(self, registry: Registry, device: str, max_pixels: int, compute: Compute, max_batch_size: int = 1):
        self.registry = registry
        self.device = device
        self.max_pixels = max_pixels
        self.compute = compute
        self.max_batch_size = max_batch_size
        self.locks: dict[str, asyncio.Lock] = {}
        self.running: set[asyncio.Future[Any]] = set()

    async def load(self, model_id: str) -> Any:
        """Serve calls this for a model its replica does not hold (`get_model`): a watched call that waits
        for it hears `loading` (its watch travels in the request's context, as in the local pool)."""
        from .pool import Loaded, load, memory_of

        spec = self.registry.get(model_id)
        if spec is None or not self.registry.servable(spec):
            raise ModelUnavailable(f"this replica cannot serve {model_id}")
        phase(LOADING)
        started = time.perf_counter()
        obj = await asyncio.wrap_future(self.compute.submit(load, spec, self.registry, self.device, resume=LOADING))
        return Loaded(spec, obj, self.device, memory_of(obj), time.perf_counter() - started)

    async def watched(self, dispatch: Callable[[], Awaitable[dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
        """A watched call: its progress events ({"progress": ...}) as the run (`dispatch()`) makes them, then
        {"answer": what it answers}. Streamed to the front (`handle.options(stream=True)`)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        watch = Watch(lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
        with watching(watch):  # the task below starts with a copy of this context
            answer = asyncio.ensure_future(dispatch())
        self.running.add(answer)  # held until done: a run outlives a front that left
        answer.add_done_callback(self.running.discard)
        try:
            async for item in pump(answer, events):
                yield item
        finally:
            watch.stop()  # the front went away (the generator closed): the run ends at its next step

    async def dispatch(self, model_id: str, body: dict[str, Any], get_model: GetModel,
                       batched: Callable[[tuple[str, dict[str, Any]]], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """One request, watched or not: into a batch of its model, or alone under its model's lock."""
        try:
            loaded = await get_model(model_id)
        except ModelUnavailable as exc:
            return {"error": {"kind": "unavailable", "message": str(exc)}}
        if self.max_batch_size > 1 and loaded.spec.task in BATCHABLE:
            phase(QUEUED, "in a batch with other requests for this model")
            return await batched((model_id, body))
        lock = self.locks.setdefault(model_id, asyncio.Lock())
        return await in_turn(lock, self.compute, model_id, self.run, loaded, body)

    async def gather(self, requests: list[tuple[str, dict[str, Any]]], get_model: GetModel) -> list[dict[str, Any]]:
        """One batch of Serve's gathering: one run per model in it, one answer per request. It runs in Serve's
        batching task, whose context is a copy of the request that started that task: a batch is no one caller's,
        so it runs watched by none (else every later batch would run under that first caller's watch, stopped
        since it answered, and be cancelled)."""
        token = CURRENT.set(None)
        try:
            return await self._gather(requests, get_model)
        finally:
            CURRENT.reset(token)

    async def _gather(self, requests: list[tuple[str, dict[str, Any]]], get_model: GetModel) -> list[dict[str, Any]]:
        answers: list[dict[str, Any]] = [{}] * len(requests)
        by_model: dict[str, list[int]] = {}
        for k, (model_id, _) in enumerate(requests):
            by_model.setdefault(model_id, []).append(k)
        for model_id, ks in by_model.items():
            try:
                loaded = await get_model(model_id)
            except ModelUnavailable as exc:
                for k in ks:
                    answers[k] = {"error": {"kind": "unavailable", "message": str(exc)}}
                continue
            async with self.locks.setdefault(model_id, asyncio.Lock()):
                done = await finished(self.compute.submit(self.run_batch, loaded, [requests[k][1] for k in ks]))
            for k, answer in zip(ks, done, strict=True):  # pragma: no mutate: run_batch answers each body
                answers[k] = answer
        return answers

    def run_batch(self, loaded: Any, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from ..errors import ResourceError

        batchable = BATCHABLE[loaded.spec.task]
        answers: dict[int, dict[str, Any]] = {}
        ready: list[tuple[int, Any]] = []
        for k, body in enumerate(bodies):  # each request's input read alone: a bad one fails alone
            try:
                # the front sends files as data URIs; a path that reaches a replica names nothing it serves
                ready.append((k, batchable.prepare(Inputs(body=body, public_dir=Path(tempfile.gettempdir()),
                                                          max_pixels=self.max_pixels))))
            except (BadRequest, ResourceError) as exc:
                answers[k] = {"error": {"kind": "bad_request", "message": str(exc)}}
        results = each_or_batch(lambda items: batchable.run(loaded, items), [item for _, item in ready])
        for (k, _), result in zip(ready, results, strict=True):  # pragma: no mutate: each_or_batch answers each item
            if isinstance(result, Exception):
                log.error("inference with %s failed: %s", loaded.spec.id, result)
                answers[k] = {"error": {"kind": "failed",
                                        "message": f"{result.__class__.__name__}: {str(result)[:300]}"}}
            else:
                answers[k] = {"result": result, "files": {}, "batch": len(bodies)}
        return [answers[k] for k in range(len(bodies))]  # each request answered: its input refused, or its result

    def run(self, loaded: Any, body: dict[str, Any]) -> dict[str, Any]:
        from ..errors import ResourceError
        from .handlers import handle

        with tempfile.TemporaryDirectory(prefix="replica-") as tmp:  # pragma: no mutate: a name for whoever lists /tmp
            inputs = Inputs(body=body, public_dir=Path(tmp), max_pixels=self.max_pixels)
            try:
                result = handle(loaded.spec.task, loaded, inputs)
            except (BadRequest, ResourceError) as exc:
                return {"error": {"kind": "bad_request", "message": str(exc)}}
            except Cancelled:
                return {"error": {"kind": "cancelled", "message": f"{loaded.spec.id} was stopped: its client left"}}
            except Exception as exc:  # noqa: BLE001 - the model's failure, reported to the front
                log.exception("inference with %s failed", loaded.spec.id)
                return {"error": {"kind": "failed", "message": f"{exc.__class__.__name__}: {str(exc)[:300]}"}}
            files = {}
            for path in output_paths(result):
                files[path] = (Path(tmp) / path.lstrip("/")).read_bytes()
            return {"result": result, "files": files}


async def in_turn(lock: asyncio.Lock, compute: Compute, model_id: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` for one request of `model_id`: after the model's earlier requests (`lock`), on a compute thread
    (`compute`), with the caller's context (its watch hears why it waits, and its steps)."""
    if lock.locked():
        phase(QUEUED, f"{model_id} is running another request")
    async with lock:  # one request at a time per model, as in the single-process server
        return await finished(compute.submit(fn, *args))


async def finished(work: Future[T]) -> T:
    """Await `work`, a compute thread's future, inside its model's lock. When the awaiting request is cancelled
    (its front timed out or left), work not yet started never runs; work already running cannot be stopped here,
    so the lock is held until it ends: the next request of the model never runs beside it on the same pipeline."""
    waiting = asyncio.wrap_future(work)
    try:
        return await asyncio.shield(waiting)
    except asyncio.CancelledError:
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # read: nothing logs it unread
        if not work.cancel():
            await asyncio.wait([waiting])
        raise


async def pump(answer: asyncio.Future[Any], events: asyncio.Queue[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """A run's progress events as they come ({"progress": ...}), then its answer ({"answer": ...}): every event made
    before the answer is passed on, those still queued when the answer came included (a last step)."""
    while not answer.done() or not events.empty():
        getter = asyncio.ensure_future(events.get())
        await asyncio.wait({answer, getter}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield {"progress": getter.result()}
        else:
            getter.cancel()
    yield {"answer": answer.result()}


def output_paths(result: Any) -> list[str]:
    if not isinstance(result, dict):
        return []
    paths = [result["path"]] if isinstance(result.get("path"), str) else []
    paths += [p for p in result["paths"] if isinstance(p, str)] if isinstance(result.get("paths"), list) else []
    return paths


def late(timeout: float) -> InferenceFailed:
    return InferenceFailed(f"its replica gave no answer within {timeout:g} s (task_timeout)")


def answer_of(response: Any, timeout: float) -> dict[str, Any]:
    """A replica's answer to an unwatched call, within `timeout` seconds; a late one is cancelled."""
    try:
        return response.result(timeout_s=timeout)
    except TimeoutError:  # Serve's own, or Ray's GetTimeoutError (a TimeoutError too)
        response.cancel()
        raise late(timeout) from None


def relay(stream: Any, watch: Watch, timeout: float) -> dict[str, Any]:
    """Pass a replica's progress events on to `watch` until its answer, and return the answer; `timeout` seconds
    in all, as for an unwatched call. Serve's stream has no deadline of its own, so a timer cancels it (the
    replica's generator is closed and its run stops at its next step); a client that leaves does the same
    (`watch.relay` raises Cancelled)."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        stream.cancel()

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        for item in stream:
            if "answer" in item:
                return item["answer"]
            watch.relay(item["progress"])  # raises Cancelled once the client has left
    except Exception:
        if expired.is_set():  # the stream cancelled by the timer: Serve's RequestCancelledError
            raise late(timeout) from None
        raise
    finally:
        timer.cancel()
        stream.cancel()  # a no-op once the stream has ended; else the replica's generator is closed
    if expired.is_set():
        raise late(timeout)
    raise InferenceFailed("the replica's stream ended without an answer")


class RayEngine:
    """Start (or join) Ray, deploy the replicas, and forward each inference by model id."""

    def __init__(self, registry: Registry, device: str, catalog_path: Path, public_dir: Path, *,
                 address: str | None = None, replicas: int = 1, models_per_replica: int = 3,
                 max_pixels: int = 40_000_000, timeout: float = 300.0, max_batch_size: int = 1,
                 batch_wait_ms: float = 5.0, compute_threads: int | None = None, ray: Any = None, serve: Any = None):
        """`ray`, `serve`: Ray's and Ray Serve's APIs (imported when None; tests pass stand-ins)."""
        if ray is None:
            import ray
        if serve is None:
            from ray import serve

        self.ray, self.serve = ray, serve
        self.registry = registry
        self.device = f"ray ({device})"
        self.public_dir = public_dir
        self.timeout = timeout
        self.joined = bool(address)
        self.app_names: list[str] = []
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        serve.start(http_options={"location": "NoServer"})  # the protocol is served by the Flask front
        replica = replica_class(models_per_replica, max_batch_size, batch_wait_ms / 1000, compute_threads, serve)
        cls = serve.deployment(replica, max_ongoing_requests=max(5, 2 * max_batch_size))  # room for a batch to gather
        self.handles: dict[float, Any] = {}
        for share in sorted({self.gpu_share(s, device) for s in registry.specs.values()}):
            name = f"models-gpu{share:g}"
            deployment = cls.options(name=name, num_replicas=replicas,
                                     ray_actor_options={"num_cpus": 0, "num_gpus": share})
            app = deployment.bind(registry.deployment, str(registry.models_dir), str(catalog_path), device, max_pixels)
            self.app_names.append(f"{APP_NAME}-{name}")
            self.handles[share] = serve.run(app, name=self.app_names[-1], route_prefix=None)
        self.device_name = device
        log.info("Ray Serve: %d deployment(s), %d replica(s) each, %d models per replica",
                 len(self.handles), replicas, models_per_replica)

    @staticmethod
    def gpu_share(spec: ModelSpec, device: str) -> float:
        return spec.gpu_fraction if device.startswith("cuda") else 0.0

    def loaded(self) -> dict[str, Any]:
        return {}  # models live in the replicas; Serve's own status tells where

    def infer(self, spec: ModelSpec, inputs: Inputs) -> Any:
        body = dict(inputs.body)
        for key in URL_FIELDS:  # resolved here, under this server's URL policy and public/
            if isinstance(body.get(key), str) and body[key]:
                body[key] = inputs.resource(key).data_uri()
        handle = self.handles[self.gpu_share(spec, self.device_name)].options(multiplexed_model_id=spec.id)
        watch = current()
        if watch is None:
            out = answer_of(handle.infer.remote(body), self.timeout)
        else:  # the replica's progress, passed on as it comes; then its answer
            out = relay(handle.options(stream=True).infer_watched.remote(body), watch, self.timeout)
        batch_size_var.set(out.get("batch", 1))
        error = out.get("error")
        if error:
            if error["kind"] == "bad_request":
                raise BadRequest(error["message"])
            if error["kind"] == "cancelled":
                raise Cancelled(error["message"])
            if error["kind"] == "unavailable":
                raise ModelUnavailable(error["message"])
            raise InferenceFailed(error["message"])
        for path, data in out["files"].items():  # every answer with a result says its files
            if not OUTPUT_PATH.match(path):
                raise InferenceFailed(f"a replica named an output outside images/audios/videos: {path[:100]!r}")
            target = self.public_dir / path.removeprefix("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return out["result"]

    def close(self) -> None:
        """Joined a cluster: remove our applications from it. Started Ray here: stop it, replicas included."""
        try:
            if self.joined:
                for name in self.app_names:
                    self.serve.delete(name)
        finally:
            self.ray.shutdown()
