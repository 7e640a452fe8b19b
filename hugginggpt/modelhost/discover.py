"""Models nobody listed by hand: a Hub model the local server downloads on first use and runs (issue 17, item 4).

A model id outside the curated catalog is served when the config says `discovered_models: local`, its author
passes `discovered_authors_allow` / `discovered_authors_deny`, and the Hub's facts about it allow a generic,
code-free loader:

- library + pipeline tag map to a loader the pool already has (`GENERIC_LOADERS`): Transformers `pipeline(task)`
  or the Auto* classes the handlers of that task family expect, Sentence Transformers, Diffusers
  `DiffusionPipeline` for text-to-image;
- it is not gated, needs no `trust_remote_code` (no `auto_map` in its configs, no `custom_code` tag, a Diffusers
  pipeline made only of Diffusers / Transformers classes), and its weights fit `max_model_size_mb` when set.

The download (`snapshot_download`, only what a pipeline reads: configs, tokenizer files, safetensors; `.bin`
only where no safetensors exist; never onnx / flax / tf / code) goes to `<local_models_dir>/<owner>/<name>` in
two steps: the small files first, checked again for `auto_map`, then the weights. A marker file written last
says the folder is complete; concurrent first requests for one model download it once (one lock per model).
Model ids come from requests: they must match the Hub's grammar before they touch the disk or a URL.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from . import progress
from .registry import ModelSpec

log = logging.getLogger(__name__)

MODES = ("hosted", "local", "off")
MARKER = ".hugginggpt-discovered.json"
MAX_NAME = 96  # the Hub's limit for an owner or a repository name
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?", re.ASCII)


def name_problem(name: str, what: str) -> str | None:
    """Why one part of a Hub id (owner or repository name) is not valid, or None."""
    if not isinstance(name, str) or not name:
        return f"the {what} is empty"
    if len(name) > MAX_NAME:
        return f"the {what} is longer than {MAX_NAME} characters"
    if not _NAME.fullmatch(name):
        return f"the {what} may only hold letters, digits, '-', '_' and '.', and must start and end with a letter or digit"
    if ".." in name or "--" in name:
        return f"the {what} may not contain '..' or '--'"
    return None


def id_problem(model_id: Any) -> str | None:
    """Why a model id is not a Hub model id `owner/name` (checked before it touches the disk or a URL), or None."""
    if not isinstance(model_id, str) or len(model_id) > 2 * MAX_NAME + 1:
        return "a model id is `owner/name`, at most 193 characters"
    parts = model_id.split("/")
    if len(parts) != 2:
        return "a model id is `owner/name`: one '/', no leading '/' and no deeper path"
    return name_problem(parts[0], "owner") or name_problem(parts[1], "name")


@dataclass(frozen=True)
class GenericLoader:
    task: str  # the planner's task type (and the handler family)
    loader: str  # a loader of pool.load
    pipeline_task: str | None = None


_T = "transformers"
GENERIC_LOADERS: dict[tuple[str, str], GenericLoader] = {
    **{(_T, t): GenericLoader(t, "pipeline", t) for t in (
        "token-classification", "text-classification", "text-generation", "image-classification", "object-detection",
        "image-segmentation", "depth-estimation", "document-question-answering", "automatic-speech-recognition",
        "audio-classification")},
    **{(_T, t): GenericLoader(t, "seq2seq") for t in ("summarization", "translation", "text2text-generation")},
    (_T, "question-answering"): GenericLoader("question-answering", "extractive-qa"),
    (_T, "image-to-text"): GenericLoader("image-to-text", "vision2seq"),
    (_T, "visual-question-answering"): GenericLoader("visual-question-answering", "vqa"),
    (_T, "text-to-speech"): GenericLoader("text-to-speech", "pipeline", "text-to-audio"),
    (_T, "text-to-audio"): GenericLoader("text-to-speech", "pipeline", "text-to-audio"),
    ("sentence-transformers", "sentence-similarity"): GenericLoader("sentence-similarity", "sentence-embedding"),
    ("diffusers", "text-to-image"): GenericLoader("text-to-image", "diffusers"),
}

WEIGHT_SUFFIXES = (".safetensors", ".bin")
SMALL_SUFFIXES = (".json", ".txt", ".model", ".spm", ".tiktoken")
SKIPPED_FOLDERS = {"onnx", "openvino", "coreml", "tflite", "tf", "flax", "ggml", "gguf", "runs", "logs", "checkpoints"}
_VARIANT = re.compile(r"\.(fp16|bf16|fp32|ema|non_ema)\.(safetensors|bin)$")
_BIN_WEIGHTS = re.compile(r"^(pytorch_model|diffusion_pytorch_model|model)(-\d{5}-of-\d{5})?\.bin$")
_ST_MODULE = re.compile(r"^\d+_[A-Za-z]\w*$")  # sentence-transformers module folders: 1_Pooling, 2_Dense


def is_weight(name: str) -> bool:
    return name.endswith(WEIGHT_SUFFIXES)


def select_files(names: Iterable[str], library: str) -> list[str]:
    """The files a generic pipeline of this library reads, out of a repository's file list."""
    kept = []
    for name in names:
        path = PurePosixPath(name)
        parts = path.parts
        hidden = any(p.startswith(".") or p in SKIPPED_FOLDERS for p in parts)  # ".." starts with a dot too
        if hidden or not name.endswith(WEIGHT_SUFFIXES + SMALL_SUFFIXES):
            continue
        if library == "diffusers":  # model_index.json at the top, each component in its own folder
            if len(parts) > 2 or (len(parts) == 1 and not name.endswith(".json")):
                continue
        elif len(parts) > 2 or (len(parts) == 2 and not (library == "sentence-transformers"
                                                          and _ST_MODULE.match(parts[0]))):
            continue
        kept.append(name)
    chosen = []
    for name in kept:
        folder, base = str(PurePosixPath(name).parent), PurePosixPath(name).name
        if not is_weight(name):
            chosen.append(name)
            continue
        siblings = [k for k in kept if str(PurePosixPath(k).parent) == folder and is_weight(k)]
        if name.endswith(".bin") and (any(k.endswith(".safetensors") for k in siblings)
                                      or not _BIN_WEIGHTS.match(_VARIANT.sub(r".\2", base))):
            continue  # .bin only where no safetensors exist, and only the model's own weights (not training_args)
        if _VARIANT.search(base) and any(not _VARIANT.search(PurePosixPath(k).name) for k in siblings):
            continue  # an fp16 / ema copy of weights the folder also has plainly
        chosen.append(name)
    return sorted(chosen)


def _has_key(value: Any, key: str, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(value, dict):
        return key in value or any(_has_key(v, key, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_has_key(v, key, depth + 1) for v in value)
    return False


def remote_code_in_files(folder: Path, names: Iterable[str]) -> str | None:
    """Which downloaded config asks for code from the repository (`auto_map`), or None."""
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            data = json.loads((folder / name).read_bytes())  # UTF-8, -16 or -32, as JSON allows
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "auto_map" in data:
            return f"its {name} has `auto_map`: it runs code from the repository (trust_remote_code), never done here"
    return None


def diffusers_components_problem(folder: Path) -> str | None:
    """A Diffusers pipeline whose model_index.json names classes outside Diffusers / Transformers, or None."""
    try:
        index = json.loads((folder / "model_index.json").read_bytes())
    except (OSError, ValueError):
        return "it has no readable model_index.json, which a Diffusers pipeline needs"
    import diffusers

    pipeline = index.get("_class_name") if isinstance(index, dict) else None  # a list or a number: no class named
    if pipeline is None or not hasattr(diffusers, str(pipeline)):
        return f"its pipeline class {pipeline!r} is not a Diffusers class (custom pipeline code)"
    for name, value in index.items():
        if name.startswith("_") or value is None or value == [None, None]:
            continue
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            return f"its component {name!r} is not a [library, class] pair"
        library = value[0]
        if library in ("diffusers", "transformers"):
            continue
        if not (library.isidentifier() and importlib.util.find_spec(f"diffusers.pipelines.{library}")):
            return f"its component {name!r} comes from {library!r}, not Diffusers or Transformers (custom code)"
    return None


class DiscoveryRefused(Exception):
    """A model the server will not discover; `status` is the HTTP status, `kind` a stable word for clients."""

    def __init__(self, message: str, status: int = 422, kind: str = "not_servable"):
        super().__init__(message)
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class DiscoveryPolicy:
    mode: str = "hosted"  # hosted | local | off: only `local` lets this server download and run Hub models
    allow: tuple[str, ...] = ()  # authors / orgs; empty: every author not denied
    deny: tuple[str, ...] = ()  # authors / orgs never served; wins over `allow`
    max_size_mb: float | None = None  # weight files larger than this are refused

    def author_problem(self, model_id: str) -> str | None:
        author = model_id.split("/")[0].casefold()
        if author in {a.casefold() for a in self.deny}:
            return f"{model_id}: its author {model_id.split('/')[0]!r} is on discovered_authors_deny"
        if self.allow and author not in {a.casefold() for a in self.allow}:
            return (f"{model_id}: its author {model_id.split('/')[0]!r} is not on discovered_authors_allow "
                    f"({', '.join(self.allow)})")
        return None


@dataclass(frozen=True)
class HubModel:
    """What the Hub says about a model this server may serve: its spec, pinned commit and the files to fetch."""

    spec: ModelSpec
    sha: str
    library: str
    pipeline_tag: str
    weight_bytes: int | None


@dataclass
class Received:
    """Bytes of weights a download has received so far, of the total it knows of (which grows as it finds files);
    the small files (configs, tokenizers) come first and are not counted."""

    bytes: int = 0
    total: int = 0

    def said(self) -> str:
        if not self.bytes:
            return "before any weights arrived"
        of = f" of {self.total / 1e6:.1f}" if self.total else ""
        return f"after {self.bytes / 1e6:.1f}{of} MB of weights"


def unfinished(folder: Path, files: Iterable[str], shown: int = 3) -> str:
    """Which of a model's files a failed download left missing (the repository's names, as the Hub lists them:
    huggingface_hub puts a file in place only once it is whole), for the failure's message; "" when none."""
    missing = [f for f in files if not (folder / f).is_file()]
    if not missing:
        return ""
    more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
    return f", with {', '.join(missing[:shown])}{more} not downloaded"


class _LoggedProgress:
    """A tqdm class for snapshot_download that logs byte progress every few seconds instead of drawing bars."""

    model_id = "?"
    every = 5.0

    @classmethod
    def for_model(cls, model_id: str, seen: Received | None = None) -> type:
        """seen: where the bytes so far are kept (a failed download says how far it got)."""
        from tqdm import tqdm

        class Progress(tqdm):
            def __init__(self, *args: Any, **kwargs: Any):
                kwargs.pop("name", None)
                kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed with the bar
                kwargs["disable"] = False
                super().__init__(*args, **kwargs)
                self._logged = time.monotonic()
                # made in the downloading request's thread, updated from huggingface_hub's worker threads
                self._watch = progress.current() if seen is not None else None  # the weights' bytes only

            def update(self, n: float | None = 1) -> bool | None:
                out = super().update(n)
                if self.unit != "B" or str(self.desc).startswith("Reconstruct"):  # the bytes received, once
                    return out
                if seen is not None:
                    seen.bytes, seen.total = int(self.n), int(self.total or 0)
                if self._watch is not None:
                    self._watch.downloaded(int(self.n), int(self.total) if self.total else None)
                now = time.monotonic()
                # every few seconds (the start and the end are logged by Discovery itself)
                if self.total and now - self._logged >= cls.every:
                    self._logged = now
                    log.info("%s: %.1f of %.1f MB downloaded", model_id, self.n / 1e6, self.total / 1e6)
                return out

            def close(self) -> None:
                stream = self.fp
                super().close()
                try:
                    stream.close()
                except Exception:  # noqa: BLE001
                    pass

        return Progress


Downloader = Callable[..., Any]


class Discovery:
    """Hub models this server may serve: judge (cached Hub info), download once, list what is on disk."""

    def __init__(self, policy: DiscoveryPolicy, models_dir: Path, *, endpoint: str | None = None,
                 token: str | None = None, curated_ids: Iterable[str] = (), info_ttl: float = 600.0,
                 error_ttl: float = 30.0, timeout: float = 10.0, downloader: Downloader | None = None,
                 max_cached: int = 2048):
        self.policy = policy
        self.models_dir = Path(models_dir)
        self.endpoint = endpoint  # None: huggingface_hub's default, which honours HF_ENDPOINT
        self.token = token
        self.curated = frozenset(curated_ids)
        self.info_ttl, self.error_ttl, self.timeout = info_ttl, error_ttl, timeout
        self._download = downloader
        self._max_cached = max_cached
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._verdicts: OrderedDict[str, tuple[float, HubModel | DiscoveryRefused]] = OrderedDict()
        self.active: set[str] = set()  # ids being downloaded now
        self.downloads = 0  # completed downloads (a test's and an operator's counter)

    @property
    def enabled(self) -> bool:
        return self.policy.mode == "local"

    # -- what may be served -------------------------------------------------------------------------------

    def folder(self, model_id: str) -> Path:
        """`<models_dir>/<owner>/<name>` for a valid id; never outside models_dir."""
        problem = id_problem(model_id)
        if problem:
            raise DiscoveryRefused(f"bad model id {model_id[:200]!r}: {problem}", 400, "bad_model_id")
        root = self.models_dir.resolve()
        target = (root / model_id).resolve()
        if root not in target.parents:
            raise DiscoveryRefused(f"bad model id {model_id!r}: it leaves the models folder", 400, "bad_model_id")
        return target

    def check_policy(self, model_id: str) -> None:
        """Raise DiscoveryRefused unless this server may consider the id at all (no Hub call, no disk)."""
        if not self.enabled:
            raise DiscoveryRefused(f"unknown model {model_id!r}: discovered_models is {self.policy.mode!r} on this "
                                   "server (set it to local to run Hub models here)", 404, "not_enabled")
        self.folder(model_id)
        if model_id in self.curated:
            raise DiscoveryRefused(f"{model_id} is in the curated catalog at another deployment level; see GET /models",
                                   404, "curated_elsewhere")
        problem = self.policy.author_problem(model_id)
        if problem:
            raise DiscoveryRefused(problem, 403, "author_denied")

    def on_disk(self, model_id: str) -> ModelSpec | None:
        """The spec of a discovered model whose download completed, or None."""
        try:
            folder = self.folder(model_id)
            marker = json.loads((folder / MARKER).read_bytes())
            spec = ModelSpec(id=model_id, task=marker["task"], loader=marker["loader"], level="standard",
                             pipeline_task=marker.get("pipeline_task"), files=tuple(marker["files"]), source="hub")
        except (DiscoveryRefused, OSError, ValueError, KeyError, TypeError):
            return None
        if marker.get("id") != model_id or not all((folder / f).is_file() for f in spec.files):
            return None
        return spec

    def listed(self) -> list[ModelSpec]:
        """Discovered models on disk (complete downloads), whatever the policy says now."""
        found = []
        if self.models_dir.is_dir():
            for marker in sorted(self.models_dir.glob(f"*/*/{MARKER}")):
                spec = self.on_disk(f"{marker.parent.parent.name}/{marker.parent.name}")
                if spec is not None:
                    found.append(spec)
        return found

    def hub_model(self, model_id: str) -> HubModel:
        """The Hub's facts judged (cached for info_ttl; refusals too, Hub errors for error_ttl)."""
        now = time.monotonic()
        with self._guard:
            hit = self._verdicts.get(model_id)
            if hit and hit[0] > now:
                self._verdicts.move_to_end(model_id)
                verdict = hit[1]
                if isinstance(verdict, DiscoveryRefused):
                    raise verdict
                return verdict
        try:
            verdict: HubModel | DiscoveryRefused = self._judge(model_id)
        except DiscoveryRefused as exc:
            verdict = exc
        ttl = self.error_ttl if isinstance(verdict, DiscoveryRefused) and verdict.status >= 500 else self.info_ttl
        self._remember(model_id, verdict, ttl)
        if isinstance(verdict, DiscoveryRefused):
            raise verdict
        return verdict

    def _remember(self, model_id: str, verdict: HubModel | DiscoveryRefused, ttl: float) -> None:
        with self._guard:
            self._verdicts[model_id] = (time.monotonic() + ttl, verdict)
            self._verdicts.move_to_end(model_id)
            while len(self._verdicts) > self._max_cached:
                self._verdicts.popitem(last=False)  # pragma: no mutate: the least recently asked (None pops it too)

    def _judge(self, model_id: str) -> HubModel:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

        try:
            info = HfApi(endpoint=self.endpoint, token=self.token).model_info(model_id, files_metadata=True,
                                                                               timeout=self.timeout)
        except GatedRepoError:
            raise DiscoveryRefused(f"{model_id} is gated on the Hub: accept its terms there and add it to the "
                                   "curated catalog instead", 403, "gated") from None
        except RepositoryNotFoundError:
            raise DiscoveryRefused(f"{model_id} is not a model on the Hub (or it is private to another account)",
                                   404, "not_on_hub") from None
        except HfHubHTTPError as exc:
            raise DiscoveryRefused(f"the Hub answered HTTP {exc.response.status_code} for {model_id}", 502,
                                   "hub_error") from None
        except Exception as exc:  # noqa: BLE001 - offline, DNS, timeout: the Hub cannot be asked now
            raise DiscoveryRefused(f"the Hub cannot be reached to look up {model_id} ({exc.__class__.__name__})", 502,
                                   "hub_unreachable") from None
        if info.gated:
            raise DiscoveryRefused(f"{model_id} is gated on the Hub ({info.gated}): its terms must be accepted by a "
                                   "person, so it is not downloaded automatically", 403, "gated")
        if info.disabled or info.private:
            raise DiscoveryRefused(f"{model_id} is {'disabled' if info.disabled else 'private'} on the Hub", 403,
                                   "not_public")
        library, tag = info.library_name or "", info.pipeline_tag or ""
        generic = GENERIC_LOADERS.get((library, tag))
        if generic is None:
            known = sorted({f"{lib}/{t}" for lib, t in GENERIC_LOADERS})
            raise DiscoveryRefused(f"{model_id} is a {library or 'no-library'} model for {tag or 'no pipeline tag'}, "
                                   f"which has no generic loader here (loadable: {', '.join(known)})", 422,
                                   "no_generic_loader")
        if "custom_code" in (info.tags or ()) or _has_key(info.config or {}, "auto_map"):
            raise DiscoveryRefused(f"{model_id} needs code from its repository (`auto_map` / custom_code): "
                                   "trust_remote_code is never used here", 422, "remote_code")
        sizes = {s.rfilename: s.size for s in info.siblings or []}
        files = select_files(sizes, library)
        weights = [f for f in files if is_weight(f)]
        if not weights:
            raise DiscoveryRefused(f"{model_id} has no safetensors or PyTorch weights a pipeline can read", 422,
                                   "no_weights")
        known_sizes = [sizes[f] for f in weights if sizes.get(f) is not None]
        weight_bytes = sum(known_sizes) if len(known_sizes) == len(weights) else None
        cap = self.policy.max_size_mb
        if cap is not None:
            if weight_bytes is None:
                raise DiscoveryRefused(f"{model_id}: the Hub does not give its weights' size, and max_model_size_mb "
                                       f"({cap:g}) is set", 422, "size_unknown")
            if weight_bytes > cap * 1024 * 1024:
                raise DiscoveryRefused(f"{model_id}: its weights are {weight_bytes / 2**20:.0f} MB, over "
                                       f"max_model_size_mb ({cap:g})", 422, "too_large")
        if not info.sha:
            raise DiscoveryRefused(f"the Hub gave no commit for {model_id}", 502, "hub_error")
        spec = ModelSpec(id=model_id, task=generic.task, loader=generic.loader, level="standard",
                         pipeline_task=generic.pipeline_task, files=tuple(files), source="hub")
        return HubModel(spec, info.sha, library, tag, weight_bytes)

    def status(self, model_id: str) -> dict[str, Any]:
        """`/status` of a model outside the catalog, without downloading anything."""
        try:
            self.check_policy(model_id)
            if self.on_disk(model_id) is not None:
                return {"loaded": True, "loadable": True, "discovered": True}
            found = self.hub_model(model_id)
        except DiscoveryRefused as exc:
            return {"loaded": False, "loadable": False, "discovered": True, "problem": str(exc), "kind": exc.kind}
        out: dict[str, Any] = {"loaded": False, "loadable": True, "discovered": True, "task": found.spec.task}
        if found.weight_bytes is not None:
            out["size_mb"] = round(found.weight_bytes / 2**20, 1)
        if model_id in self.active:
            out["downloading"] = True
        return out

    # -- download once -----------------------------------------------------------------------------------

    def _lock_for(self, model_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model_id, threading.Lock())

    def ensure(self, model_id: str) -> ModelSpec:
        """The spec of a model ready on disk, downloading it first if needed; raises DiscoveryRefused."""
        self.check_policy(model_id)
        spec = self.on_disk(model_id)
        if spec is not None:
            return spec
        found = self.hub_model(model_id)  # refusals end here, before a lock exists for the id
        with progress.waiting_for(self._lock_for(model_id), f"another request is downloading {model_id}"):
            spec = self.on_disk(model_id)
            if spec is None:
                self._fetch(found)
                spec = self.on_disk(model_id)
        if spec is None:
            raise DiscoveryRefused(f"{model_id} was downloaded but its files are not all in "
                                   f"{self.folder(model_id)}", 500, "download_failed")
        return spec

    def _snapshot(self, model_id: str, sha: str, files: list[str], folder: Path, seen: Received | None = None) -> None:
        if not files:
            return
        download = self._download
        if download is None:
            from huggingface_hub import snapshot_download as download
        literal = [re.sub(r"([\[\]*?])", r"[\1]", f) for f in files]  # names, not glob patterns
        download(repo_id=model_id, revision=sha, local_dir=str(folder), allow_patterns=literal,
                 endpoint=self.endpoint, token=self.token, tqdm_class=_LoggedProgress.for_model(model_id, seen))

    def _fetch(self, found: HubModel) -> None:
        spec = found.spec
        folder = self.folder(spec.id)
        small = [f for f in spec.files if not is_weight(f)]
        weights = [f for f in spec.files if is_weight(f)]
        size = f"{found.weight_bytes / 2**20:.1f} MB of weights" if found.weight_bytes is not None else "size unknown"
        log.info("%s: not curated; downloading %d files (%s) at %s from the Hub into %s", spec.id, len(spec.files),
                 size, found.sha[:12], folder)
        started = time.monotonic()
        seen = Received()
        progress.phase(progress.DOWNLOADING)
        with self._guard:
            self.active.add(spec.id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            self._snapshot(spec.id, found.sha, small, folder)
            problem = remote_code_in_files(folder, small)
            if problem is None and spec.loader == "diffusers":
                problem = diffusers_components_problem(folder)
            if problem:
                refused = DiscoveryRefused(f"{spec.id}: {problem}", 422, "remote_code")
                self._remember(spec.id, refused, self.info_ttl)
                raise refused
            self._snapshot(spec.id, found.sha, weights, folder, seen)
            missing = [f for f in spec.files if not (folder / f).is_file()]
            if missing:
                raise DiscoveryRefused(f"{spec.id}: the download lacks {', '.join(missing[:5])}", 502,
                                       "download_failed")
            marker = {"id": spec.id, "sha": found.sha, "library": found.library, "pipeline_tag": found.pipeline_tag,
                      "weight_bytes": found.weight_bytes, "downloaded_at": time.time(),
                      **{k: v for k, v in asdict(spec).items() if k in ("task", "loader", "pipeline_task", "files")}}
            tmp = folder / (MARKER + ".tmp")  # pragma: no mutate: any name beside the marker, renamed over it
            tmp.write_text(json.dumps(marker, indent=1), encoding="utf-8")  # pragma: no mutate: ASCII JSON, any layout
            os.replace(tmp, folder / MARKER)
            with self._guard:
                self.downloads += 1
            log.info("%s: downloaded in %.1fs", spec.id, time.monotonic() - started)
        except DiscoveryRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - network, disk, Hub errors: the request gets a clear answer
            log.warning("%s: download failed: %s: %s", spec.id, exc.__class__.__name__, str(exc)[:300])
            raise DiscoveryRefused(f"downloading {spec.id} from the Hub failed {seen.said()}{unfinished(folder, spec.files)}"
                                   f" ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
                                   502, "download_failed") from None
        finally:
            with self._guard:
                self.active.discard(spec.id)
