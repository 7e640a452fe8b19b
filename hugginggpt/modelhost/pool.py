"""Loaded pipelines: lazy loading, one lock per model, least-recently-used eviction under a budget.

Two requests to one model take turns on its lock (no sleep-polling); different models run in parallel.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .registry import ModelSpec, Registry

log = logging.getLogger(__name__)


class ModelUnavailable(Exception):
    """The model is in the registry but its weights are not on disk."""


class InferenceFailed(Exception):
    """The model raised while running a request (reported as a 500 naming the model)."""


@dataclass
class Loaded:
    spec: ModelSpec
    obj: Any
    device: str
    nbytes: int
    load_seconds: float


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


def memory_of(obj: Any) -> int:
    try:
        return sum(p.numel() * p.element_size() for m in torch_modules(obj) for p in m.parameters())
    except Exception:  # noqa: BLE001
        return 0


def load(spec: ModelSpec, registry: Registry, device: str) -> Any:
    """Build the object a handler needs; half precision on CUDA where the pipeline allows it."""
    if spec.loader == "annotator":
        return None
    problem = registry.problem(spec)
    path = registry.weights_path(spec)
    if problem or path is None:
        raise ModelUnavailable(problem or f"weights for {spec.id} are missing")
    import torch

    cuda = device.startswith("cuda")
    dtype = torch.float16 if cuda else None
    where = str(path)
    if spec.loader == "pipeline":
        from transformers import pipeline

        kwargs: dict[str, Any] = {"device": device}
        if dtype is not None and spec.task not in ("automatic-speech-recognition", "audio-classification"):
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
        except (ValueError, OSError):
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
        vocoder = SpeechT5HifiGan.from_pretrained(str(registry.models_dir / (spec.base_model or ""))).to(device).eval()
        voice = path / "speaker_embeddings.npy"  # an x-vector of the target voice; a neutral voice without one
        speaker = (torch.from_numpy(np.load(voice)).float().reshape(1, -1) if voice.is_file()
                   else torch.zeros(1, model.config.speaker_embedding_dim))
        return SpeechT5FeatureExtractor.from_pretrained(where), model, vocoder, speaker.to(device)
    if spec.loader == "controlnet":
        from diffusers import ControlNetModel, StableDiffusionControlNetPipeline

        controlnet = ControlNetModel.from_pretrained(where, torch_dtype=dtype or torch.float32)
        base = str(registry.models_dir / (spec.base_model or ""))
        pipe = StableDiffusionControlNetPipeline.from_pretrained(base, controlnet=controlnet,
                                                                 torch_dtype=dtype or torch.float32)
        return pipe.to(device)
    raise ValueError(f"unknown loader {spec.loader!r} for {spec.id}")


_LOADING = threading.Lock()  # one model loads at a time; loaded models run in parallel


class ModelPool:
    def __init__(self, registry: Registry, device: str = "cpu", budget_bytes: int | None = None):
        self.registry = registry
        self.device = device
        self.budget = budget_bytes
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        self.evictions: list[str] = []
        self.loads = 0  # models loaded since start (GET /metrics)
        self.peak_bytes = 0  # most memory held by loaded models at any time

    def _lock_for(self, model_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model_id, threading.Lock())

    def loaded(self) -> dict[str, Loaded]:
        with self._guard:
            return dict(self._loaded)

    @contextmanager
    def use(self, spec: ModelSpec) -> Iterator[Loaded]:
        lock = self._lock_for(spec.id)
        with lock:
            with self._guard:
                entry = self._loaded.get(spec.id)
                if entry is not None:
                    self._loaded.move_to_end(spec.id)
            if entry is None:
                self._make_room(spec)
                log.info("loading %s (%s) on %s", spec.id, spec.task, self.device)
                t0 = time.perf_counter()
                with _LOADING:  # transformers resolves its names lazily: two first loads at once can see a
                    obj = load(spec, self.registry, self.device)  # half-imported module (ImportError)
                entry = Loaded(spec, obj, self.device, memory_of(obj), time.perf_counter() - t0)
                log.info("loaded %s in %.1fs (%.1f MB)", spec.id, entry.load_seconds, entry.nbytes / 1e6)
                with self._guard:
                    self._loaded[spec.id] = entry
                    self.loads += 1
                    self.peak_bytes = max(self.peak_bytes, sum(e.nbytes for e in self._loaded.values()))
                self._evict(keep=spec.id)  # the size was unknown or larger than the files said
            yield entry

    def _make_room(self, spec: ModelSpec) -> None:
        """The budget is a ceiling: when the new model's size is known, evict before loading it."""
        if self.budget is None:
            return
        size = self.registry.expected_bytes(spec)
        if size:
            self._evict(keep=spec.id, incoming=size)

    def _evict(self, keep: str, incoming: int = 0) -> None:
        """Drop least recently used models (not busy) until the total plus `incoming` fits the budget."""
        if self.budget is None:
            return
        with self._guard:
            order = [mid for mid in self._loaded if mid != keep]
        for mid in order:
            with self._guard:
                total = sum(e.nbytes for e in self._loaded.values())
            if total + incoming <= self.budget:
                return
            lock = self._lock_for(mid)
            if not lock.acquire(blocking=False):
                continue  # in use right now; try the next one
            try:
                with self._guard:
                    self._loaded.pop(mid, None)
                self.evictions.append(mid)
                log.info("evicted %s to stay under the memory budget", mid)
            finally:
                lock.release()
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001
            pass

    def preload(self, specs: list[ModelSpec]) -> None:
        for spec in specs:
            if self.registry.servable(spec):
                with self.use(spec):
                    pass
