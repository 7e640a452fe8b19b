"""llama.cpp's OpenAI-compatible server (llama-cpp-python, pinned): built once, started on a loopback port.

Why llama-cpp-python and not llama.cpp's own binary: it builds from PyPI alone (the only registry an offline
machine reaches) and serves `/v1/chat/completions` with JSON-schema grammars and the GGUF's chat template.
The build is slow (about 12 minutes on 2 cores), so the wheel is kept in the cache and a second setup installs
it in seconds. The build's own progress lines (`[ 42%] Building ...`) are passed on, never a silent minute.

The server runs one request at a time and keeps generating after a client gives up, so every call the
orchestrator makes to it carries a token cap (see `llm_stage_caps` in the config).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .weights import cache_dir

log = logging.getLogger(__name__)

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
# The default native build dies here with "Illegal instruction" on some CPUs: a portable AVX2 build instead.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# The build's progress lines: make writes "[ 42%] Building ...", ninja "[12/345] Building ...".
PERCENT = re.compile(r"\[\s*(\d{1,3})%\]|\[(\d+)/(\d+)\]")


def build_percent(line: str) -> int | None:
    match = PERCENT.search(line)
    if match is None:
        return None
    if match.group(1) is not None:
        return int(match.group(1))
    done, total = int(match.group(2)), int(match.group(3))
    return 100 * done // total if total else None


class LocalLLMError(Exception):
    """The local LLM could not be set up or started; the message says why and what to do."""


def installed(python: str = sys.executable) -> bool:
    if python == sys.executable:
        return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None
    return subprocess.run([python, "-c", "import llama_cpp, uvicorn"], capture_output=True).returncode == 0


def missing_compiler() -> str | None:
    """One line naming what to install when the build cannot even start, else None."""
    compilers = (os.environ.get("CC") or "cc", os.environ.get("CXX") or "c++")
    if any(shutil.which(tool.split()[0]) is None for tool in compilers):
        return ("llama.cpp needs a C and a C++ compiler to build, and none was found: install them "
                "(Debian/Ubuntu: apt install build-essential; macOS: xcode-select --install) and try again")
    return None


def ensure_installed(python: str = sys.executable, wheels: Path | None = None,
                     on_line: Callable[[str], None] | None = None) -> None:
    """llama-cpp-python[server] in `python`'s environment: from the cached wheel, else built once into the cache.

    on_line gets a short line per step (and the build's percentage as it rises)."""
    if installed(python):
        return
    say = on_line or (lambda line: None)
    wheels = Path(wheels or cache_dir() / "wheels")
    wheels.mkdir(parents=True, exist_ok=True)
    built = sorted(wheels.glob(f"llama_cpp_python-{VERSION}-*.whl"))
    if not built:
        problem = missing_compiler()
        if problem:
            raise LocalLLMError(problem)
        say(f"building {PACKAGE} {VERSION} from source, once (about 12 minutes on 2 cores; kept in {wheels})")
        _run_build([python, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(wheels), f"{PACKAGE}=={VERSION}"],
                   say)
        built = sorted(wheels.glob(f"llama_cpp_python-{VERSION}-*.whl"))
        if not built:
            raise LocalLLMError(f"the build of {PACKAGE} finished but left no wheel in {wheels}")
    say(f"installing {built[-1].name}")
    done = subprocess.run([python, "-m", "pip", "install", "-q", f"{built[-1]}[server]"], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise LocalLLMError(f"pip could not install {built[-1].name}: " + _last_line(done.stderr))


def _run_build(command: list[str], say: Callable[[str], None]) -> None:
    env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS") or CMAKE_ARGS}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: list[str] = []
    shown = -10
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        percent = build_percent(line)
        if percent is not None and percent >= shown + 10:  # every tenth percent: watchable, not a flood
            shown = percent
            say(f"building llama.cpp: {shown}%")
    if proc.wait() != 0:
        errors = [t for t in tail if "error" in t.lower()] or tail[-3:]
        raise LocalLLMError(f"building {PACKAGE} failed: {' | '.join(errors[-3:])[:400]}")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


@dataclass
class ServerSettings:
    """What matters when serving a small model on a CPU: context, threads, and the prompt prefix kept warm."""

    model_path: Path
    model_alias: str
    host: str = "127.0.0.1"
    port: int = 8006
    n_ctx: int = 8192
    n_threads: int = field(default_factory=lambda: max(1, min(os.cpu_count() or 2, 8)))
    n_gpu_layers: int = 0

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", "llama_cpp.server", "--model", str(self.model_path), "--model_alias",
                self.model_alias, "--host", self.host, "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
                "--n_gpu_layers", str(self.n_gpu_layers),
                # its default cuts a streamed reply short whenever another request waits: a second user's plan
                # would truncate the first one's. A client that leaves still stops its stream (checked per chunk).
                "--interrupt_requests", "false"]

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def start(settings: ServerSettings, python: str = sys.executable, log_path: Path | None = None,
          timeout: float = 180.0) -> subprocess.Popen:
    """Start the server and return once it answers `/v1/models` with our model; a server that dies or never
    answers is an error naming its log, never "ready"."""
    if not port_free(settings.host, settings.port):
        raise LocalLLMError(f"port {settings.port} on {settings.host} is taken: stop what runs there or pick "
                            "another port (--port)")
    sink = log_path.open("ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(settings.command(python), stdout=sink, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_ready(settings, proc, timeout, log_path)
    except BaseException:
        stop(proc)
        raise
    return proc


def wait_ready(settings: ServerSettings, proc: subprocess.Popen | None, timeout: float,
               log_path: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    where = f" (its log: {log_path})" if log_path else ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise LocalLLMError(f"the LLM server exited with code {proc.returncode} while starting{where}")
        try:
            with urllib.request.urlopen(settings.endpoint + "/models", timeout=2) as reply:
                served = [m.get("id") for m in json.loads(reply.read()).get("data", [])]
            if settings.model_alias in served:
                return
            raise LocalLLMError(f"port {settings.port} answers, but serves {served}, not {settings.model_alias}")
        except (OSError, ValueError):
            time.sleep(0.5)
    raise LocalLLMError(f"the LLM server did not answer within {timeout:g} s{where}")


def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 15)
        proc.wait(grace)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(grace)
