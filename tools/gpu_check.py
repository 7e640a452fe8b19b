"""Does the models server work on this device? Builds the tiny test models, starts the real models server on the
device, and checks what breaks on a GPU box and nowhere else.

    python tools/gpu_check.py --device cuda:0        # a GPU (runs with the CUDA torch this box has)
    python tools/gpu_check.py --device cpu           # the same checks on the CPU (CI runs this one)

1. versions: torch (and its CUDA), transformers, diffusers; versions this server cannot serve fail at once;
2. every task type of the level: served or not (with the error line), output valid (text present, scores
   finite, images neither all black nor unreadable, audio without NaN), the dtype and device the model really
   runs in (GET /models), memory after its load;
3. eviction under a small memory budget: the evicted model's memory really comes back (CUDA:
   torch.cuda.memory_allocated, read by the server; CPU: the pool's accounting, with RSS shown), and a model larger
   than the budget is refused with a 503;
4. 16 concurrent requests across 4 models: all answered, no CUDA error, p50 / p99.

Exit status: 0 all passed, 1 a check failed, 2 this box cannot run the check (versions, no CUDA, no flask).
`--json FILE` writes the results; `--quick` checks the standard level only (no diffusers pipelines).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SENTENCE = "anna lives in berlin and the cat sits on the mat"


@dataclass
class Row:
    """One task type's model on the device."""

    task: str
    model: str
    served: bool = False
    valid: bool = False
    why: str = ""  # the error line, or what is wrong with the output
    dtype: str | None = None
    weights_device: str | None = None
    memory_mb: float | None = None  # the model's parameters
    device_memory_mb: float | None = None  # what its load took on the device (CUDA)
    seconds: float | None = None


@dataclass
class Report:
    device: str
    versions: dict[str, str] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # models the level lists but this box cannot serve (why)
    eviction: dict[str, Any] = field(default_factory=dict)
    concurrency: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


# -- the box ------------------------------------------------------------------------------------------------


def versions(device: str) -> tuple[dict[str, str], list[str]]:
    """What this box runs, and why it cannot run the check (empty: it can)."""
    from hugginggpt.modelhost.device import version_problems

    found = {"python": platform.python_version()}
    problems = version_problems(required=("torch", "transformers"))
    for name in ("torch", "transformers", "diffusers", "huggingface_hub", "flask", "waitress"):
        try:
            from importlib.metadata import version

            found[name] = version(name)
        except Exception:  # noqa: BLE001 - not installed
            found[name] = "not installed"
    for name in ("flask", "waitress"):
        if found[name] == "not installed":
            problems.append(f"the models server needs {name}: pip install -r requirements.txt")
    if problems:
        return found, problems
    import torch

    found["torch cuda"] = str(torch.version.cuda or "none")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            problems.append(f"--device {device}, but this torch has no CUDA ({torch.__version__}); install a CUDA "
                            "build of torch, or run with --device cpu")
            return found, problems
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            problems.append(f"--device {device}, but this box has {torch.cuda.device_count()} CUDA device(s)")
            return found, problems
        props = torch.cuda.get_device_properties(index)
        found["gpu"] = f"{props.name}, {props.total_memory / 2**30:.1f} GiB, compute {props.major}.{props.minor}"
        found["cudnn"] = str(torch.backends.cudnn.version())
    else:
        found["cpu"] = f"{os.cpu_count()} cores, {platform.machine()}"
    return found, problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_inputs(public: Path) -> None:
    """A photo-like image (gradients and a sharp-edged block) and a second of speech-like sound."""
    import numpy as np
    import soundfile as sf
    from PIL import Image

    (public / "examples").mkdir(parents=True, exist_ok=True)
    y, x = np.mgrid[0:96, 0:128]
    rgb = np.stack([x * 2, y * 2, (x + y) % 256], axis=2).astype("uint8")
    rgb[30:70, 40:90] = (250, 240, 30)  # a sharp-edged block: edge detectors have something to find
    Image.fromarray(rgb).save(public / "examples" / "photo.png")
    t = np.arange(16000) / 16000
    sf.write(public / "examples" / "speech.wav", (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t))
             .astype("float32"), 16000)


class Server:
    """models_server.py on a free loopback port, with `lines` added to its config."""

    def __init__(self, folder: Path, models: Path, public: Path, device: str, deployment: str, lines: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = folder / f"models-{self.port}.yaml"
        config.write_text("\n".join([
            f"root: {ROOT}", f"public_dir: {public}", f"local_models_dir: {models}", f"local_deployment: {deployment}",
            f"device: {device}", "openai: {api_key: unused}",
            f"local_inference_endpoint: {{host: 127.0.0.1, port: {self.port}}}", *lines]) + "\n")
        self.log = folder / f"models-{self.port}.log"
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config", str(config)],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT, cwd=folder)

    def wait(self, seconds: float = 180) -> None:
        import requests

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if requests.get(self.url + "/running", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the models server did not start:\n{self.log.read_text()[-3000:]}")

    def models(self) -> dict[str, Any]:
        import requests

        return requests.get(self.url + "/models", timeout=30).json()

    def post(self, model: str, body: dict, timeout: float = 300):
        import requests

        return requests.post(f"{self.url}/models/{model}", json=body, timeout=timeout)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# -- what each task type is asked, and what a valid answer is --------------------------------------------------


IMAGE = "/examples/photo.png"
AUDIO = "/examples/speech.wav"


def body_for(task: str) -> dict[str, Any]:
    if task in ("automatic-speech-recognition", "audio-classification", "audio-to-audio"):
        return {"audio_url": AUDIO}
    if task == "question-answering":
        return {"text": "where is the cat ?", "context": SENTENCE}
    if task == "sentence-similarity":
        return {"text": "the cat sits on the mat", "text2": "a cat is on the mat"}
    if task == "visual-question-answering":
        return {"img_url": IMAGE, "text": "what is red ?"}
    if task == "document-question-answering":
        return {"img_url": IMAGE, "text": "who lives in berlin ?",
                "word_boxes": [["anna", [10, 10, 90, 40]], ["lives", [100, 10, 190, 40]], ["berlin", [200, 10, 300, 40]]]}
    if task.endswith("-text-to-image") or task == "image-to-image":
        return {"img_url": IMAGE, "text": "a red fox", "steps": 2}
    if task in ("text-to-image", "text-to-video"):
        return {"text": "a red fox in the snow", "steps": 2}
    if task == "object-detection":
        return {"img_url": IMAGE, "threshold": 0.0}  # random weights score low: every box, to check the numbers
    if task.endswith("-control") or task in ("image-classification", "image-segmentation",
                                             "depth-estimation", "image-to-text"):
        return {"img_url": IMAGE}
    return {"text": SENTENCE, "max_new_tokens": 8} if task in ("text-generation", "conversational") else {"text": SENTENCE}


def finite_numbers(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return True


def check_file(public: Path, path: str) -> str | None:
    """Why a generated file is not valid, or None."""
    import numpy as np

    file = public / path.lstrip("/")
    if not file.is_file() or file.stat().st_size == 0:
        return f"{path} was not written"
    if file.suffix == ".wav":
        import soundfile as sf

        samples, _ = sf.read(file, dtype="float32")
        if samples.size == 0:
            return "the audio is empty"
        if not np.isfinite(samples).all():
            return "the audio holds NaN or infinite samples"
        return None
    if file.suffix == ".mp4":
        import imageio.v3 as iio

        frames = iio.imread(file)
        return "the video is all black (NaN frames?)" if frames.max() == 0 else None
    from PIL import Image

    with Image.open(file) as img:
        pixels = np.asarray(img.convert("RGB"))
    if pixels.max() == 0:
        return "the image is all black (NaN in half precision?)"
    return None


def check_answer(task: str, out: Any, public: Path) -> str | None:
    """Why an answer is not valid, or None."""
    if not finite_numbers(out):
        return "a score is NaN or infinite"
    if isinstance(out, dict) and isinstance(out.get("path"), str):
        return check_file(public, out["path"])
    if isinstance(out, dict):
        for key in ("generated text", "text", "answer"):
            if key in out:
                return None if isinstance(out[key], str) else f"`{key}` is not text"
        if "score" in out:
            return None
        return f"no text, score or file in {str(out)[:120]}"
    if isinstance(out, list):
        if task == "token-classification" and not out:
            return None  # no entity found is an answer
        if not out:
            return "an empty list"
        first = out[0]
        if not isinstance(first, dict) or not ({"label", "answer", "entity_group", "entity"} & set(first)):
            return f"no labels in {str(first)[:120]}"
        return None
    return f"an answer of type {type(out).__name__}"


# -- the checks ---------------------------------------------------------------------------------------------------


def check_tasks(server: Server, public: Path, report: Report) -> None:
    listing = server.models()
    for row in listing["models"]:
        if not row["servable"]:
            report.skipped.append(f"{row['task']} ({row['id']}): {(row['problem'] or '')[:160]}")
            continue
        r = Row(task=row["task"], model=row["id"])
        started = time.perf_counter()
        try:
            resp = server.post(row["id"], body_for(row["task"]))
        except Exception as exc:  # noqa: BLE001 - a dead server is a failed check, reported
            r.why = f"{exc.__class__.__name__}: {str(exc)[:200]}"
            report.rows.append(r)
            continue
        r.seconds = round(time.perf_counter() - started, 3)
        if resp.status_code != 200:
            try:
                r.why = f"{resp.status_code}: {resp.json()['error']['message'][:300]}"
            except Exception:  # noqa: BLE001
                r.why = f"{resp.status_code}: {resp.text[:300]}"
        else:
            r.served = True
            why = check_answer(row["task"], resp.json(), public)
            r.valid, r.why = why is None, why or ""
        report.rows.append(r)
    for entry in server.models()["models"]:
        for r in report.rows:
            if r.model == entry["id"] and entry.get("loaded"):
                r.dtype, r.weights_device = entry.get("dtype"), entry.get("weights_device")
                r.memory_mb, r.device_memory_mb = entry.get("memory_mb"), entry.get("device_memory_mb")
    cuda = report.device.startswith("cuda")
    for r in report.rows:
        if not r.served or not r.valid:
            report.failures.append(f"{r.task} ({r.model}): {r.why}")
        elif cuda and r.weights_device is not None and not r.weights_device.startswith("cuda"):
            report.failures.append(f"{r.task} ({r.model}): ran on {r.weights_device}, not {report.device}")


def memory_given_back(readings: list[int], smallest: int) -> tuple[list[int], str | None]:
    """Readings after four loads of two models in turns (one held at a time): the same model held gives the same
    reading, so what a turn did not give back is the difference; anything past a quarter of the smaller model
    is a model that eviction did not free. Returns those differences and what is wrong, if anything."""
    leaks = [readings[2] - readings[0], readings[3] - readings[1]]
    if any(abs(x) > 0.25 * smallest for x in leaks):
        return leaks, f"the memory did not come back: {[round(r / 1e3, 1) for r in readings]} kB after each turn"
    return leaks, None


def eviction_gave_back(took: dict[str, int], freed: dict[str, int]) -> str | None:
    """CUDA: what each eviction gave back (torch.cuda.memory_allocated around the eviction, in the server) against
    what the model's load took; less than nine tenths is a model that `del` did not free."""
    for model, load in took.items():
        back = freed.get(model)
        if back is None or load <= 0 or back < 0.9 * load:
            return (f"evicting {model} gave back {None if back is None else round(back / 1e3, 1)} kB of the "
                    f"{round(load / 1e3, 1)} kB its load took")
    return None


def check_eviction(folder: Path, models: Path, public: Path, device: str, report: Report) -> None:
    """Two small models under a budget that holds one, used in turns: each load evicts the other, and the memory
    comes back. On CUDA each eviction must give back what the model's load took (the server measures both with
    torch.cuda.memory_allocated, one load or eviction at a time); the readings after each turn are shown too, but
    they also hold what other threads allocate (cuBLAS workspaces per thread). On the CPU the pool's count after
    two turns equals the count after none. A model larger than the budget is refused with a 503."""
    from hugginggpt.modelhost.pool import expected_size
    from hugginggpt.modelhost.registry import Registry

    first, second = "distilbert/distilbert-base-uncased-finetuned-sst-2-english", "dslim/bert-base-NER"
    registry = Registry("standard", models)
    # what each takes on this device as the server counts it (float16 on CUDA: half the float32 files)
    sizes = [expected_size(registry.get(m), registry, device) or 0 for m in (first, second)]
    budget_gb = max(sizes) * 1.5 / 1024**3
    cuda = device.startswith("cuda")
    key = "device_allocated_bytes" if cuda else "models_bytes"
    out: dict[str, Any] = {"budget_kb": round(budget_gb * 1024**3 / 1e3, 1),
                           "kb_each_model": [round(x / 1e3, 1) for x in sizes],
                           "measured_with": "torch.cuda.memory_allocated, read by the server" if cuda
                           else "the pool's accounting (parameters of the loaded models); RSS shown"}
    server = Server(folder, models, public, device, "standard", [f"memory_budget_gb: {budget_gb:.9f}"])
    try:
        server.wait()
        readings, held, answers, took = [], [], [], {}
        for model in (first, second, first, second):
            answers.append(server.post(model, {"text": SENTENCE}).status_code)
            listing = server.models()
            readings.append(listing["memory"].get(key, 0))
            held.append(sorted(r["id"] for r in listing["models"] if r["loaded"]))
            row = next(r for r in listing["models"] if r["id"] == model)
            took[model] = int((row.get("device_memory_mb") or 0) * 1e6)  # this load's, by the server
        freed = listing["memory"].get("freed_on_eviction_bytes", {})  # each model's last eviction
        out["kb_after_each_turn"] = [round(r / 1e3, 1) for r in readings]
        if "rss_bytes" in listing["memory"]:
            out["rss_mb"] = round(listing["memory"]["rss_bytes"] / 1e6, 1)
        if answers != [200] * 4 or held != [[first], [second], [first], [second]]:
            report.failures.append(f"eviction: answers {answers}, loaded after each turn {held} (one model at a time "
                                   "expected)")
        elif cuda:
            out["kb_load_took"] = {m: round(v / 1e3, 1) for m, v in took.items()}
            out["kb_eviction_gave_back"] = {m: round(v / 1e3, 1) for m, v in freed.items()}
            why = eviction_gave_back({first: took[first]}, freed)  # the first was evicted last, after its 2nd load
            if why:
                report.failures.append(f"eviction: {why}")
        else:
            leaks, why = memory_given_back(readings, min(sizes))
            out["kb_not_given_back"] = [round(x / 1e3, 1) for x in leaks]
            if why:
                report.failures.append(f"eviction: {why} (loading {first}, {second}, {first}, {second} in turns)")
    finally:
        server.stop()
    tight = Server(folder, models, public, device, "standard", [f"memory_budget_gb: {min(sizes) / 2 / 1024**3:.9f}"])
    try:
        tight.wait()
        refused = tight.post(first, {"text": SENTENCE})
        out["model_larger_than_the_budget"] = f"{refused.status_code}: {refused.json().get('error', {}).get('message')}"
        if refused.status_code != 503:
            report.failures.append(f"a model larger than memory_budget_gb answered {refused.status_code}, not 503")
    finally:
        tight.stop()
    report.eviction = out


def check_concurrency(server: Server, report: Report, models: list[str]) -> None:
    """16 requests at once, 4 to each of 4 models: all answered, no CUDA error."""
    listing = {r["id"]: r for r in server.models()["models"]}
    chosen = [m for m in models if m in listing and listing[m]["servable"]][:4]
    if len(chosen) < 4:
        report.failures.append(f"concurrency: only {len(chosen)} of the 4 models are servable: {chosen}")
        return
    results: list[tuple[int, float, str]] = []
    lock = threading.Lock()
    gate = threading.Barrier(16)

    def call(model: str) -> None:
        gate.wait()
        t0 = time.perf_counter()
        try:
            resp = server.post(model, body_for(listing[model]["task"]))
            status, text = resp.status_code, resp.text
        except Exception as exc:  # noqa: BLE001
            status, text = 0, str(exc)
        with lock:
            results.append((status, time.perf_counter() - t0, text[:300]))

    threads = [threading.Thread(target=call, args=(chosen[k % 4],)) for k in range(16)]
    [t.start() for t in threads]
    [t.join(600) for t in threads]
    latencies = sorted(s for _, s, _ in results)
    bad = [f"{status}: {text}" for status, _, text in results if status != 200 or "CUDA error" in text]
    report.concurrency = {"models": chosen, "answered": sum(status == 200 for status, _, _ in results),
                          "p50_ms": round(statistics.median(latencies) * 1000, 1),
                          "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000, 1)}
    if len(results) != 16 or bad:
        report.failures.append(f"concurrency: {16 - len(results) + len(bad)} of 16 failed; first: {bad[:1]}")


CONCURRENT = ["distilbert/distilbert-base-uncased-finetuned-sst-2-english", "dslim/bert-base-NER",
              "google/vit-base-patch16-224", "hustvl/yolos-tiny"]


def build_models(models: Path, full: bool) -> None:
    from tests import tiny_models

    tiny_models.build_all(models)
    if full:
        for mid, builder in tiny_models.FULL_BUILDERS.items():
            if not (models / mid / "model_index.json").is_file() and not (models / mid / "config.json").is_file():
                builder(models / mid)


def print_report(report: Report) -> None:
    print(f"gpu_check on {report.device}: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
    print(f"\n| task | model | served | output | dtype | on | MB (params) | device MB | seconds |\n|{'---|' * 9}")
    for r in report.rows:
        print(f"| {r.task} | {r.model} | {'yes' if r.served else 'no'} | {'valid' if r.valid else r.why[:80]} | "
              f"{r.dtype or '-'} | {r.weights_device or '-'} | {r.memory_mb if r.memory_mb is not None else '-'} | "
              f"{r.device_memory_mb if r.device_memory_mb is not None else '-'} | {r.seconds} |")
    if report.skipped:
        print(f"\nnot servable on this box ({len(report.skipped)}):")
        for line in report.skipped:
            print(f"  {line}")
    if report.eviction:
        print("\neviction under a small memory budget: " + json.dumps(report.eviction))
    if report.concurrency:
        print("16 concurrent requests across 4 models: " + json.dumps(report.concurrency))
    served = sum(r.served and r.valid for r in report.rows)
    print(f"\n{served}/{len(report.rows)} task models served with valid output; "
          + ("all checks passed" if not report.failures else f"{len(report.failures)} FAILED:"))
    for line in report.failures:
        print(f"  FAIL {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda:0", help="cuda:N or cpu (default cuda:0)")
    parser.add_argument("--quick", action="store_true", help="the standard level only (no diffusers pipelines)")
    parser.add_argument("--keep", type=Path, help="build the models and run in this folder (kept afterwards)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)

    report = Report(device=args.device)
    report.versions, problems = versions(args.device)
    if problems:
        print(f"gpu_check cannot run on {args.device}: " + ", ".join(f"{k} {v}" for k, v in report.versions.items()))
        for line in problems:
            print(f"  FAIL {line}")
        return 2
    full = not args.quick and report.versions["diffusers"] != "not installed"
    if not args.quick and not full:
        report.skipped.append("the full level (diffusers pipelines): diffusers is not installed")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    models, public = folder / "models", folder / "public"
    make_inputs(public)
    t0 = time.perf_counter()
    build_models(models, full)
    print(f"built the tiny models in {time.perf_counter() - t0:.1f}s", flush=True)
    server = Server(folder, models, public, args.device, "full" if full else "standard", [])
    try:
        server.wait()
        check_tasks(server, public, report)
        check_concurrency(server, report, CONCURRENT)
    finally:
        server.stop()
    check_eviction(folder, models, public, args.device, report)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
