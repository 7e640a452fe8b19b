"""The offline demo as a new user runs it: quiet start, a working page, and a clean stop on SIGTERM."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.conftest import ROOT, free_port


def demo_processes(folder: str = "hugginggpt-demo-") -> list[str]:
    """Processes whose command line names the demo's folder (this demo's only: other demos may be running)."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = open(cmdline, "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if folder in text:
            found.append(text)
    return found


def test_the_demo_starts_quietly_serves_and_cleans_up():
    port = free_port()
    folder = None
    proc = subprocess.Popen([sys.executable, str(ROOT / "tools" / "demo.py"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip())
            if line.startswith("demo ready"):
                break
        assert lines and lines[-1] == f"demo ready: http://127.0.0.1:{port}/  (Ctrl-C stops it)", lines
        assert len(lines) <= 3, lines  # no wall of library warnings before the URL
        assert requests.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
        answer = requests.post(f"http://127.0.0.1:{port}/hugginggpt",
                               json={"messages": [{"role": "user", "content": "a red fox"}]}, timeout=120).json()
        assert "offline demo" in answer["message"] and "/images/" in answer["message"]
        # issue 21: the scripted planner reads the request, and an uploaded photo is what it works on
        with open(ROOT / "public" / "examples" / "chelsea.jpg", "rb") as photo:
            upload = requests.post(f"http://127.0.0.1:{port}/upload", files={"file": ("cat.jpg", photo)},
                                   timeout=10).json()["path"]
        ask = {"messages": [{"role": "user", "content": f"Caption {upload} and read the caption aloud"}]}
        planned = requests.post(f"http://127.0.0.1:{port}/tasks", json=ask, timeout=60).json()
        assert [(t["task"], t["args"]) for t in planned] == [("image-to-text", {"image": upload}),
                                                              ("text-to-speech", {"text": "<GENERATED>-0"})]
        results = requests.post(f"http://127.0.0.1:{port}/results", json=ask, timeout=120).json()
        caption = results["0"]["inference result"]["generated text"]
        assert caption.strip(), results  # the tiny captioner says (random) words, so there is something to read
        assert results["1"]["inference result"]["generated audio"].startswith("/audios/"), results
        config = lines[1].removeprefix("demo config: ").split()[0]
        assert lines[1].startswith("demo config: ") and os.path.isfile(config), lines
        folder = next(str(p) for p in Path(config).parents if p.name.startswith("hugginggpt-demo-"))
        assert len(demo_processes(folder)) >= 2, "the demo's two servers should be running"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "demo stopped" in out
    assert "POST /v1/chat/completions" not in out and "werkzeug" not in out, out  # no access log per LLM call
    assert folder is not None and demo_processes(folder) == []  # both child servers are gone
    assert not os.path.exists(folder)  # its folder removed
