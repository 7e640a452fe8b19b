"""config.py in-process: where each secret and endpoint comes from, in which order, and what is never shown.

Each test writes a config file and loads it with an environment of its own (never the machine's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hugginggpt.config import PLACEHOLDER_PREFIX, load_config
from hugginggpt.errors import ConfigError

PLACEHOLDER = PLACEHOLDER_PREFIX + "YOUR_KEY"


def config_of(tmp_path: Path, text: str, env: dict[str, str] | None = None, **kw):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, env=env or {}, **kw)


def test_a_pasted_secret_loses_its_spaces_and_newline_wherever_it_comes_from(tmp_path):
    assert config_of(tmp_path, 'openai: {api_key: "sk-filekey1  \\n"}\n').llm.api_key == "sk-filekey1"
    assert config_of(tmp_path, "openai: {api_key: null}\n", {"OPENAI_API_KEY": " sk-envkey2\n"}).llm.api_key == \
        "sk-envkey2"
    hf = config_of(tmp_path, 'openai: {api_key: k}\nhuggingface: {token: "hf_abc \\n"}\n')
    assert hf.huggingface_token == "hf_abc"


def test_the_file_s_key_comes_before_the_environment_s(tmp_path):
    both = config_of(tmp_path, "openai: {api_key: sk-from-file}\n", {"OPENAI_API_KEY": "sk-from-env"})
    assert both.llm.api_key == "sk-from-file"
    placeholder = config_of(tmp_path, f"openai: {{api_key: {PLACEHOLDER}}}\n", {"OPENAI_API_KEY": "sk-from-env"})
    assert placeholder.llm.api_key == "sk-from-env"  # the shipped placeholder is no key


def test_hugging_face_tokens_the_placeholder_is_none_and_the_environment_fills_in(tmp_path):
    text = f"openai: {{api_key: k}}\nhuggingface: {{token: {PLACEHOLDER}}}\n"
    assert config_of(tmp_path, text).huggingface_token is None
    assert config_of(tmp_path, text, {"HUGGINGFACE_ACCESS_TOKEN": "hf_access"}).huggingface_token == "hf_access"
    assert config_of(tmp_path, text, {"HF_TOKEN": "hf_plain"}).huggingface_token == "hf_plain"
    assert config_of(tmp_path, "openai: {api_key: k}\nhuggingface: {token: hf_file}\n",
                     {"HF_TOKEN": "hf_plain"}).huggingface_token == "hf_file"


def test_placeholder_api_tokens_turn_no_authentication_on(tmp_path):
    text = f"openai: {{api_key: k}}\napi_tokens: [{PLACEHOLDER}, real-token-1]\n"
    assert config_of(tmp_path, text).api_tokens == ("real-token-1",)
    only = config_of(tmp_path, f"openai: {{api_key: k}}\napi_tokens: [{PLACEHOLDER}]\n")
    assert only.api_tokens == ()
    assert config_of(tmp_path, "openai: {api_key: k}\n", {"HUGGINGGPT_API_TOKENS": "a, b"}).api_tokens == ("a", "b")


AZURE = ("azure: {api_key: az-key, base_url: 'https://res.openai.azure.com', deployment_name: gpt4o, "
         "api_version: '2025-01-01-preview'}\n")


def test_azure_is_read_whole_and_chosen_over_a_local_section_unless_dev(tmp_path):
    azure = config_of(tmp_path, AZURE + "local: {endpoint: 'http://127.0.0.1:8006/v1'}\n").llm
    assert (azure.api_type, azure.api_key, azure.endpoint) == ("azure", "az-key", "https://res.openai.azure.com")
    assert (azure.azure_deployment, azure.azure_api_version) == ("gpt4o", "2025-01-01-preview")
    dev = config_of(tmp_path, AZURE + "local: {endpoint: 'http://127.0.0.1:8006/v1'}\ndev: true\n").llm
    assert dev.api_type == "local" and dev.endpoint == "http://127.0.0.1:8006/v1"
    default_version = config_of(tmp_path, "azure: {api_key: k, base_url: 'https://r.openai.azure.com', "
                                          "deployment_name: d}\n").llm
    assert default_version.azure_api_version == "2024-06-01"


def test_azure_s_key_may_come_from_its_environment_variable_and_each_missing_part_is_named(tmp_path):
    text = "azure: {base_url: 'https://r.openai.azure.com', deployment_name: d}\n"
    assert config_of(tmp_path, text, {"AZURE_OPENAI_API_KEY": "az-env"}).llm.api_key == "az-env"
    with pytest.raises(ConfigError, match=r"`azure.api_key` is missing \(or set AZURE_OPENAI_API_KEY\)"):
        config_of(tmp_path, text)
    with pytest.raises(ConfigError, match=r"`azure.base_url` is missing"):
        config_of(tmp_path, "azure: {api_key: k, deployment_name: d}\n")
    with pytest.raises(ConfigError, match=r"`azure.deployment_name` is missing"):
        config_of(tmp_path, "azure: {api_key: k, base_url: 'https://r.openai.azure.com'}\n")


def test_the_start_up_summary_never_shows_credentials_in_the_endpoint(tmp_path):
    llm = config_of(tmp_path, "local: {endpoint: 'http://alice:s3cret@10.0.0.5:8006/v1', api_key: sk-local}\n"
                              "dev: true\nmodel: m\n").llm
    line = llm.summary()
    assert "s3cret" not in line and "alice" not in line and "10.0.0.5:8006" in line
    assert line.endswith("model m, with an API key")
    shown = llm.redacted()
    assert "s3cret" not in str(shown) and shown["api_key"] == "set"


def test_the_millisecond_settings_take_their_edges(tmp_path):
    for key in ("batch_wait_ms", "progress_interval_ms"):
        for value in (0, 1000):
            assert getattr(config_of(tmp_path, f"openai: {{api_key: k}}\n{key}: {value}\n"), key) == float(value)
        with pytest.raises(ConfigError, match=f"`{key}` must be a number of milliseconds from 0 to 1000"):
            config_of(tmp_path, f"openai: {{api_key: k}}\n{key}: 1000.5\n")


def test_compute_threads_is_a_positive_count_or_the_devices_default(tmp_path):
    assert config_of(tmp_path, "").compute_threads is None  # the models server takes the device's default
    assert config_of(tmp_path, "compute_threads: 3").compute_threads == 3
    for line, words in (("compute_threads: 0", "`compute_threads` must be a positive whole number"),
                        ("compute_threads: -2", "`compute_threads` must be a positive whole number"),
                        ("compute_threads: many", "`compute_threads` must be a int")):
        with pytest.raises(ConfigError, match=words):
            config_of(tmp_path, line)
