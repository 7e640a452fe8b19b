"""config.py in-process: every key's default, limits and error line, where each secret and endpoint comes from,
in which order, and what is never shown.

Each test writes a config file and loads it with an environment of its own (never the machine's). An error is
checked as the one line a user reads: the file, then the key and what it must be."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from hugginggpt.backends.hosted import known_providers
from hugginggpt.config import (
    PLACEHOLDER_PREFIX,
    PROJECT_ROOT,
    Config,
    HttpLimits,
    LLMSettings,
    load_config,
    unknown_keys,
)
from hugginggpt.errors import ConfigError, NoLLMConfigured

PLACEHOLDER = PLACEHOLDER_PREFIX + "YOUR_KEY"
OPENAI = "openai: {api_key: k}\n"  # the one key a config needs for everything else to be read


def config_of(tmp_path: Path, text: str, env: dict[str, str] | None = None, **kw):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, env=env or {}, **kw)


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None, **kw) -> str:
    """The one line a user reads for a bad config, with the file's path replaced by `<file>`."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env=env or {}, **kw)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return "<file>: " + message[len(f"{path}: "):]


def in_project(tmp_path: Path, text: str, env: dict[str, str] | None = None, **kw) -> Config:
    """A config as shipped: `<project>/configs/c.yaml`, so its root is `<project>` (tmp_path / "proj")."""
    folder = tmp_path / "proj" / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "c.yaml"
    path.write_text(text)
    return load_config(path, env=env or {}, **kw)


# -- secrets: where each comes from and in which order ----------------------------------------------------------


def test_a_pasted_secret_loses_its_spaces_and_newline_wherever_it_comes_from(tmp_path):
    assert config_of(tmp_path, 'openai: {api_key: "sk-filekey1  \\n"}\n').llm.api_key == "sk-filekey1"
    assert config_of(tmp_path, "openai: {api_key: null}\n", {"OPENAI_API_KEY": " sk-envkey2\n"}).llm.api_key == \
        "sk-envkey2"
    hf = config_of(tmp_path, 'openai: {api_key: k}\nhuggingface: {token: "hf_abc \\n"}\n')
    assert hf.huggingface_token == "hf_abc"
    token = config_of(tmp_path, OPENAI + 'models_server_token: " ms-tok\\n"\n')
    assert token.models_server_token == "ms-tok"
    local = config_of(tmp_path, "local: {endpoint: 'http://h:1/v1', api_key: \" sk-loc \"}\n")
    assert local.llm.api_key == "sk-loc"
    azure = config_of(tmp_path, "azure: {api_key: \" az \", base_url: 'https://r.openai.azure.com', "
                                "deployment_name: d}\n")
    assert azure.llm.api_key == "az"


def test_the_file_s_key_comes_before_the_environment_s(tmp_path):
    both = config_of(tmp_path, "openai: {api_key: sk-from-file}\n", {"OPENAI_API_KEY": "sk-from-env"})
    assert both.llm.api_key == "sk-from-file"
    placeholder = config_of(tmp_path, f"openai: {{api_key: {PLACEHOLDER}}}\n", {"OPENAI_API_KEY": "sk-from-env"})
    assert placeholder.llm.api_key == "sk-from-env"  # the shipped placeholder is no key


def test_a_key_that_is_not_text_is_no_key(tmp_path):
    # a number or a list where the key belongs is not sent as a key: the user is told the key is missing
    for value in ("12345", "[sk-a, sk-b]", "''", "true"):
        assert error_of(tmp_path, f"openai: {{api_key: {value}}}\n") == (
            "<file>: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY)")
        assert config_of(tmp_path, f"openai: {{api_key: {value}}}\n", {"OPENAI_API_KEY": "sk-env"}).llm.api_key == \
            "sk-env"


def test_a_placeholder_or_empty_key_in_the_environment_is_no_key_either(tmp_path):
    for env_value in (PLACEHOLDER, ""):
        assert error_of(tmp_path, "openai: {}\n", {"OPENAI_API_KEY": env_value}) == (
            "<file>: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY)")
    assert error_of(tmp_path, "azure: {base_url: 'https://r.openai.azure.com', deployment_name: d}\n",
                    {"AZURE_OPENAI_API_KEY": PLACEHOLDER}) == (
        "<file>: `azure.api_key` is missing (or set AZURE_OPENAI_API_KEY)")


def test_an_explicit_environment_is_the_whole_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-process")
    monkeypatch.setenv("HF_TOKEN", "hf-process")
    monkeypatch.delenv("HUGGINGFACE_ACCESS_TOKEN", raising=False)
    with pytest.raises(NoLLMConfigured):
        config_of(tmp_path, "openai: {}\n", {"UNRELATED": "x"})
    assert config_of(tmp_path, OPENAI, {"UNRELATED": "x"}).huggingface_token is None
    # without one, the process's environment is read
    path = tmp_path / "config.yaml"
    path.write_text("openai: {}\n")
    assert load_config(path).llm.api_key == "sk-process"
    assert load_config(path).huggingface_token == "hf-process"


def test_hugging_face_tokens_the_placeholder_is_none_and_the_environment_fills_in(tmp_path):
    text = f"openai: {{api_key: k}}\nhuggingface: {{token: {PLACEHOLDER}}}\n"
    assert config_of(tmp_path, text).huggingface_token is None
    assert config_of(tmp_path, text, {"HUGGINGFACE_ACCESS_TOKEN": "hf_access"}).huggingface_token == "hf_access"
    assert config_of(tmp_path, text, {"HF_TOKEN": "hf_plain"}).huggingface_token == "hf_plain"
    assert config_of(tmp_path, "openai: {api_key: k}\nhuggingface: {token: hf_file}\n",
                     {"HF_TOKEN": "hf_plain"}).huggingface_token == "hf_file"


def test_hugging_face_token_order_is_file_then_access_token_then_hf_token(tmp_path):
    both = {"HUGGINGFACE_ACCESS_TOKEN": "hf_access", "HF_TOKEN": "hf_plain"}
    assert config_of(tmp_path, OPENAI, both).huggingface_token == "hf_access"
    assert config_of(tmp_path, OPENAI + "huggingface: {token: hf_file}\n", both).huggingface_token == "hf_file"
    assert config_of(tmp_path, OPENAI, {"HUGGINGFACE_ACCESS_TOKEN": PLACEHOLDER, "HF_TOKEN": "hf_plain"}) \
        .huggingface_token == "hf_plain"
    assert config_of(tmp_path, OPENAI, {"OPENAI_API_KEY": "sk-x"}).huggingface_token is None


def test_the_models_server_token_comes_from_the_file_then_its_environment_variable(tmp_path):
    assert config_of(tmp_path, OPENAI).models_server_token is None
    assert config_of(tmp_path, OPENAI, {"HUGGINGGPT_MODELS_TOKEN": "ms-env"}).models_server_token == "ms-env"
    assert config_of(tmp_path, OPENAI + "models_server_token: ms-file\n",
                     {"HUGGINGGPT_MODELS_TOKEN": "ms-env"}).models_server_token == "ms-file"
    assert config_of(tmp_path, OPENAI + f"models_server_token: {PLACEHOLDER}\n",
                     {"HUGGINGGPT_MODELS_TOKEN": "ms-env"}).models_server_token == "ms-env"
    assert config_of(tmp_path, OPENAI + f"models_server_token: {PLACEHOLDER}\n").models_server_token is None
    assert config_of(tmp_path, OPENAI, {"HUGGINGGPT_MODELS_TOKEN": PLACEHOLDER}).models_server_token is None


def test_placeholder_api_tokens_turn_no_authentication_on(tmp_path):
    text = f"openai: {{api_key: k}}\napi_tokens: [{PLACEHOLDER}, real-token-1]\n"
    assert config_of(tmp_path, text).api_tokens == ("real-token-1",)
    only = config_of(tmp_path, f"openai: {{api_key: k}}\napi_tokens: [{PLACEHOLDER}]\n")
    assert only.api_tokens == ()
    assert config_of(tmp_path, "openai: {api_key: k}\n", {"HUGGINGGPT_API_TOKENS": "a, b"}).api_tokens == ("a", "b")


def test_api_tokens_in_the_file_win_over_the_environment(tmp_path):
    env = {"HUGGINGGPT_API_TOKENS": "env-1,env-2"}
    assert config_of(tmp_path, OPENAI + "api_tokens: [file-1]\n", env).api_tokens == ("file-1",)
    assert config_of(tmp_path, OPENAI + "api_tokens: 'file-1, file-2'\n", env).api_tokens == ("file-1", "file-2")
    assert config_of(tmp_path, OPENAI + "api_tokens: null\n", env).api_tokens == ("env-1", "env-2")
    assert config_of(tmp_path, OPENAI, {"HUGGINGGPT_API_TOKENS": f"{PLACEHOLDER},,t3"}).api_tokens == ("t3",)
    assert config_of(tmp_path, OPENAI, {"HUGGINGGPT_API_TOKENS": ""}).api_tokens == ()
    assert config_of(tmp_path, OPENAI, {"OPENAI_API_KEY": "sk"}).api_tokens == ()


# -- which LLM backend, and its endpoint ------------------------------------------------------------------------

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


def test_azure_is_chosen_over_openai_and_takes_the_common_llm_keys(tmp_path):
    llm = config_of(tmp_path, AZURE + "openai: {api_key: sk-openai}\nmodel: gpt-4o\nllm_timeout: 30\n"
                                      "llm_max_retries: 0\nuse_completion: true\n").llm
    assert llm == LLMSettings(api_type="azure", api_key="az-key", endpoint="https://res.openai.azure.com",
                              model="gpt-4o", use_completion=True, azure_deployment="gpt4o",
                              azure_api_version="2025-01-01-preview", timeout=30.0, max_retries=0)


def test_azure_s_key_may_come_from_its_environment_variable_and_each_missing_part_is_named(tmp_path):
    text = "azure: {base_url: 'https://r.openai.azure.com', deployment_name: d}\n"
    assert config_of(tmp_path, text, {"AZURE_OPENAI_API_KEY": "az-env"}).llm.api_key == "az-env"
    assert config_of(tmp_path, text.replace("{", "{api_key: az-file, "),
                     {"AZURE_OPENAI_API_KEY": "az-env"}).llm.api_key == "az-file"
    assert error_of(tmp_path, text) == "<file>: `azure.api_key` is missing (or set AZURE_OPENAI_API_KEY)"
    # an OpenAI key is not an Azure key
    assert error_of(tmp_path, text, {"OPENAI_API_KEY": "sk"}) == (
        "<file>: `azure.api_key` is missing (or set AZURE_OPENAI_API_KEY)")
    assert error_of(tmp_path, "azure: {api_key: k, deployment_name: d}\n") == (
        "<file>: `azure.base_url` is missing (your https://<resource>.openai.azure.com)")
    assert error_of(tmp_path, f"azure: {{api_key: k, base_url: {PLACEHOLDER}, deployment_name: d}}\n") == (
        "<file>: `azure.base_url` is missing (your https://<resource>.openai.azure.com)")
    assert error_of(tmp_path, "azure: {api_key: k, base_url: 'https://r.openai.azure.com'}\n") == (
        "<file>: `azure.deployment_name` is missing")
    assert error_of(tmp_path, f"azure: {{api_key: k, base_url: 'https://r.openai.azure.com', "
                              f"deployment_name: {PLACEHOLDER}}}\n") == "<file>: `azure.deployment_name` is missing"


def test_an_empty_azure_section_still_means_azure(tmp_path):
    assert error_of(tmp_path, "azure:\n") == "<file>: `azure.api_key` is missing (or set AZURE_OPENAI_API_KEY)"
    assert error_of(tmp_path, "azure:\n", {"AZURE_OPENAI_API_KEY": "az"}) == (
        "<file>: `azure.base_url` is missing (your https://<resource>.openai.azure.com)")


def test_a_missing_llm_key_is_no_llm_configured_so_the_offline_demo_can_start(tmp_path):
    for text in ("openai: {}\n", "azure: {}\n", "dev: true\n", "local: {endpoint: ''}\n",
                 "azure: {api_key: k}\n", "azure: {api_key: k, base_url: 'https://r'}\n"):
        path = tmp_path / "config.yaml"
        path.write_text(text)
        with pytest.raises(NoLLMConfigured):
            load_config(path, env={})
    # a wrong value is not "no LLM": it is a plain config error
    with pytest.raises(ConfigError) as info:
        config_of(tmp_path, OPENAI + "max_tasks: 0\n")
    assert type(info.value) is ConfigError


def test_openai_reads_its_key_and_base_url_as_written(tmp_path):
    llm = config_of(tmp_path, "openai: {api_key: sk-1, base_url: 'https://proxy.example/v1/'}\n").llm
    assert llm == LLMSettings(api_type="openai", api_key="sk-1", endpoint="https://proxy.example/v1/")
    assert config_of(tmp_path, "openai: {api_key: sk-1}\n").llm.endpoint is None
    assert error_of(tmp_path, "openai: {}\n") == (
        "<file>: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY)")
    assert error_of(tmp_path, "openai:\n") == (
        "<file>: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY)")


def test_a_local_section_alone_means_a_local_server_with_an_optional_key(tmp_path):
    keyless = config_of(tmp_path, "local: {endpoint: 'http://localhost:8006/v1'}\n").llm
    assert keyless == LLMSettings(api_type="local", endpoint="http://localhost:8006/v1")
    from_env = config_of(tmp_path, "local: {endpoint: 'http://localhost:8006/v1'}\n", {"OPENAI_API_KEY": "sk-env"})
    assert from_env.llm.api_key == "sk-env"
    own = config_of(tmp_path, "local: {endpoint: 'http://localhost:8006/v1', api_key: sk-own}\n",
                    {"OPENAI_API_KEY": "sk-env"})
    assert own.llm.api_key == "sk-own"
    placeholder = config_of(tmp_path, f"local: {{endpoint: 'http://h:1/v1', api_key: {PLACEHOLDER}}}\n")
    assert placeholder.llm.api_key is None
    # an openai section next to it wins unless dev is set
    openai = config_of(tmp_path, "local: {endpoint: 'http://h:1/v1'}\nopenai: {api_key: sk-o}\n").llm
    assert (openai.api_type, openai.endpoint, openai.api_key) == ("openai", None, "sk-o")
    dev = config_of(tmp_path, "local: {endpoint: 'http://h:1/v1'}\nopenai: {api_key: sk-o}\ndev: true\n").llm
    assert (dev.api_type, dev.endpoint, dev.api_key) == ("local", "http://h:1/v1", None)
    not_dev = config_of(tmp_path, "local: {endpoint: 'http://h:1/v1'}\ndev: false\n").llm
    assert not_dev.api_type == "local"


def test_dev_without_a_local_endpoint_says_what_to_write(tmp_path):
    expected = "<file>: `local.endpoint` is required for a local LLM (e.g. http://localhost:8006/v1)"
    assert error_of(tmp_path, "dev: true\n") == expected
    assert error_of(tmp_path, OPENAI + "dev: true\n") == expected
    assert error_of(tmp_path, "local: {api_key: k}\n") == expected
    assert error_of(tmp_path, "local:\n") == expected


def test_no_backend_in_the_file_leaves_each_request_to_name_one(tmp_path):
    llm = config_of(tmp_path, "model: m\n").llm
    assert llm == LLMSettings(api_type=None, model="m")
    assert config_of(tmp_path, "", {"OPENAI_API_KEY": " sk-env "}).llm.api_key == "sk-env"
    assert config_of(tmp_path, "", {"OPENAI_API_KEY": PLACEHOLDER}).llm.api_key is None
    assert llm.summary() == "none configured: each request names its own (api_type, api_endpoint, api_key)"


def test_the_models_server_reads_no_llm_keys(tmp_path):
    config = config_of(tmp_path, "openai: {}\nmodel: 5\n", {"OPENAI_API_KEY": "sk"}, need_llm=False)
    assert config.llm == LLMSettings(api_type=None)
    assert config.llm.api_key is None
    # the keys it shares with the LLM are still checked, with the same line
    assert error_of(tmp_path, "url_allowlist: {a: b}\n", need_llm=False) == (
        "<file>: `url_allowlist` must be a list of strings")


@pytest.mark.parametrize("text, attribute, expected", [
    ("", "model", "gpt-4o-mini"),
    ("model: qwen2.5:7b-instruct\n", "model", "qwen2.5:7b-instruct"),
    ("", "use_completion", False),
    ("use_completion: true\n", "use_completion", True),
    ("", "timeout", 120.0),
    ("llm_timeout: 45\n", "timeout", 45.0),
    ("llm_timeout: 2.5\n", "timeout", 2.5),
    ("", "max_retries", 3),
    ("llm_max_retries: 0\n", "max_retries", 0),
    ("", "max_context_tokens", None),
    ("max_context_tokens: 8192\n", "max_context_tokens", 8192),
    ("", "url_allowlist", ()),
    ("url_allowlist: [10.0.0.0/8, gpu-box]\n", "url_allowlist", ("10.0.0.0/8", "gpu-box")),
    ("", "trusted", True),
    ("", "azure_deployment", None),
])
def test_llm_keys_read_back_exactly(tmp_path, text, attribute, expected):
    value = getattr(config_of(tmp_path, OPENAI + text).llm, attribute)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text, message", [
    ("model: 5\n", "`model` must be a str, got 5"),
    ("use_completion: 'yes'\n", "`use_completion` must be a bool, got 'yes'"),
    ("llm_timeout: soon\n", "`llm_timeout` must be a float, got 'soon'"),
    ("llm_timeout: true\n", "`llm_timeout` must be a float, got True"),
    ("llm_max_retries: 1.5\n", "`llm_max_retries` must be a int, got 1.5"),
    ("llm_max_retries: false\n", "`llm_max_retries` must be a int, got False"),
    ("url_allowlist: {a: b}\n", "`url_allowlist` must be a list of strings"),
])
def test_llm_keys_of_the_wrong_type_name_the_key(tmp_path, text, message):
    assert error_of(tmp_path, OPENAI + text) == f"<file>: {message}"


# -- what is shown of the LLM settings ----------------------------------------------------------------------------


def test_the_start_up_summary_never_shows_credentials_in_the_endpoint(tmp_path):
    llm = config_of(tmp_path, "local: {endpoint: 'http://alice:s3cret@10.0.0.5:8006/v1', api_key: sk-local}\n"
                              "dev: true\nmodel: m\n").llm
    line = llm.summary()
    assert line == "local at http://***@10.0.0.5:8006/v1, model m, with an API key"
    shown = llm.redacted()
    assert shown == {"api_type": "local", "endpoint": "http://***@10.0.0.5:8006/v1", "model": "m", "api_key": "set"}


def test_the_summary_names_kind_place_model_and_whether_a_key_is_sent(tmp_path):
    openai = config_of(tmp_path, "openai: {api_key: sk-secret-123}\n").llm
    assert openai.summary() == "openai at https://api.openai.com/v1, model gpt-4o-mini, with an API key"
    assert openai.redacted() == {"api_type": "openai", "endpoint": None, "model": "gpt-4o-mini", "api_key": "set"}
    keyless = config_of(tmp_path, "local: {endpoint: 'http://gpu:8006/v1?api_key=sk-in-url&x=1'}\nmodel: q\n").llm
    assert keyless.summary() == "local at http://gpu:8006/v1?api_key=***&x=1, model q, no API key"
    assert keyless.redacted() == {"api_type": "local", "endpoint": "http://gpu:8006/v1?api_key=***&x=1",
                                  "model": "q", "api_key": "unset"}
    azure = config_of(tmp_path, AZURE).llm
    assert azure.summary() == "azure at https://res.openai.azure.com, model gpt-4o-mini, with an API key"
    # an empty base_url is shown as the file has it, and the summary falls back to OpenAI's address
    empty = config_of(tmp_path, "openai: {api_key: sk-1, base_url: ''}\n").llm
    assert empty.redacted()["endpoint"] == ""
    assert empty.summary() == "openai at https://api.openai.com/v1, model gpt-4o-mini, with an API key"


def test_no_secret_is_in_what_is_shown(tmp_path):
    secrets = ("sk-secret-123", "s3cret", "tok-99")
    llm = config_of(tmp_path, "local: {endpoint: 'https://bob:s3cret@h/v1?token=tok-99', api_key: sk-secret-123}\n"
                              "dev: true\n").llm
    for shown in (llm.summary(), str(llm.redacted())):
        assert not any(secret in shown for secret in secrets), shown
    assert llm.redacted()["endpoint"] == "https://***@h/v1?token=***"


# -- every other key: defaults, values, limits and errors ---------------------------------------------------------


@pytest.mark.parametrize("attribute, expected", [
    ("huggingface_token", None), ("huggingface_base_url", None), ("huggingface_providers", ()),
    ("huggingface_router_url", None), ("inference_mode", "hybrid"), ("local_deployment", "full"), ("device", "cpu"),
    ("num_candidate_models", 5), ("max_description_length", 100), ("proxy", None), ("http_host", "0.0.0.0"),
    ("http_port", 8004), ("models_host", "localhost"), ("models_port", 8005),
    ("logit_bias", {"parse_task": 0.0, "choose_model": 0.0}), ("tprompt", {}), ("prompt", {}), ("dev", False),
    ("debug", False), ("log_file", None), ("request_timeout", 600.0), ("task_timeout", 300.0),
    ("status_timeout", 2.0), ("status_cache_seconds", 30.0), ("max_workers", 8), ("max_body_bytes", 10485760),
    ("max_fetch_bytes", 20971520), ("fetch_timeout", 15.0), ("memory_budget_gb", None), ("batch_wait_ms", 5.0),
    ("max_batch_size", 32), ("compute_threads", None), ("progress_interval_ms", 250.0), ("semantic_ranking", True),
    ("embedding_precision", "int8"), ("preferred_language", None), ("max_model_size_mb", None),
    ("url_allowlist", ()), ("allow_request_endpoints", True), ("api_tokens", ()), ("models_server_token", None),
    ("cors_origins", ()), ("allowed_hosts", ()), ("models_server_hosts", ()), ("upload_quota_bytes", 1073741824),
    ("max_image_pixels", 40000000), ("max_output_bytes", 209715200), ("warnings", ()),
    ("max_concurrent_requests", 64), ("structured_output", "auto"), ("choose_model", "auto"), ("max_replans", 1),
    ("stream_plan", True), ("planner_max_tokens", None), ("max_tasks", 32), ("allowed_models", ()),
    ("denied_models", ()), ("choose_model_margin", 0.01), ("http_threads", None), ("http_workers", 1),
    ("http_connection_limit", 1000), ("http_header_timeout", 10.0), ("http_read_timeout", 120.0),
    ("http_idle_timeout", 60.0), ("http_connections_per_client", None), ("discovered_models", "hosted"),
    ("discovered_authors_allow", ()), ("discovered_authors_deny", ()), ("catalog_refresh_hours", 0.0),
    ("catalog_sync_tasks", ()), ("catalog_sync_per_task", None), ("catalog_endpoint", None), ("catalog_weights", {}),
])
def test_each_key_s_default_with_only_the_required_keys(tmp_path, attribute, expected):
    value = getattr(config_of(tmp_path, OPENAI), attribute)
    assert value == expected and type(value) is type(expected)


def test_the_default_paths_are_the_shipped_names_under_the_root(tmp_path):
    root = tmp_path / "proj"
    for name in ("demos/demo_parse_task.json", "demos/demo_choose_model.json", "demos/demo_response_results.json",
                 "data/p0_models.jsonl", "data/catalog.sqlite"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    for name in ("public", "models", ".cache"):
        (root / name).mkdir()
    config = in_project(tmp_path, OPENAI)
    assert config.root == root and config.path == root / "configs" / "c.yaml"
    assert config.demos == {stage: root / "demos" / f"demo_{stage}.json"
                            for stage in ("parse_task", "choose_model", "response_results")}
    assert (config.public_dir, config.catalog_path, config.local_models_dir, config.cache_dir, config.catalog_store) \
        == (root / "public", root / "data/p0_models.jsonl", root / "models", root / ".cache",
            root / "data/catalog.sqlite")


def test_a_default_path_missing_beside_the_config_is_the_project_s(tmp_path):
    config = in_project(tmp_path, OPENAI)
    assert config.demos["parse_task"] == PROJECT_ROOT / "demos" / "demo_parse_task.json"
    assert config.public_dir == PROJECT_ROOT / "public"
    assert config.catalog_path == PROJECT_ROOT / "data" / "p0_models.jsonl"
    assert config.log_file is None


def test_a_relative_path_resolves_beside_the_root_then_the_config_then_the_project(tmp_path):
    root, beside = tmp_path / "proj", tmp_path / "proj" / "configs"
    beside.mkdir(parents=True)
    (beside / "only-beside").mkdir()
    (beside / "both").mkdir()
    (root / "both").mkdir()
    config = in_project(tmp_path, OPENAI + "public_dir: both\ncache_dir: only-beside\nlocal_models_dir: nowhere\n"
                                           "catalog: demos\nlog_file: logs/run.log\ncatalog_store: /abs/store.db\n"
                                           "demos_or_presteps: {parse_task: only-beside, choose_model: d.json}\n")
    assert config.public_dir == root / "both"
    assert config.cache_dir == beside / "only-beside"
    assert config.local_models_dir == root / "nowhere"  # nowhere yet: where it will be made
    assert config.catalog_path == PROJECT_ROOT / "demos"
    assert config.log_file == root / "logs" / "run.log"
    assert config.catalog_store == Path("/abs/store.db")
    assert config.demos["parse_task"] == beside / "only-beside"
    assert config.demos["choose_model"] == root / "d.json"
    assert config.demos["response_results"] == PROJECT_ROOT / "demos" / "demo_response_results.json"


def test_root_is_the_config_folder_s_parent_unless_set_and_a_relative_root_is_beside_the_config(tmp_path):
    folder = tmp_path / "proj" / "configs"
    assert in_project(tmp_path, OPENAI).root == tmp_path / "proj"
    assert in_project(tmp_path, OPENAI + "root: .\n").root == folder
    assert in_project(tmp_path, OPENAI + "root: ../../elsewhere\n").root == tmp_path / "elsewhere"
    assert in_project(tmp_path, OPENAI + f"root: {tmp_path / 'abs'}\n").root == tmp_path / "abs"
    (folder / "pub").mkdir()
    assert in_project(tmp_path, OPENAI + "root: .\npublic_dir: pub\n").public_dir == folder / "pub"


@pytest.mark.parametrize("text, attribute, expected", [
    ("huggingface: {base_url: 'http://tgi:8080'}\n", "huggingface_base_url", "http://tgi:8080"),
    ("huggingface: {router_url: 'https://router.example/'}\n", "huggingface_router_url", "https://router.example"),
    ("huggingface: {router_url: 'http://r.local:9/v1//'}\n", "huggingface_router_url", "http://r.local:9/v1"),
    ("huggingface: {router_url: 'https://router.example'}\n", "huggingface_router_url", "https://router.example"),
    ("huggingface: {router_url: 'https://router.example/hub/X/'}\n", "huggingface_router_url",
     "https://router.example/hub/X"),
    ("inference_mode: local\n", "inference_mode", "local"),
    ("inference_mode: huggingface\n", "inference_mode", "huggingface"),
    ("inference_mode: hybrid\n", "inference_mode", "hybrid"),
    ("local_deployment: minimal\n", "local_deployment", "minimal"),
    ("local_deployment: standard\n", "local_deployment", "standard"),
    ("device: cuda:1\n", "device", "cuda:1"),
    ("device: 0\n", "device", "0"),
    ("num_candidate_models: 2\n", "num_candidate_models", 2),
    ("max_description_length: 250\n", "max_description_length", 250),
    ("proxy: 'http://proxy:3128'\n", "proxy", "http://proxy:3128"),
    ("http_listen: {host: 127.0.0.1, port: 9000}\n", "http_host", "127.0.0.1"),
    ("http_listen: {host: 127.0.0.1, port: 9000}\n", "http_port", 9000),
    ("http_listen: null\n", "http_port", 8004),
    ("http_listen: 9000\n", "http_port", 8004),
    ("local_inference_endpoint: {host: gpu-box, port: 7000}\n", "models_host", "gpu-box"),
    ("local_inference_endpoint: {host: gpu-box, port: 7000}\n", "models_port", 7000),
    ("logit_bias: {parse_task: 0.1, choose_model: 5}\n", "logit_bias", {"parse_task": 0.1, "choose_model": 5.0}),
    ("tprompt: {parse_task: 'Plan: {{input}}'}\n", "tprompt", {"parse_task": "Plan: {{input}}"}),
    ("prompt: {choose_model: 'Pick one', response_results: R}\n", "prompt",
     {"choose_model": "Pick one", "response_results": "R"}),
    ("tprompt: null\n", "tprompt", {}),
    ("dev: true\nlocal: {endpoint: 'http://h:1/v1'}\n", "dev", True),
    ("debug: true\n", "debug", True),
    ("debug: 1\n", "debug", True),
    ("request_timeout: 60\n", "request_timeout", 60.0),
    ("task_timeout: 12.5\n", "task_timeout", 12.5),
    ("status_timeout: 1\n", "status_timeout", 1.0),
    ("status_cache_seconds: 0\n", "status_cache_seconds", 0.0),
    ("max_workers: 2\n", "max_workers", 2),
    ("max_body_bytes: 1024\n", "max_body_bytes", 1024),
    ("max_fetch_bytes: 2048\n", "max_fetch_bytes", 2048),
    ("fetch_timeout: 3\n", "fetch_timeout", 3.0),
    ("memory_budget_gb: 12\n", "memory_budget_gb", 12.0),
    ("memory_budget_gb: 0.5\n", "memory_budget_gb", 0.5),
    ("batch_wait_ms: 12.5\n", "batch_wait_ms", 12.5),
    ("max_batch_size: 1\n", "max_batch_size", 1),
    ("compute_threads: 3\n", "compute_threads", 3),
    ("progress_interval_ms: 100\n", "progress_interval_ms", 100.0),
    ("semantic_ranking: false\n", "semantic_ranking", False),
    ("embedding_precision: fp32\n", "embedding_precision", "fp32"),
    ("model_constraints: {language: de, max_size_mb: 500}\n", "preferred_language", "de"),
    ("model_constraints: {language: de, max_size_mb: 500}\n", "max_model_size_mb", 500),
    ("url_allowlist: 'a.example, 10.0.0.0/8 ,,'\n", "url_allowlist", ("a.example", "10.0.0.0/8")),
    ("url_allowlist: [a.example, 8080, ' b ']\n", "url_allowlist", ("a.example", "8080", "b")),
    ("url_allowlist: []\n", "url_allowlist", ()),
    ("allow_request_endpoints: false\n", "allow_request_endpoints", False),
    ("cors_origins: ['https://app.example']\n", "cors_origins", ("https://app.example",)),
    ("allowed_hosts: [jarvis.example, 10.1.2.3]\n", "allowed_hosts", ("jarvis.example", "10.1.2.3")),
    ("models_server_hosts: models.internal\n", "models_server_hosts", ("models.internal",)),
    ("upload_quota_mb: 0.5\n", "upload_quota_bytes", 524288),
    ("upload_quota_mb: 2\n", "upload_quota_bytes", 2097152),
    ("max_image_pixels: 1000000\n", "max_image_pixels", 1000000),
    ("max_output_mb: 1\n", "max_output_bytes", 1048576),
    ("max_output_mb: 0.25\n", "max_output_bytes", 262144),
    ("max_concurrent_requests: 1\n", "max_concurrent_requests", 1),
    ("structured_output: 'on'\n", "structured_output", "on"),
    ("structured_output: 'off'\n", "structured_output", "off"),
    ("choose_model: llm\n", "choose_model", "llm"),
    ("choose_model: ranking\n", "choose_model", "ranking"),
    ("max_replans: 0\n", "max_replans", 0),
    ("max_replans: 3\n", "max_replans", 3),
    ("stream_plan: false\n", "stream_plan", False),
    ("planner_max_tokens: 512\n", "planner_max_tokens", 512),
    ("max_tasks: 1\n", "max_tasks", 1),
    ("allowed_models: ['google/*', openai/whisper-tiny]\n", "allowed_models", ("google/*", "openai/whisper-tiny")),
    ("denied_models: 'bad/*'\n", "denied_models", ("bad/*",)),
    ("choose_model_margin: 0\n", "choose_model_margin", 0.0),
    ("choose_model_margin: 0.2\n", "choose_model_margin", 0.2),
    ("http_threads: 4\n", "http_threads", 4),
    ("http_workers: 4\n", "http_workers", 4),
    ("http_connection_limit: 10\n", "http_connection_limit", 10),
    ("http_header_timeout: 2\n", "http_header_timeout", 2.0),
    ("http_read_timeout: 30.5\n", "http_read_timeout", 30.5),
    ("http_idle_timeout: 5\n", "http_idle_timeout", 5.0),
    ("http_connections_per_client: 4\n", "http_connections_per_client", 4),
    ("discovered_models: local\n", "discovered_models", "local"),
    ("discovered_models: 'off'\n", "discovered_models", "off"),
    ("discovered_authors_allow: [google, meta-llama]\n", "discovered_authors_allow", ("google", "meta-llama")),
    ("discovered_authors_deny: 'bad-org, Evil.Corp'\n", "discovered_authors_deny", ("bad-org", "Evil.Corp")),
    ("catalog_refresh_hours: 24\n", "catalog_refresh_hours", 24.0),
    ("catalog_sync: {tasks: [text-to-image, image-to-text], per_task: 50, endpoint: 'https://hub.local'}\n",
     "catalog_sync_tasks", ("text-to-image", "image-to-text")),
    ("catalog_sync: {tasks: [text-to-image], per_task: 50}\n", "catalog_sync_per_task", 50),
    ("catalog_sync: {endpoint: 'https://hub.local'}\n", "catalog_endpoint", "https://hub.local"),
    ("catalog_weights: {meaning: 2, popularity: 0.5}\n", "catalog_weights", {"meaning": 2.0, "popularity": 0.5}),
    ("catalog_weights: null\n", "catalog_weights", {}),
])
def test_a_valid_value_reads_back_exactly(tmp_path, text, attribute, expected):
    value = getattr(config_of(tmp_path, OPENAI + text), attribute)
    assert value == expected and type(value) is type(expected)
    if isinstance(value, dict):
        assert all(type(v) is type(expected[k]) for k, v in value.items())


@pytest.mark.parametrize("text, attribute, expected", [
    # milliseconds: 0 to 1000
    ("batch_wait_ms: 0\n", "batch_wait_ms", 0.0),
    ("batch_wait_ms: 1000\n", "batch_wait_ms", 1000.0),
    ("progress_interval_ms: 0\n", "progress_interval_ms", 0.0),
    ("progress_interval_ms: 1000\n", "progress_interval_ms", 1000.0),
    # seconds: above 0, at most a day
    ("http_header_timeout: 86400\n", "http_header_timeout", 86400.0),
    ("http_read_timeout: 0.001\n", "http_read_timeout", 0.001),
    ("http_idle_timeout: 86400\n", "http_idle_timeout", 86400.0),
    # positive whole numbers: 1 is the least
    ("max_batch_size: 1\n", "max_batch_size", 1),
    ("compute_threads: 1\n", "compute_threads", 1),
    ("planner_max_tokens: 1\n", "planner_max_tokens", 1),
    ("http_threads: 1\n", "http_threads", 1),
    ("http_connection_limit: 1\n", "http_connection_limit", 1),
    ("http_connections_per_client: 1\n", "http_connections_per_client", 1),
    ("catalog_sync: {per_task: 1}\n", "catalog_sync_per_task", 1),
    # workers: 1 to 32
    ("http_workers: 1\n", "http_workers", 1),
    ("http_workers: 32\n", "http_workers", 32),
    # one client may take every connection, no more
    ("http_connection_limit: 50\nhttp_connections_per_client: 50\n", "http_connections_per_client", 50),
    ("http_connections_per_client: 1000\n", "http_connections_per_client", 1000),
])
def test_a_value_at_its_limit_is_taken(tmp_path, text, attribute, expected):
    value = getattr(config_of(tmp_path, OPENAI + text), attribute)
    assert value == expected and type(value) is type(expected)


POSITIVE = "must be a positive whole number, got"


@pytest.mark.parametrize("text, message", [
    # just past a limit
    ("batch_wait_ms: -0.5\n", "`batch_wait_ms` must be a number of milliseconds from 0 to 1000 (default 5)"),
    ("batch_wait_ms: 1000.5\n", "`batch_wait_ms` must be a number of milliseconds from 0 to 1000 (default 5)"),
    ("progress_interval_ms: -1\n",
     "`progress_interval_ms` must be a number of milliseconds from 0 to 1000 (default 250)"),
    ("progress_interval_ms: 1001\n",
     "`progress_interval_ms` must be a number of milliseconds from 0 to 1000 (default 250)"),
    ("http_header_timeout: 0\n", "`http_header_timeout` must be a number of seconds above 0 (default 10)"),
    ("http_header_timeout: 86400.5\n", "`http_header_timeout` must be a number of seconds above 0 (default 10)"),
    ("http_read_timeout: -1\n", "`http_read_timeout` must be a number of seconds above 0 (default 120)"),
    ("http_idle_timeout: 86401\n", "`http_idle_timeout` must be a number of seconds above 0 (default 60)"),
    ("max_batch_size: 0\n", f"`max_batch_size` {POSITIVE} 0"),
    ("max_batch_size: -1\n", f"`max_batch_size` {POSITIVE} -1"),
    ("compute_threads: 0\n", f"`compute_threads` {POSITIVE} 0"),
    ("planner_max_tokens: 0\n", f"`planner_max_tokens` {POSITIVE} 0"),
    ("max_tasks: 0\n", f"`max_tasks` {POSITIVE} 0"),
    ("max_concurrent_requests: -3\n", f"`max_concurrent_requests` {POSITIVE} -3"),
    ("http_threads: 0\n", f"`http_threads` {POSITIVE} 0"),
    ("http_connection_limit: 0\n", f"`http_connection_limit` {POSITIVE} 0"),
    ("http_connections_per_client: 0\n", f"`http_connections_per_client` {POSITIVE} 0"),
    ("catalog_sync: {per_task: -1}\n", f"`catalog_sync.per_task` {POSITIVE} -1"),
    ("http_workers: 0\n", f"`http_workers` {POSITIVE} 0"),
    ("max_body_bytes: 0\n", f"`max_body_bytes` {POSITIVE} 0"),  # the MCP SDK refuses 0: a 500 on every call
    ("max_fetch_bytes: 0\n", f"`max_fetch_bytes` {POSITIVE} 0"),
    ("max_context_tokens: 0\n", f"`max_context_tokens` {POSITIVE} 0"),
    ("max_context_tokens: lots\n", "`max_context_tokens` must be a int, got 'lots'"),
    ("http_workers: 33\n", "`http_workers` must be at most 32 (each loads the ranking model), got 33"),
    ("http_connection_limit: 50\nhttp_connections_per_client: 51\n",
     "`http_connections_per_client` (51) must not exceed `http_connection_limit` (50)"),
    ("http_connections_per_client: 1001\n",
     "`http_connections_per_client` (1001) must not exceed `http_connection_limit` (1000)"),
    # the wrong type
    ("batch_wait_ms: true\n", "`batch_wait_ms` must be a number of milliseconds from 0 to 1000 (default 5)"),
    ("progress_interval_ms: soon\n",
     "`progress_interval_ms` must be a number of milliseconds from 0 to 1000 (default 250)"),
    ("http_read_timeout: true\n", "`http_read_timeout` must be a number of seconds above 0 (default 120)"),
    ("http_idle_timeout: '5'\n", "`http_idle_timeout` must be a number of seconds above 0 (default 60)"),
    ("max_tasks: 2.5\n", "`max_tasks` must be a int, got 2.5"),
    ("http_workers: true\n", "`http_workers` must be a int, got True"),
    ("num_candidate_models: many\n", "`num_candidate_models` must be a int, got 'many'"),
    ("max_description_length: 1.5\n", "`max_description_length` must be a int, got 1.5"),
    ("http_listen: {port: '80'}\n", "`http_listen.port` must be a int, got '80'"),
    ("local_inference_endpoint: {port: 80.5}\n", "`local_inference_endpoint.port` must be a int, got 80.5"),
    ("max_workers: true\n", "`max_workers` must be a int, got True"),
    ("max_body_bytes: 1e6\n", "`max_body_bytes` must be a int, got '1e6'"),
    ("max_fetch_bytes: [1]\n", "`max_fetch_bytes` must be a int, got [1]"),
    ("max_image_pixels: big\n", "`max_image_pixels` must be a int, got 'big'"),
    ("max_replans: false\n", "`max_replans` must be a int, got False"),
    ("request_timeout: true\n", "`request_timeout` must be a float, got True"),
    ("task_timeout: '30'\n", "`task_timeout` must be a float, got '30'"),
    ("status_timeout: [2]\n", "`status_timeout` must be a float, got [2]"),
    ("status_cache_seconds: x\n", "`status_cache_seconds` must be a float, got 'x'"),
    ("fetch_timeout: x\n", "`fetch_timeout` must be a float, got 'x'"),
    ("fetch_timeout: null\nrequest_timeout: no\n", "`request_timeout` must be a float, got False"),
    ("upload_quota_mb: lots\n", "`upload_quota_mb` must be a float, got 'lots'"),
    ("max_output_mb: true\n", "`max_output_mb` must be a float, got True"),
    ("choose_model_margin: '0.1'\n", "`choose_model_margin` must be a float, got '0.1'"),
    ("catalog_refresh_hours: daily\n", "`catalog_refresh_hours` must be a float, got 'daily'"),
    ("logit_bias: {parse_task: x}\n", "`logit_bias.parse_task` must be a float, got 'x'"),
    ("logit_bias: {choose_model: true}\n", "`logit_bias.choose_model` must be a float, got True"),
    ("allow_request_endpoints: 'no'\n", "`allow_request_endpoints` must be a bool, got 'no'"),
    ("stream_plan: 1\n", "`stream_plan` must be a bool, got 1"),
    ("memory_budget_gb: lots\n", "`memory_budget_gb` must be a number"),
    ("tprompt: {parse_task: 5}\n", "`tprompt.parse_task` must be a string"),
    ("prompt: {response_results: [a]}\n", "`prompt.response_results` must be a string"),
    ("cors_origins: {a: 1}\n", "`cors_origins` must be a list of strings"),
    ("allowed_hosts: [[a]]\n", "`allowed_hosts` must be a list of strings"),
    ("models_server_hosts: 5\n", "`models_server_hosts` must be a list of strings"),
    ("api_tokens: [{a: b}]\n", "`api_tokens` must be a list of strings"),
    ("allowed_models: true\n", "`allowed_models` must be a list of strings"),
    ("denied_models: {x: 1}\n", "`denied_models` must be a list of strings"),
    ("catalog_sync: {tasks: 3}\n", "`catalog_sync.tasks` must be a list of strings"),
    ("catalog_weights: [1, 2]\n", "`catalog_weights` must be a mapping of factor: weight"),
    ("catalog_weights: {meaning: true}\n", "`catalog_weights.meaning` must be a number, got True"),
    ("catalog_weights: {size: big}\n", "`catalog_weights.size` must be a number, got 'big'"),
    # one of a few words
    ("inference_mode: sometimes\n", "`inference_mode` must be one of local, huggingface, hybrid, got 'sometimes'"),
    ("local_deployment: huge\n", "`local_deployment` must be one of minimal, standard, full, got 'huge'"),
    ("embedding_precision: fp16\n", "`embedding_precision` must be one of int8, fp32, got 'fp16'"),
    ("structured_output: true\n", "`structured_output` must be one of auto, on, off, got True"),
    ("choose_model: best\n", "`choose_model` must be one of llm, ranking, auto, got 'best'"),
    ("discovered_models: everywhere\n", "`discovered_models` must be one of hosted, local, off, got 'everywhere'"),
    # URLs
    ("huggingface: {router_url: 'ftp://router.example'}\n",
     "`huggingface.router_url` must be an http(s) URL, got 'ftp://router.example'"),
    ("huggingface: {router_url: router.example}\n",
     "`huggingface.router_url` must be an http(s) URL, got 'router.example'"),
    ("huggingface: {router_url: 8080}\n", "`huggingface.router_url` must be an http(s) URL, got 8080"),
    # Hub authors
    ("discovered_authors_allow: ['bad name']\n", "`discovered_authors_allow` holds 'bad name', which is not a Hub "
     "author name: the author may only hold letters, digits, '-', '_' and '.', and must start and end with a letter "
     "or digit"),
    ("discovered_authors_allow: {google: 1}\n", "`discovered_authors_allow` must be a list of strings"),
    ("discovered_authors_deny: [ok, 'a--b']\n", "`discovered_authors_deny` holds 'a--b', which is not a Hub author "
     "name: the author may not contain '..' or '--'"),
])
def test_a_wrong_or_out_of_range_value_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    assert error_of(tmp_path, OPENAI + text) == f"<file>: {message}"


def test_a_zero_where_a_count_is_optional_means_unset_only_when_the_key_is_absent(tmp_path):
    # absent: the device's / the server's own default; written as 0: an error (above), never a silent "unset"
    config = config_of(tmp_path, OPENAI)
    assert (config.compute_threads, config.planner_max_tokens, config.http_threads,
            config.http_connections_per_client, config.catalog_sync_per_task) == (None, None, None, None, None)


def test_a_zero_per_task_catalog_sync_is_refused_like_every_other_zero_count(tmp_path):
    assert error_of(tmp_path, OPENAI + "catalog_sync: {per_task: 0}\n") == (
        f"<file>: `catalog_sync.per_task` {POSITIVE} 0")


def test_a_boolean_memory_budget_is_refused(tmp_path):
    assert error_of(tmp_path, OPENAI + "memory_budget_gb: true\n") == "<file>: `memory_budget_gb` must be a number"


def test_a_model_size_cap_that_is_not_a_number_is_refused_at_start(tmp_path):
    assert error_of(tmp_path, OPENAI + "model_constraints: {max_size_mb: big}\n") == (
        "<file>: `model_constraints.max_size_mb` must be a number")  # the file named, as for every other key


def test_a_context_size_that_is_not_a_number_is_refused_at_start(tmp_path):
    with pytest.raises(ConfigError, match="max_context_tokens"):
        config_of(tmp_path, OPENAI + "max_context_tokens: lots\n")
    assert config_of(tmp_path, OPENAI + "max_context_tokens: 4096\n").llm.max_context_tokens == 4096


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


# -- Inference Providers ------------------------------------------------------------------------------------------

KNOWN = ", ".join(known_providers())


def test_providers_are_auto_one_name_or_a_list_in_order_without_repeats(tmp_path):
    assert config_of(tmp_path, OPENAI + "huggingface: {providers: auto}\n").huggingface_providers == ()
    assert config_of(tmp_path, OPENAI + "huggingface: {providers: ' together '}\n").huggingface_providers == \
        ("together",)
    assert config_of(tmp_path, OPENAI + "huggingface: {providers: [groq, ' together', groq]}\n") \
        .huggingface_providers == ("groq", "together")
    # auto with an own endpoint is fine: nothing to choose
    config = config_of(tmp_path, OPENAI + "huggingface: {providers: auto, base_url: 'http://tgi:8080'}\n")
    assert (config.huggingface_providers, config.huggingface_base_url) == ((), "http://tgi:8080")


@pytest.mark.parametrize("value, message", [
    ("[]", f"must be auto or a list of Inference Providers ({KNOWN}), got []"),
    ("''", f"must be auto or a list of Inference Providers ({KNOWN}), got ''"),
    ("5", f"must be auto or a list of Inference Providers ({KNOWN}), got 5"),
    ("[groq, 5]", f"must be auto or a list of Inference Providers ({KNOWN}), got ['groq', 5]"),
    ("{groq: 1}", f"must be auto or a list of Inference Providers ({KNOWN}), got {{'groq': 1}}"),
    ("[togther]", f"names 'togther', which is not an Inference Provider; did you mean together? (known: auto, {KNOWN})"),
    ("[groq, zzzzzz]", f"names 'zzzzzz', which is not an Inference Provider (known: auto, {KNOWN})"),
])
def test_a_wrong_provider_list_names_the_known_providers(tmp_path, value, message):
    assert error_of(tmp_path, OPENAI + f"huggingface: {{providers: {value}}}\n") == (
        f"<file>: `huggingface.providers` {message}")


def test_providers_and_an_own_endpoint_exclude_each_other(tmp_path):
    assert error_of(tmp_path, OPENAI + "huggingface: {providers: [groq], base_url: 'http://tgi:8080'}\n") == (
        "<file>: `huggingface.providers` cannot be used with `huggingface.base_url` (an own endpoint serves its "
        "models itself): remove one of them")


# -- the objects built from a Config -------------------------------------------------------------------------------


def test_the_models_server_url_and_the_http_limits_come_from_their_keys(tmp_path):
    config = config_of(tmp_path, OPENAI + "local_inference_endpoint: {host: gpu-box, port: 7000}\n"
                                          "http_connection_limit: 40\nhttp_header_timeout: 3\nhttp_read_timeout: 7\n"
                                          "http_idle_timeout: 9\nhttp_connections_per_client: 5\n")
    assert config.models_server_url == "http://gpu-box:7000"
    assert config.http_limits() == HttpLimits(connection_limit=40, header_timeout=3.0, read_timeout=7.0,
                                              idle_timeout=9.0, connections_per_client=5)
    assert config.http_limits().per_client == 5
    default = config_of(tmp_path, OPENAI)
    assert default.models_server_url == "http://localhost:8005"
    assert default.http_limits() == HttpLimits()
    assert default.http_limits().per_client == 250


def test_the_per_client_cap_is_a_quarter_of_the_limit_and_never_zero(tmp_path):
    assert config_of(tmp_path, OPENAI + "http_connection_limit: 400\n").http_limits().per_client == 100
    assert config_of(tmp_path, OPENAI + "http_connection_limit: 7\n").http_limits().per_client == 1
    assert config_of(tmp_path, OPENAI + "http_connection_limit: 3\n").http_limits().per_client == 1


def test_the_url_policy_allows_the_listed_hosts_and_networks(tmp_path):
    policy = config_of(tmp_path, OPENAI + "url_allowlist: [10.0.0.7/24, GPU-Box., '[::1]']\n").url_policy()
    assert policy.allow_hosts == frozenset({"gpu-box"})
    assert policy.allow_networks == (ipaddress.ip_network("10.0.0.0/24"), ipaddress.ip_network("::1/128"))
    empty = config_of(tmp_path, OPENAI).url_policy()
    assert (empty.allow_hosts, empty.allow_networks) == (frozenset(), ())


def test_overrides_make_a_changed_copy(tmp_path):
    config = config_of(tmp_path, OPENAI)
    changed = config.with_overrides(max_tasks=3, debug=True)
    assert (changed.max_tasks, changed.debug) == (3, True)
    assert (config.max_tasks, config.debug) == (32, False)
    assert changed.llm is config.llm and changed.path == config.path


# -- the file itself: missing, not YAML, not a mapping, unknown keys -----------------------------------------------


def test_an_empty_file_is_a_config_with_every_default(tmp_path):
    config = config_of(tmp_path, "")
    assert (config.llm.api_type, config.max_tasks, config.inference_mode) == (None, 32, "hybrid")
    assert config_of(tmp_path, "# only a comment\n").warnings == ()


@pytest.mark.parametrize("text", ["- a\n- b\n", "just words\n", "42\n"])
def test_a_file_that_is_not_a_mapping_says_so(tmp_path, text):
    assert error_of(tmp_path, text) == "<file>: the top level must be a mapping of keys"


@pytest.mark.parametrize("text, message", [
    ("openai: [unclosed\n", "2:1: not valid YAML: expected ',' or ']', but got '<stream end>' "
                            "(while parsing a flow sequence at line 1)"),
    ("a: b\n  c: d\n", "2:4: not valid YAML: mapping values are not allowed here"),
    ("key: 'open\nother: 1\n", "3:1: not valid YAML: found unexpected end of stream "
                               "(while scanning a quoted scalar at line 1)"),
    ("a: 1\nb: *nope\n", "2:4: not valid YAML: found undefined alias 'nope'"),
    # the context on the line of the problem is not repeated with its line
    ("\tkey: v\n", "1:1: not valid YAML: found character '\\t' that cannot start any token "
                   "(while scanning for the next token)"),
])
def test_a_yaml_error_names_the_file_line_and_column(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}:{message}"


def test_a_yaml_error_without_a_position_names_the_file(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n\x07\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f"{path}: not valid YAML: unacceptable character #x0007: special characters are not " \
                              "allowed"


def _yamls(folder: Path) -> str:
    return ", ".join(sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml")))


def test_a_missing_config_names_the_closest_and_every_config_beside_it(tmp_path, monkeypatch):
    folder = tmp_path / "cfgs"
    folder.mkdir()
    for name in ("config.local.yaml", "other.yml", "notes.txt"):
        (folder / name).write_text("")
    monkeypatch.chdir(tmp_path)
    missing = folder / "config.locl.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, env={})
    assert str(info.value) == (f"config file not found: {missing}; did you mean cfgs/config.local.yaml? "
                               "(the configs in cfgs/: config.local.yaml, other.yml)")
    with pytest.raises(ConfigError) as info:
        load_config(Path("cfgs/zzzzzzzz.yaml"), env={})
    assert str(info.value) == ("config file not found: cfgs/zzzzzzzz.yaml (the configs in cfgs/: config.local.yaml, "
                               "other.yml)")
    # from a folder the configs are not under, the folder is named whole
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ConfigError) as info:
        load_config(missing, env={})
    assert str(info.value) == (f"config file not found: {missing}; did you mean {folder}/config.local.yaml? "
                               f"(the configs in {folder}/: config.local.yaml, other.yml)")


def test_a_missing_config_in_a_folder_without_configs_or_in_none_points_at_the_shipped_ones(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "empty" / "c.yaml", env={})
    assert str(info.value) == f"config file not found: {tmp_path / 'empty' / 'c.yaml'}"
    shipped = PROJECT_ROOT / "configs"
    (tmp_path / "stray.yaml").write_text("")  # in the working folder: not where a bare name is looked for
    for missing in (Path("config.defualt.yaml"), tmp_path / "no-such-folder" / "config.defualt.yaml"):
        with pytest.raises(ConfigError) as info:
            load_config(missing, env={})
        assert str(info.value) == (f"config file not found: {missing}; did you mean {shipped}/config.default.yaml? "
                                   f"(the configs in {shipped}/: {_yamls(shipped)})")
    monkeypatch.chdir(PROJECT_ROOT)
    with pytest.raises(ConfigError) as info:
        load_config(Path("config.defualt.yaml"), env={})
    assert str(info.value) == ("config file not found: config.defualt.yaml; did you mean configs/config.default.yaml? "
                               f"(the configs in configs/: {_yamls(shipped)})")


def test_a_folder_is_not_a_config_file(tmp_path):
    with pytest.raises(ConfigError, match="^config file not found: "):
        load_config(tmp_path, env={})


def test_unknown_keys_name_the_closest_valid_one():
    assert unknown_keys({"modle": "m", "zzzzzz": 1, "model": "m"}) == [
        "unknown key `modle` (did you mean `model`?)", "unknown key `zzzzzz`"]
    assert unknown_keys({"openai": {"api_kee": "k", "qqqq": 1, "api_key": "k"}}) == [
        "unknown key `openai.api_kee` (did you mean `openai.api_key`?)",
        "unknown key `openai.qqqq` (valid: api_key, base_url)"]
    assert unknown_keys({"openai": "not a mapping", "model": {"free": "form"}, "tprompt": {"parse_task": "p"}}) == []
    assert unknown_keys({"tprompt": {"parse_tsak": "p"}}) == ["unknown key `tprompt.parse_tsak` (did you mean "
                                                              "`tprompt.parse_task`?)"]


def test_an_unknown_key_is_a_warning_naming_the_file_or_with_strict_an_error(tmp_path):
    path = tmp_path / "config.yaml"
    config = config_of(tmp_path, OPENAI + "modle: gpt-4o\n")
    assert config.warnings == (f"{path}: unknown key `modle` (did you mean `model`?)",)
    assert config.llm.model == "gpt-4o-mini"
    assert error_of(tmp_path, OPENAI + "modle: gpt-4o\n", strict=True) == (
        "<file>: unknown key `modle` (did you mean `model`?)")
    assert error_of(tmp_path, OPENAI + "modle: gpt-4o\nzzzzzz: 1\n", strict=True) == (
        "<file>: unknown key `modle` (did you mean `model`?) (and 1 more)")
    assert error_of(tmp_path, OPENAI + "modle: gpt-4o\nzzzzzz: 1\nqqqqqq: 2\n", strict=True) == (
        "<file>: unknown key `modle` (did you mean `model`?) (and 2 more)")
    assert config_of(tmp_path, OPENAI, strict=True).warnings == ()


def test_an_error_also_names_the_misspelt_keys_that_may_be_its_cause(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("openai: {api_kee: sk-1}\nzzzzzz: 1\n")
    with pytest.raises(NoLLMConfigured) as info:  # still "no LLM": the offline demo may start
        load_config(path, env={})
    assert str(info.value) == (
        f"{path}: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY); the file also has "
        "unknown key `openai.api_kee` (did you mean `openai.api_key`?); unknown key `zzzzzz`")
    path.write_text(OPENAI + "max_taks: 3\nmax_tasks: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert type(info.value) is ConfigError
    assert str(info.value) == (f"{path}: `max_tasks` {POSITIVE} 0; the file also has unknown key `max_taks` "
                               "(did you mean `max_tasks`?)")
