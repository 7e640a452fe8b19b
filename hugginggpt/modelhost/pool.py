"""Loaded pipelines: lazy loading, one lock per model, least-recently-used eviction under a budget.

Two requests to one model take turns on its lock (no sleep-polling); different models run in parallel.

Memory: `memory_budget_gb` is a ceiling on what the loaded models take (their parameters, counted in the dtype
they run in: float16 on CUDA takes half of a float32 checkpoint). On CUDA the device's real free memory is asked
too (`free_memory`, torch.cuda.mem_get_info): a model is loaded only when its estimated size (`expected_size`, in
the dtype it will load in) fits both, after evicting idle models, least recently used first. A model in use (its
lock held) is never evicted; when the room cannot be made, the load is refused with `NoRoom` (a 503), and a CUDA
out-of-memory error while loading or running becomes `NoRoom` too, never a crashed server.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import progress
from .compute import Compute, for_device
from .registry import ModelSpec, Registry

log = logging.getLogger(__name__)


class ModelUnavailable(Exception):
    """The model is in the registry but its weights are not on disk."""


class InferenceFailed(Exception):
    """The model raised while running a request (reported as a 500 naming the model)."""


class NoRoom(Exception):
    """The model does not fit in memory now, even with the idle models unloaded (reported as a 503)."""


HEADROOM = 0.2  # on a device with a free-memory reading, room for activations beyond the weights' size


@dataclass
class Loaded:
    spec: ModelSpec
    obj: Any
    device: str
    nbytes: int
    load_seconds: float
    dtype: str | None = None  # of the model's first parameter: what it really runs in
    weights_device: str | None = None  # where that parameter really is ("cuda:0", "cpu")
    device_bytes: int | None = None  # device memory the load took (CUDA: torch.cuda.memory_allocated before/after)


def torch_modules(obj: Any) -> list[Any]:
    import torch

    found, seen = [], set()

    def visit(x: Any, depth: int = 0) -> None:
        if x is None or id(x) in seen or depth > 3:
            return
        seen.add(id(x))
        if isinstance(x, torch.nn.Module):
            found.append(x)
            return
        if isinstance(x, (tuple, list)):
            for y in x:
                visit(y, depth + 1)
            return
        for name in ("model", "components", "_first_module"):
            y = getattr(x, name, None)
            if isinstance(y, dict):
                for z in y.values():
                    visit(z, depth + 1)
            elif y is not None:
                visit(y, depth + 1)

    visit(obj)
    return found


def amount(nbytes: float) -> str:
    """Bytes for a person: 12.3 GB, 456 MB, 89 kB."""
    if abs(nbytes) >= 1e9:
        return f"{nbytes / 1e9:.1f} GB"
    return f"{nbytes / 1e6:.0f} MB" if abs(nbytes) >= 1e6 else f"{nbytes / 1e3:.0f} kB"


def describe(obj: Any) -> tuple[str | None, str | None]:
    """The dtype and device of the model's first parameter, as text; (None, None) for a model without any."""
    try:
        for module in torch_modules(obj):
            for param in module.parameters():
                return str(param.dtype).removeprefix("torch."), str(param.device)
    except Exception:  # noqa: BLE001
        pass
    return None, None


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's CUDA out-of-memory error (a RuntimeError subclass in every torch we serve)."""
    try:
        import torch
    except ImportError:
        return False
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or "CUDA out of memory" in str(exc)


def memory_of(obj: Any) -> int:
    try:
        return sum(p.numel() * p.element_size() for m in torch_modules(obj) for p in m.parameters())
    except Exception:  # noqa: BLE001
        return 0


def _base(spec: ModelSpec, registry: Registry) -> str:
    """The folder of the model a ControlNet or a voice converter plugs into (its catalog entry names it)."""
    if not spec.base_model:
        raise ValueError(f"{spec.id}: the {spec.loader} loader needs `base_model` in its catalog entry")
    return str(registry.models_dir / spec.base_model)


# Pipelines that stay in float32 on CUDA: the audio front ends, and depth estimation, whose depth map is a regression
# output normalised to a grey image (in float16 a small-valued map underflows to all zeros: a black image).
FULL_PRECISION_TASKS = frozenset({"automatic-speech-recognition", "audio-classification", "depth-estimation"})
HALF_PRECISION_LOADERS = frozenset({"pipeline", "diffusers", "controlnet"})  # the loaders that take a dtype


def half_precision(spec: ModelSpec, device: str) -> bool:
    """Whether `load` puts this model in float16 on this device: on CUDA, for the loaders that take a dtype, except
    the pipelines of FULL_PRECISION_TASKS."""
    return (device.startswith("cuda") and spec.loader in HALF_PRECISION_LOADERS
            and not (spec.loader == "pipeline" and spec.task in FULL_PRECISION_TASKS))


def expected_size(spec: ModelSpec, registry: Registry, device: str) -> int | None:
    """What the model's parameters will take once loaded on `device`, in the dtype `load` gives it (the budget's
    count): float16 on CUDA takes half of a float32 checkpoint. None when unknown before loading."""
    return registry.expected_bytes(spec, half=half_precision(spec, device))


def load(spec: ModelSpec, registry: Registry, device: str) -> Any:
    """Build the object a handler needs; half precision on CUDA where the pipeline allows it (`half_precision`)."""
    if spec.loader == "annotator":
        return None
    problem = registry.problem(spec)
    path = registry.weights_path(spec)
    if problem or path is None:
        raise ModelUnavailable(problem or f"weights for {spec.id} are missing")
    import torch

    dtype = torch.float16 if half_precision(spec, device) else None
    where = str(path)
    if spec.loader == "pipeline":
        from transformers import pipeline

        kwargs: dict[str, Any] = {"device": device}
        if dtype is not None:
            kwargs["dtype"] = dtype
        return pipeline(spec.pipeline_task, model=where, **kwargs)
    if spec.loader == "controlnet-aux":  # JARVIS's hed / mlsd / openpose annotators, from lllyasviel/Annotators
        import controlnet_aux

        detector = {"hed-control": controlnet_aux.HEDdetector, "mlsd-control": controlnet_aux.MLSDdetector,
                    "openpose-control": controlnet_aux.OpenposeDetector}[spec.task]
        return detector.from_pretrained(where).to(device)
    if spec.loader == "depth-normals":  # a depth model whose map the handler turns into surface normals
        from transformers import pipeline

        return pipeline("depth-estimation", model=where, device=device)
    if spec.loader == "seq2seq":
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        return AutoTokenizer.from_pretrained(where), AutoModelForSeq2SeqLM.from_pretrained(where).to(device).eval()
    if spec.loader == "extractive-qa":
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        return AutoTokenizer.from_pretrained(where), AutoModelForQuestionAnswering.from_pretrained(where).to(device).eval()
    if spec.loader == "sentence-embedding":
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(where, device=device)
    if spec.loader == "vision2seq":
        from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

        try:
            model = VisionEncoderDecoderModel.from_pretrained(where)
            return AutoImageProcessor.from_pretrained(where), AutoTokenizer.from_pretrained(where), model.to(device).eval()
        except Exception:  # noqa: BLE001 - not an encoder-decoder checkpoint (BLIP, GIT, ...): a config error
            from transformers import AutoModelForImageTextToText, AutoProcessor

            proc = AutoProcessor.from_pretrained(where)
            return proc, proc, AutoModelForImageTextToText.from_pretrained(where).to(device).eval()
    if spec.loader == "vqa":
        from transformers import AutoModelForVisualQuestionAnswering, AutoProcessor

        return AutoProcessor.from_pretrained(where), AutoModelForVisualQuestionAnswering.from_pretrained(where).to(device).eval()
    if spec.loader == "diffusers":
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(where, torch_dtype=dtype or torch.float32)
        return pipe.to(device)
    if spec.loader == "speecht5-vc":
        import numpy as np
        from transformers import SpeechT5FeatureExtractor, SpeechT5ForSpeechToSpeech, SpeechT5HifiGan

        model = SpeechT5ForSpeechToSpeech.from_pretrained(where).to(device).eval()
        vocoder = SpeechT5HifiGan.from_pretrained(_base(spec, registry)).to(device).eval()
        voice = path / "speaker_embeddings.npy"  # an x-vector of the target voice; a neutral voice without one
        speaker = (torch.from_numpy(np.load(voice)).float().reshape(1, -1) if voice.is_file()
                   else torch.zeros(1, model.config.speaker_embedding_dim))
        return SpeechT5FeatureExtractor.from_pretrained(where), model, vocoder, speaker.to(device)
    if spec.loader == "controlnet":
        from diffusers import ControlNetModel, StableDiffusionControlNetPipeline

        base = _base(spec, registry)
        controlnet = ControlNetModel.from_pretrained(where, torch_dtype=dtype or torch.float32)
        pipe = StableDiffusionControlNetPipeline.from_pretrained(base, controlnet=controlnet,
                                                                 torch_dtype=dtype or torch.float32)
        return pipe.to(device)
    raise ValueError(f"unknown loader {spec.loader!r} for {spec.id}")


_LOADING = threading.Lock()  # one model loads at a time; loaded models run in parallel


class ModelPool:
    def __init__(self, registry: Registry, device: str = "cpu", budget_bytes: int | None = None,
                 free_memory: Callable[[], int] | None = None, compute: Compute | None = None):
        """free_memory: bytes the device can still give (None: the budget's accounting alone, as on the CPU);
        `free_memory_reader(device)` on CUDA. Tests inject their own reading. compute: the threads that load and
        run models (compute.py; default: the device's default count)."""
        self.registry = registry
        self.device = device
        self.compute = compute or for_device(device)
        self.budget = budget_bytes
        self.free_memory = free_memory
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self.evictions: list[str] = []
        self.loads = 0  # models loaded since start (GET /metrics)
        self.peak_bytes = 0  # most memory held by loaded models at any time
        self.freed: dict[str, int] = {}  # CUDA: device memory that came back when each model was last evicted

    def _lock_for(self, model_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model_id, threading.Lock())

    def loaded(self) -> dict[str, Loaded]:
        with self._guard:
            return dict(self._loaded)

    def memory(self) -> dict[str, Any]:
        """What the loaded models take by count, the budget, and the device's own reading (device.py)."""
        from .device import memory_report

        with self._guard:
            used = sum(e.nbytes for e in self._loaded.values())
        return {"models_bytes": used, "budget_bytes": self.budget, **memory_report(self.device),
                **({"freed_on_eviction_bytes": dict(self.freed)} if self.freed else {})}

    def _use(self, spec: ModelSpec) -> Iterator[Loaded]:
        lock = self._lock_for(spec.id)
        with progress.waiting_for(lock, f"{spec.id} is running another request"):
            with self._guard:
                entry = self._loaded.get(spec.id)
                if entry is not None:
                    self._loaded.move_to_end(spec.id)
            if entry is None:
                entry = self._load(spec)
            try:
                yield entry
            except Exception as exc:
                if is_out_of_memory(exc):  # the activations did not fit: say so, give the cache back, keep serving
                    raise self.out_of_memory(spec) from None
                raise

    use = contextmanager(_use)  # wrapped, not decorated: mutmut skips decorated functions

    def out_of_memory(self, spec: ModelSpec) -> NoRoom:
        """The refusal for a request that ran out of device memory; the allocator's cache is given back first."""
        self._release_cache()
        return NoRoom(f"{spec.id} ran out of memory on {self.device} while running this request; try again with "
                      "a smaller input or when other models are idle")

    def _load(self, spec: ModelSpec) -> Loaded:
        """Make room (or refuse with NoRoom), then load; an out-of-memory error evicts every idle model and
        tries once more."""
        self._make_room(spec)
        log.info("loading %s (%s) on %s", spec.id, spec.task, self.device)
        for attempt in (1, 2):
            t0 = time.perf_counter()
            try:
                with progress.waiting_for(_LOADING, "another model is loading"):  # transformers resolves its names
                    progress.phase(progress.LOADING)  # lazily: two first loads at once can see a
                    before = self._allocated()  # half-imported module (ImportError); one load at a time also
                    obj = self.compute.run(load, spec, self.registry, self.device,  # keeps the memory it takes its own
                                           resume=progress.LOADING)
                    after = self._allocated()
                break
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                self._release_cache()
                if attempt == 2 or not self._evict_idle():
                    raise NoRoom(f"{spec.id} does not fit in the memory of {self.device} (out of memory while "
                                 f"loading){self._busy_note()}") from None
        dtype, where = describe(obj)
        entry = Loaded(spec, obj, self.device, memory_of(obj), time.perf_counter() - t0, dtype, where,
                       after - before if before is not None else None)  # one device: both readings or neither
        log.info("loaded %s in %.1fs (%.1f MB, %s on %s)", spec.id, entry.load_seconds, entry.nbytes / 1e6,
                 dtype, where)
        with self._guard:
            self._loaded[spec.id] = entry
            self.loads += 1
            self.peak_bytes = max(self.peak_bytes, sum(e.nbytes for e in self._loaded.values()))
        # the size was unknown or larger than the files said; the new model is spared by `keep` and by its own
        self._evict(keep=spec.id)  # pragma: no mutate: lock too, held while it loads (_drop leaves a model in use)
        return entry

    def _allocated(self) -> int | None:
        if not self.device.startswith("cuda"):
            return None
        import torch

        return int(torch.cuda.memory_allocated(self.device))

    def _busy_note(self) -> str:
        """The loaded models in use now (the model being loaded is not among them yet)."""
        busy = [mid for mid in self._lru_order() if self._lock_for(mid).locked()]
        return f"; in use now: {', '.join(busy)}; try again when they finish" if busy else ""

    def _make_room(self, spec: ModelSpec) -> None:
        """Before loading: evict idle models until the model's estimated size fits the budget and, where the
        device reports its free memory, the device; refuse with NoRoom when it cannot fit."""
        size = expected_size(spec, self.registry, self.device)  # in the dtype it loads in, as `nbytes` counts it
        if not size:
            return  # unknown: loaded, then measured (_evict after the load)
        if self.budget is not None:
            self._evict(incoming=size)
            with self._guard:
                total = sum(e.nbytes for e in self._loaded.values() if e.spec.id != spec.id)
            if total + size > self.budget:
                if not total:
                    raise NoRoom(f"{spec.id} needs about {amount(size)}, more than memory_budget_gb allows "
                                 f"({amount(self.budget)})")
                left = max(0, self.budget - total)  # pragma: no mutate: amount() reads 0 and 1 byte alike, "0 kB"
                raise NoRoom(f"{spec.id} needs about {amount(size)} and memory_budget_gb leaves {amount(left)}"
                             f"{self._busy_note()}")
        if self.free_memory is None:
            return
        need = int(size * (1 + HEADROOM))
        while True:
            free = self.free_memory()
            if free >= need:
                return
            if not self._evict_one():
                raise NoRoom(f"{spec.id} needs about {amount(need)} on {self.device} (weights and room to run) "
                             f"and the device has {amount(free)} free{self._busy_note()}")

    def _lru_order(self, keep: str | None = None) -> list[str]:
        """The loaded models (other than `keep`), least recently used first."""
        with self._guard:
            return [mid for mid in self._loaded if mid != keep]

    def _evict_one(self) -> bool:
        """Evict the least recently used idle model; False when every loaded model is in use."""
        return any(self._drop(mid) for mid in self._lru_order())

    def _drop(self, mid: str) -> bool:
        """Evict `mid` unless it is in use, and give its memory back to the device (what came back is measured
        on CUDA: `freed`)."""
        lock = self._lock_for(mid)
        if not lock.acquire(blocking=False):
            return False  # in use right now
        try:
            before = self._allocated()
            with self._guard:
                if self._loaded.pop(mid, None) is None:
                    return False
            self.evictions.append(mid)
        finally:
            lock.release()
        self._release_cache()
        after = self._allocated()
        if before is not None and after is not None:  # pragma: no mutate: one device gives both readings or neither
            self.freed[mid] = before - after
            log.info("evicted %s to make room (%s back on %s)", mid, amount(before - after), self.device)
        else:
            log.info("evicted %s to make room", mid)
        return True

    def _release_cache(self) -> None:
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def _evict(self, incoming: int = 0, keep: str | None = None) -> None:
        """Drop idle models (not `keep`), least recently used first, until the total plus `incoming` fits the
        budget; nothing without a budget."""
        if self.budget is None:
            return
        for mid in self._lru_order(keep):  # pragma: no mutate: `keep` is the model just loaded, in use (see _load)
            with self._guard:
                total = sum(e.nbytes for e in self._loaded.values())
            if total + incoming <= self.budget:
                return
            self._drop(mid)

    def _evict_idle(self) -> bool:
        """Drop every idle model (out of memory while loading); True when one was dropped."""
        return bool([mid for mid in self._lru_order() if self._drop(mid)])

    def preload(self, specs: list[ModelSpec]) -> None:
        for spec in specs:
            if self.registry.servable(spec):
                with self.use(spec):
                    pass
