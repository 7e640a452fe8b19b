"""Fixtures: a scripted LLM and a fake models server in-process, the project's server as a subprocess."""

from __future__ import annotations

import io
import itertools
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml
from PIL import Image

from tests import mutmut_hits
from tests.fakes.llm_server import ScriptedLLM, ThreadedServer
from tests.fakes.models_server import FakeModels

_CHILD_HITS: list[mutmut_hits.ChildHits] = []
_SHARED_HITS = mutmut_hits.SharedFixtureHits()


@pytest.fixture(scope="session", autouse=True)
def _mutmut_children() -> None:
    """Every process the tests start exits with this run (however it ends); under mutmut's stats run, the servers
    also report the functions they reach."""
    hits = mutmut_hits.start()
    if hits is not None:
        _CHILD_HITS.append(hits)


def pytest_collection_modifyitems(session, config, items) -> None:
    mutmut_hits.fastest_files_first(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Under mutmut's stats only: what a module or session fixture reaches counts for every test using it."""
    if not _CHILD_HITS or fixturedef.scope == "function":
        yield
        return
    before = _SHARED_HITS.reached_so_far()
    yield
    _SHARED_HITS.set_up(fixturedef, before)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    for hits in _CHILD_HITS:
        mutmut_hits.hand_to_mutmut(hits, _SHARED_HITS, item)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = {
    "stabilityai/stable-diffusion-xl-base-1.0": "text-to-image",
    "Salesforce/blip-image-captioning-large": "image-to-text",
    "nlpconnect/vit-gpt2-image-captioning": "image-to-text",
    "google/vit-base-patch16-224": "image-classification",
    "facebook/detr-resnet-50": "object-detection",
    "microsoft/speecht5_tts": "text-to-speech",
    "openai/whisper-base": "automatic-speech-recognition",
    "dslim/bert-base-NER": "token-classification",
}


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger as pytest left it, put back after the test: `setup_logging` (and `launch.main`, which calls
    it) replaces its handlers with one writing to the stderr of that moment, which pytest closes after the test, so
    a later test's log line would fail; it also quiets the libraries' loggers."""
    logger = logging.getLogger()
    saved = (logger.handlers[:], logger.level)
    noisy = {name: logging.getLogger(name).level for name in ("httpx", "openai", "urllib3", "waitress.queue")}
    yield logger
    logger.handlers[:] = saved[0]
    logger.setLevel(saved[1])
    for name, level in noisy.items():
        logging.getLogger(name).setLevel(level)


def ephemeral_ports() -> tuple[int, int]:
    """The first and last port the kernel hands out for `bind(0)` and outgoing connections."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _own_ports() -> range:
    """This test process's ports: below the kernel's ephemeral range, where `bind(0)` and every client
    connection take theirs, and a block per xdist worker. A port handed out stays free until the server
    started on it binds it: no other worker and no outgoing connection takes it in between."""
    ephemeral = ephemeral_ports()[0]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    first = 20000 + 1000 * (int(worker) if worker.isdigit() else 0)
    return range(first, first + 1000) if first + 1000 <= ephemeral else range(0)


_PORTS = _own_ports()
_NEXT = itertools.count(random.randrange(len(_PORTS) or 1))  # another run at once starts elsewhere in the block


def free_port() -> int:
    """A loopback port nothing listens on now, for a server a test starts."""
    for _ in _PORTS:
        port = _PORTS[next(_NEXT) % len(_PORTS)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
            return port
    with socket.socket() as s:  # no block of its own (an unusual ephemeral range, many workers): the kernel's
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def catalog_of(folder: Path, models: FakeModels, cards: list[dict[str, Any]]) -> Path:
    """A catalog file of `cards`, and the fake models server serving exactly those models."""
    catalog = folder / "catalog.jsonl"
    catalog.write_text("\n".join(json.dumps(c) for c in cards) + "\n")
    models.models = {c["id"]: c["task"] for c in cards}
    return catalog


def make_public(folder: Path) -> Path:
    (folder / "examples").mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (80, 60), (200, 30, 30)).save(folder / "examples" / "red.png")
    Image.new("RGB", (40, 40), (10, 200, 30)).save(folder / "examples" / "green.jpg")
    import soundfile as sf

    sf.write(folder / "examples" / "hello.wav", np.zeros(8000, dtype="float32"), 16000)
    (folder.parent / "secret.txt").write_text("do not serve me")
    return folder


@pytest.fixture(scope="session")
def public_dir(tmp_path_factory) -> Path:
    return make_public(tmp_path_factory.mktemp("site") / "public")


@pytest.fixture(scope="session")
def llm_server() -> Iterator[ScriptedLLM]:
    llm = ScriptedLLM()
    server = ThreadedServer(llm.app()).start()
    llm.base_url = server.url
    yield llm
    server.stop()


@pytest.fixture
def llm(llm_server: ScriptedLLM) -> ScriptedLLM:
    llm_server.reset()
    return llm_server


@pytest.fixture(scope="session")
def models_server(public_dir: Path) -> Iterator[tuple[FakeModels, str]]:
    fake = FakeModels(public=public_dir, models=dict(DEFAULT_MODELS))
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def models(models_server) -> FakeModels:
    fake, _ = models_server
    fake.models = dict(DEFAULT_MODELS)
    fake.delays.clear()
    for gate in fake.gates.values():
        gate.set()
    fake.gates.clear()
    fake.broken.clear()
    fake.calls.clear()
    fake.arrivals.clear()
    fake.status_calls.clear()
    return fake


def write_config(folder: Path, llm_url: str, models_url: str, public: Path, **extra: Any) -> Path:
    port = int(models_url.rsplit(":", 1)[1])
    data: dict[str, Any] = {
        "local": {"endpoint": llm_url + "/v1"},
        "dev": True,
        "model": "scripted",
        "root": str(ROOT),
        "public_dir": str(public),
        "inference_mode": "local",
        "local_deployment": "minimal",
        "device": "cpu",
        "num_candidate_models": 3,
        "max_description_length": 100,
        "http_listen": {"host": "127.0.0.1", "port": 8004},
        "local_inference_endpoint": {"host": "127.0.0.1", "port": port},
        "logit_bias": {"parse_task": 0.1, "choose_model": 5},
        "llm_max_retries": 2,
        "llm_timeout": 10,
        "status_cache_seconds": 0,
        "request_timeout": 30,
        "catalog_store": str(folder / "catalog.sqlite"),  # each server its own (health is persisted there)
    }
    for key, value in extra.items():
        data[key] = value
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class RunningServer:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url, self.proc, self.log = url, proc, log

    def post(self, path: str, body: Any, **kw: Any) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 30), **kw)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(config: Path, folder: Path, env: dict[str, str] | None = None, port: int | None = None) -> RunningServer:
    port = port or free_port()
    from hugginggpt.checks import port_problem

    taken = port_problem("127.0.0.1", port)
    if taken:  # whatever answers there is not the server started here
        raise RuntimeError(f"error: 127.0.0.1:{port} {taken}")
    log = folder / f"server-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "server", "--port",
         str(port), "--host", "127.0.0.1"],
        cwd=folder, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()}")
        try:
            health = requests.get(url + "/health", timeout=1)
            if health.status_code == 200 and health.json().get("model_ranking") != "warming":
                if proc.poll() is not None:  # an answer from another process on the port, not from ours
                    raise RuntimeError(f"server exited: {log.read_text()}")
                return RunningServer(url, proc, log)
            time.sleep(0.1)
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"server did not start: {log.read_text()}")


def stop_server(server: RunningServer) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory, llm_server, models_server, public_dir) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("srv")
    _, models_url = models_server
    config = write_config(folder, llm_server.base_url, models_url, public_dir, max_body_bytes=200_000)
    running = start_server(config, folder)
    yield running
    stop_server(running)


def wait_until(check, timeout: float = 30.0, what: str = "the condition") -> None:
    """Poll `check` until true: for state another process changes (a fixed sleep is either slow or flaky)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f}s")
        time.sleep(0.02)


def png_bytes(response: requests.Response) -> Image.Image:
    return Image.open(io.BytesIO(response.content))


def sse(resp: requests.Response, within: float = 90.0) -> list[tuple[str, dict]]:
    """The (event, data) pairs of an event stream (the models server's or the orchestrator's), in order; it must
    end within `within` seconds (keep-alive comments would hold a per-read timeout open for ever)."""
    out, name = [], None
    deadline = time.monotonic() + within
    for line in resp.iter_lines(decode_unicode=True):
        assert time.monotonic() < deadline, f"the stream did not end within {within} s: {out[-3:]}"
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[len("data: "):])))
    return out
