"""tools/gpu_check.py: the CPU run of the GPU check (what CI runs), its clear refusals, and its validators."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from tests.conftest import ROOT
from tools import gpu_check


def test_the_gpu_check_passes_on_the_cpu(tmp_path):
    """Every task type of the full level served with valid output, eviction giving its memory back, a model larger
    than the budget refused with a 503, 16 concurrent requests across 4 models answered."""
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cpu", "--json", str(out),
                          "--keep", str(tmp_path / "work")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "all checks passed" in run.stdout and "torch 2." in run.stdout and "transformers " in run.stdout
    report = json.loads(out.read_text())
    rows = report["rows"]
    tasks = {r["task"] for r in rows}
    assert {"text-classification", "token-classification", "object-detection", "automatic-speech-recognition",
            "text-to-speech", "text-to-image", "image-to-image", "text-to-video", "canny-text-to-image",
            "audio-to-audio", "image-to-text", "depth-estimation"} <= tasks
    assert all(r["served"] and r["valid"] for r in rows), [r for r in rows if not r["valid"]]
    assert all(r["weights_device"] == "cpu" and r["dtype"] == "float32" for r in rows if r["weights_device"])
    eviction = report["eviction"]
    assert eviction["kb_not_given_back"] == [0.0, 0.0] and len(eviction["kb_after_each_turn"]) == 4
    assert eviction["model_larger_than_the_budget"].startswith("503: ")
    assert report["concurrency"]["answered"] == 16 and report["concurrency"]["p99_ms"] > 0
    assert report["failures"] == []


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_box_without_it_fails_clearly(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--device", "cuda:0"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 2 and "FAIL --device cuda:0, but this torch has no CUDA" in run.stdout, run.stdout
    assert "Traceback" not in run.stderr


def test_versions_we_cannot_serve_fail_clearly(monkeypatch, capsys):
    from hugginggpt.modelhost import device

    monkeypatch.setitem(device.MINIMUM_VERSIONS, "transformers", "99.1")
    assert gpu_check.main(["--device", "cpu"]) == 2
    out = capsys.readouterr().out
    assert "is older than this server can serve: upgrade to transformers>=99.1" in out and "FAIL" in out
    monkeypatch.setitem(device.MINIMUM_VERSIONS, "transformers", "4.56")
    assert device.version_problems() == []


def test_the_validators_catch_what_half_precision_breaks(tmp_path):
    """NaN audio, black images, NaN scores, missing text, memory that eviction did not give back."""
    (tmp_path / "images").mkdir()
    (tmp_path / "audios").mkdir()
    Image.new("RGB", (16, 16), (0, 0, 0)).save(tmp_path / "images" / "black.png")
    Image.new("RGB", (16, 16), (0, 0, 1)).save(tmp_path / "images" / "dark.png")
    sf.write(tmp_path / "audios" / "nan.wav", np.array([0.1, np.nan, 0.2], dtype="float32"), 16000, subtype="FLOAT")
    sf.write(tmp_path / "audios" / "ok.wav", np.array([0.1, -0.1, 0.2], dtype="float32"), 16000, subtype="FLOAT")
    check = gpu_check.check_answer
    assert "all black" in check("text-to-image", {"path": "/images/black.png"}, tmp_path)
    assert check("text-to-image", {"path": "/images/dark.png"}, tmp_path) is None
    assert "NaN" in check("text-to-speech", {"path": "/audios/nan.wav"}, tmp_path)
    assert check("text-to-speech", {"path": "/audios/ok.wav"}, tmp_path) is None
    assert "was not written" in check("text-to-image", {"path": "/images/none.png"}, tmp_path)
    assert "NaN" in check("text-classification", [{"label": "POSITIVE", "score": float("nan")}], tmp_path)
    assert check("text-classification", [{"label": "POSITIVE", "score": 0.7}], tmp_path) is None
    assert "not text" in check("summarization", {"generated text": None}, tmp_path)
    assert check("token-classification", [], tmp_path) is None and check("image-classification", [], tmp_path)
    # eviction: two 90 kB models in turns; a model that was not freed adds its size to the later readings
    assert gpu_check.memory_given_back([90_000, 88_000, 90_000, 88_000], 88_000) == ([0, 0], None)
    leaks, why = gpu_check.memory_given_back([90_000, 88_000, 178_000, 176_000], 88_000)
    assert leaks == [88_000, 88_000] and "did not come back" in why
    assert gpu_check.eviction_gave_back({"a": 90_112}, {"a": 90_112, "b": 88_064}) is None
    assert "gave back 1.0 kB of the 90.1 kB" in gpu_check.eviction_gave_back({"a": 90_112}, {"a": 1024})
    assert "gave back None" in gpu_check.eviction_gave_back({"a": 90_112}, {})


@pytest.mark.parametrize("script", ["tools/gpu_check.py", "bench/models_throughput.py"])
def test_the_scripts_answer_help(script):
    run = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and run.stdout.startswith("usage:"), run.stderr
