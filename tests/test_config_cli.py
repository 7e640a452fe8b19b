"""Config errors, the LLM endpoint forms, resources, the CLI and the Python entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hugginggpt.config import load_config
from hugginggpt.errors import BadRequest, ConfigError, ResourceError
from hugginggpt.llm import normalize_endpoint
from hugginggpt.resources import resolve
from tests.conftest import ROOT, write_config


@pytest.mark.parametrize("name", ["config.default.yaml", "config.azure.yaml", "config.lite.yaml",
                                  "config.local.yaml"])
def test_shipped_configs_load_with_keys_from_the_environment(name):
    env = {"OPENAI_API_KEY": "sk-test", "HUGGINGFACE_ACCESS_TOKEN": "hf_test", "AZURE_OPENAI_API_KEY": "az"}
    if name == "config.azure.yaml":
        with pytest.raises(ConfigError, match="azure.base_url"):
            load_config(ROOT / "configs" / name, env=env)
        return
    config = load_config(ROOT / "configs" / name, env=env)
    assert config.huggingface_token == "hf_test"
    assert config.demos["parse_task"].is_file()
    assert config.catalog_path.is_file()


def test_missing_openai_key_names_the_key_and_the_file():
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "configs" / "config.default.yaml", env={})
    assert "openai.api_key" in str(info.value) and "config.default.yaml" in str(info.value)


@pytest.mark.parametrize("text, words", [
    ("openai: {api_key: x}\ninference_mode: sometimes\n", "`inference_mode` must be one of"),
    ("openai: {api_key: x}\nnum_candidate_models: many\n", "`num_candidate_models` must be a int"),
    ("openai: {api_key: x}\nhttp_listen: {port: '80'}\n", "`http_listen.port`"),
    ("openai: {api_key: x}\nmax_tasks: 0\n", "`max_tasks` must be a positive whole number"),
    ("openai: {api_key: x}\nmax_concurrent_requests: -3\n", "`max_concurrent_requests` must be a positive whole"),
    ("openai: {api_key: x}\nmax_workers: true\n", "`max_workers` must be a int, got True"),
    ("openai: {api_key: x}\nhttp_read_timeout: 0\n", "`http_read_timeout` must be a number of seconds above 0"),
    ("openai: {api_key: x}\nhttp_header_timeout: 100000\n", "`http_header_timeout` must be a number of seconds"),
    ("dev: true\n", "`local.endpoint` is required"),
    ("openai: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("openai: {api_key: x}\nhttp_connection_limit: 50\nhttp_connections_per_client: 80\n",
     "`http_connections_per_client` (80) must not exceed `http_connection_limit` (50)"),
    ("openai: {api_key: x}\nhttp_connections_per_client: 0\n", "`http_connections_per_client` must be a positive"),
])
def test_bad_configs_give_one_clear_line(tmp_path, text, words):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert words in str(info.value) and str(path) in str(info.value)


def test_the_connection_cap_per_client_defaults_to_a_quarter_of_the_limit(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("openai: {api_key: x}\nhttp_connection_limit: 400\n")
    assert load_config(path, env={}).http_limits().per_client == 100
    path.write_text("openai: {api_key: x}\nhttp_connections_per_client: 7\n")
    assert load_config(path, env={}).http_limits().per_client == 7
    path.write_text("openai: {api_key: x}\n")
    assert load_config(path, env={}).http_limits().per_client == 250


def test_cli_reports_config_errors_without_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("openai: {}\n")
    proc = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(path), "--mode", "text",
                           "--input", "hi"], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"})
    assert proc.returncode == 2
    assert "openai.api_key" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("given, base", [
    ("http://h:8006", "http://h:8006/v1"),
    ("http://h:8006/", "http://h:8006/v1"),
    ("http://h:8006/v1", "http://h:8006/v1"),
    ("http://h:8006/v1/chat/completions", "http://h:8006/v1"),
    ("http://h:8006/v1/completions", "http://h:8006/v1"),
    ("https://api.example.com/openai/v1/", "https://api.example.com/openai/v1"),
])
def test_endpoint_forms(given, base):
    assert normalize_endpoint(given) == base


def test_endpoint_must_be_http():
    with pytest.raises(BadRequest):
        normalize_endpoint("localhost:8006")


def test_importing_reads_nothing():
    code = "import awesome_chat, hugginggpt.server, hugginggpt.chat; print('ok')"
    proc = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip() == "ok", proc.stderr


def test_resources_stay_inside_public(public_dir):
    ok = resolve("/examples/red.png", public_dir, 10**6, 5)
    assert ok.mime == "image/png" and ok.public_path == "/examples/red.png"
    assert resolve("public/examples/red.png", public_dir, 10**6, 5).data == ok.data
    for bad in ("../secret.txt", "/examples/../../secret.txt", "file:///etc/passwd", "examples/missing.png"):
        with pytest.raises(ResourceError):
            resolve(bad, public_dir, 10**6, 5)
    with pytest.raises(ResourceError, match="larger than"):
        resolve("/examples/red.png", public_dir, 10, 5)
    uri = ok.data_uri()
    assert resolve(uri, public_dir, 10**6, 5).data == ok.data
    with pytest.raises(ResourceError, match="data URI is larger than"):  # refused before it is decoded
        resolve(uri, public_dir, len(ok.data) // 2, 5)


def test_urls_are_fetched_with_limits(public_dir, models_server):
    from hugginggpt.urlpolicy import UrlPolicy

    fake, url = models_server
    loopback = UrlPolicy.from_entries(["127.0.0.1/32"])
    res = resolve(url + "/running", public_dir, 10**6, 5, policy=loopback)
    assert json.loads(res.data) == {"running": True}
    with pytest.raises(ResourceError, match="larger than"):
        resolve(url + "/running", public_dir, 5, 5, policy=loopback)
    with pytest.raises(ResourceError, match="HTTP 404"):
        resolve(url + "/nothing-here", public_dir, 10**6, 5, policy=loopback)


def run_cli(config: Path, stdin: str, *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout)


def test_cli_chat_keeps_history_and_shows_progress(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir)
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "a fox"}}]),
           contains="draw a fox", times=1)
    proc = run_cli(config, "draw a fox\nwhat did you draw?\nexit\n", "--mode", "cli")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "plan: #0 text-to-image" in out and "#0 text-to-image done" in out
    assert "[ Jarvis ]: ANSWER based on:" in out and "/images/" in out
    assert "[ Jarvis ]: CHITCHAT: what did you draw?" in out
    second_plan = llm.stage_requests("parse_task")[-1]["body"]["messages"][-1]["content"]
    assert "draw a fox" in second_plan and "/images/" in second_plan  # history carried the first turn
    assert out.rstrip().endswith("bye")


def test_cli_exits_cleanly_on_ctrl_d(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir)
    proc = run_cli(config, "", "--mode", "cli")
    assert proc.returncode == 0 and "bye" in proc.stdout and "Traceback" not in proc.stderr


def test_text_mode_answers_once(tmp_path, llm, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir)
    proc = run_cli(config, "", "--mode", "text", "--input", "hello")
    assert proc.returncode == 0 and proc.stdout.strip() == "CHITCHAT: hello"


def test_text_mode_reports_llm_outage_plainly(tmp_path, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, "http://127.0.0.1:9", models_url, public_dir)
    proc = run_cli(config, "", "--mode", "text", "--input", "hello")
    assert proc.returncode == 1 and "unreachable" in proc.stderr and "Traceback" not in proc.stderr


def test_chat_huggingface_python_api(tmp_path, llm, models, models_server, public_dir):
    _, models_url = models_server
    config = write_config(tmp_path, llm.base_url, models_url, public_dir)
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "owl"}}]))
    from awesome_chat import chat_huggingface

    msgs = [{"role": "user", "content": "draw an owl"}]
    tasks = chat_huggingface(msgs, None, None, None, return_planning=True, config=str(config))
    assert tasks[0]["args"]["text"] == "owl"
    results = chat_huggingface(msgs, None, None, None, return_results=True, config=str(config))
    assert results[0]["inference result"]["generated image"].startswith("/images/")
    answer = chat_huggingface(msgs, None, None, None, config=str(config))
    assert answer["message"].startswith("ANSWER")


def test_a_typo_in_a_key_is_named_with_the_fix(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("local: {endpoint: 'http://127.0.0.1:9/v1'}\ndev: true\ninference_mdoe: local\n"
                      "http_listen: {hots: 127.0.0.1}\n")
    loaded = load_config(config)
    assert loaded.inference_mode == "hybrid"  # the typo is not silently applied...
    assert any("`inference_mdoe` (did you mean `inference_mode`?)" in w for w in loaded.warnings)  # ...but named
    assert any("`http_listen.hots` (did you mean `http_listen.host`?)" in w for w in loaded.warnings)
    with pytest.raises(ConfigError, match="inference_mdoe.*did you mean `inference_mode`"):
        load_config(config, strict=True)
    cli = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode", "text",
                          "--input", "hi", "--strict"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "did you mean `inference_mode`" in cli.stderr and "Traceback" not in cli.stderr
    for name in ("config.default.yaml", "config.azure.yaml", "config.lite.yaml", "config.local.yaml"):
        shipped = load_config(ROOT / "configs" / name, env={"OPENAI_API_KEY": "sk-x", "AZURE_OPENAI_API_KEY": "k"},
                              need_llm=False)
        assert shipped.warnings == ()


def test_a_config_copied_out_of_configs_still_finds_the_project_files(tmp_path):
    copied = tmp_path / "elsewhere" / "my.yaml"
    copied.parent.mkdir()
    copied.write_text((ROOT / "configs" / "config.local.yaml").read_text())
    config = load_config(copied)
    assert config.demos["parse_task"] == ROOT / "demos" / "demo_parse_task.json"
    assert config.catalog_path == ROOT / "data" / "p0_models.jsonl"
    # a file beside the config wins over the project's
    (copied.parent / "demos").mkdir()
    (copied.parent / "demos" / "demo_parse_task.json").write_text("[]")
    assert load_config(copied).demos["parse_task"] == copied.parent / "demos" / "demo_parse_task.json"


def test_a_port_in_use_is_one_line(tmp_path, llm, models_server, public_dir):
    import socket

    _, models_url = models_server
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = write_config(tmp_path, llm.base_url, models_url, public_dir, semantic_ranking=False,
                              local_deployment="standard", local_models_dir=str(tmp_path / "no-weights"))
        orchestrator = subprocess.run([sys.executable, str(ROOT / "awesome_chat.py"), "--config", str(config), "--mode",
                                       "server", "--host", "127.0.0.1", "--port", str(port)],
                                      capture_output=True, text=True, timeout=60)
        assert orchestrator.returncode == 2
        assert f"127.0.0.1:{port} is already in use" in orchestrator.stderr and "Traceback" not in orchestrator.stderr
        models = subprocess.run([sys.executable, str(ROOT / "models_server.py"), "--config", str(config), "--host",
                                 "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=60)
        assert models.returncode == 2 and "already in use" in models.stderr and "Traceback" not in models.stderr
        assert "local_inference_endpoint.port" in models.stderr
        # with no weights on disk the models server says how to get them
        assert "python -m hugginggpt.modelhost.download --config" in models.stderr


@pytest.mark.parametrize("script", ["bench/dependency_hops.py", "bench/models_server_overhead.py", "bench/load.py",
                                    "bench/ray_replicas.py", "bench/taskbench.py", "bench/choose_model.py",
                                    "bench/plan_streaming.py", "bench/call_costs.py",
                                    "bench/stream_latency.py", "tools/build_catalog.py", "tools/demo.py",
                                    "tools/mutate.py", "tools/start.py", "models_server.py", "awesome_chat.py"])
def test_every_script_answers_help_without_side_effects(script):
    before = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    run = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=30,
                         cwd=ROOT)
    assert run.returncode == 0 and run.stdout.startswith("usage:"), run.stderr
    after = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before  # nothing written (the catalog builder used to rewrite its file)
