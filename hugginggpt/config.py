"""YAML + environment -> a typed, immutable Config.

Every error names the key and the file so a user can fix the config without reading code.
Nothing here runs at import time.
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, NoLLMConfigured

PLACEHOLDER_PREFIX = "REPLACE_WITH"
API_TYPES = ("openai", "azure", "local")
INFERENCE_MODES = ("local", "huggingface", "hybrid")
DEPLOYMENTS = ("minimal", "standard", "full")
STAGES = ("parse_task", "choose_model", "response_results")
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # where demos/, data/ and public/ ship
MAX_HTTP_WORKERS = 32

# Every key the config may hold (JARVIS's and ours); a section maps to its own keys.
KNOWN_KEYS: dict[str, tuple[str, ...] | None] = {
    "openai": ("api_key", "base_url"),
    "azure": ("api_key", "base_url", "deployment_name", "api_version"),
    "local": ("endpoint", "api_key"),
    "huggingface": ("token", "base_url", "providers", "router_url"),
    "http_listen": ("host", "port"),
    "local_inference_endpoint": ("host", "port"),
    "logit_bias": ("parse_task", "choose_model"),
    "tprompt": STAGES, "prompt": STAGES, "demos_or_presteps": STAGES,
    "model_constraints": ("language", "max_size_mb"),
    "catalog_sync": ("tasks", "per_task", "endpoint"),
    "catalog_weights": ("meaning", "popularity", "language", "size", "latency", "availability", "health",
                        "health_half_life_hours"),
    **{key: None for key in (
        "model", "use_completion", "dev", "debug", "log_file", "inference_mode", "local_deployment", "device",
        "num_candidate_models", "max_description_length", "proxy", "root", "public_dir", "catalog",
        "request_timeout", "task_timeout", "status_timeout", "status_cache_seconds", "max_workers", "max_body_bytes",
        "max_fetch_bytes", "fetch_timeout", "local_models_dir", "memory_budget_gb", "semantic_ranking", "cache_dir",
        "embedding_precision",
        "url_allowlist", "allow_request_endpoints", "api_tokens", "models_server_token", "cors_origins",
        "upload_quota_mb", "max_image_pixels", "max_output_mb", "llm_timeout", "llm_max_retries",
        "max_context_tokens", "max_concurrent_requests", "http_threads", "http_workers", "structured_output",
        "choose_model", "choose_model_margin", "max_replans", "stream_plan", "planner_max_tokens", "max_tasks",
        "planner_demos", "planner_demo_pool",
        "allowed_models", "denied_models",
        "discovered_models", "discovered_authors_allow", "discovered_authors_deny", "catalog_store",
        "catalog_refresh_hours", "http_connection_limit", "http_header_timeout", "http_read_timeout",
        "http_idle_timeout", "http_connections_per_client", "models_server_hosts", "allowed_hosts",
        "batch_wait_ms", "max_batch_size", "progress_interval_ms", "compute_threads")},
}


def unknown_keys(data: dict) -> list[str]:
    """One message per key this program does not read, naming the closest valid key."""
    found = []
    for key, value in data.items():
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(str(key), list(KNOWN_KEYS), n=1)
            found.append(f"unknown key `{key}`" + (f" (did you mean `{close[0]}`?)" if close else ""))
            continue
        inner = KNOWN_KEYS[key]
        if inner is not None and isinstance(value, dict):
            for sub in value:
                if sub not in inner:
                    close = difflib.get_close_matches(str(sub), list(inner), n=1)
                    found.append(f"unknown key `{key}.{sub}`" + (f" (did you mean `{key}.{close[0]}`?)" if close
                                                                   else f" (valid: {', '.join(inner)})"))
    return found


@dataclass(frozen=True)
class HttpLimits:
    """Slow-client defence (issue 20): how long a client may take to send a request, and how many may be open.

    waitress's own `channel_timeout` restarts on every byte, so a client that sends one byte a second keeps a
    connection for ever; these deadlines count from the first byte of a request (or from the accept, for a
    connection that sends nothing) and do not restart.
    """

    connection_limit: int = 1000  # open connections; past it waitress stops accepting until some close
    header_timeout: float = 10.0  # seconds from a request's first byte (or the accept) to the end of its headers
    read_timeout: float = 120.0  # seconds from a request's first byte to the end of its body
    idle_timeout: float = 60.0  # a keep-alive connection with no request in progress and no traffic
    connections_per_client: int | None = None  # open connections from one client address; None: see per_client

    @property
    def per_client(self) -> int:
        """One address may hold at most this many connections (default a quarter of connection_limit), so a
        single client cannot take every slot; behind a reverse proxy every client is the proxy's address."""
        return self.connections_per_client or max(1, self.connection_limit // 4)


@dataclass(frozen=True)
class LLMSettings:
    """Everything needed to talk to one LLM backend; per-request overrides make a copy."""

    api_type: str | None  # None: no backend configured, the client must send one per request
    api_key: str | None = None
    endpoint: str | None = None  # base URL (openai-compatible) or Azure resource URL
    model: str = "gpt-4o-mini"
    use_completion: bool = False
    azure_deployment: str | None = None
    azure_api_version: str = "2024-06-01"
    timeout: float = 120.0
    max_retries: int = 3
    max_context_tokens: int | None = None
    trusted: bool = True  # False: the endpoint was named by a request, not by the config
    url_allowlist: tuple[str, ...] = ()  # the config's url_allowlist: what a request's api_endpoint may reach
    endpoint_address: str | None = None  # a request's endpoint: the address the URL policy checked (connect there)

    def redacted(self) -> dict[str, Any]:
        """A loggable view: never the key itself, nor credentials in the endpoint URL."""
        from .urlpolicy import redact_url

        return {
            "api_type": self.api_type,
            "endpoint": redact_url(self.endpoint) if self.endpoint else self.endpoint,
            "model": self.model,
            "api_key": "set" if self.api_key else "unset",
        }

    def summary(self) -> str:
        """One readable line for the start-up message: kind, where, model, whether a key is sent."""
        from .urlpolicy import redact_url

        if self.api_type is None:
            return "none configured: each request names its own (api_type, api_endpoint, api_key)"
        where = redact_url(self.endpoint) if self.endpoint else "https://api.openai.com/v1"
        key = "with an API key" if self.api_key else "no API key"
        return f"{self.api_type} at {where}, model {self.model}, {key}"


@dataclass(frozen=True)
class Config:
    path: Path
    root: Path  # folder the relative paths (demos, data, public) resolve against
    llm: LLMSettings
    huggingface_token: str | None = None
    huggingface_base_url: str | None = None
    huggingface_providers: tuple[str, ...] = ()  # Inference Providers allowed, in order; empty: auto (the Hub's order)
    huggingface_router_url: str | None = None  # the Hub's router; None: https://router.huggingface.co
    inference_mode: str = "hybrid"
    local_deployment: str = "full"
    device: str = "cpu"
    num_candidate_models: int = 5
    max_description_length: int = 100
    proxy: str | None = None
    http_host: str = "0.0.0.0"
    http_port: int = 8004
    models_host: str = "localhost"
    models_port: int = 8005
    logit_bias: dict[str, float] = field(default_factory=dict)
    tprompt: dict[str, str] = field(default_factory=dict)
    prompt: dict[str, str] = field(default_factory=dict)
    demos: dict[str, Path] = field(default_factory=dict)
    dev: bool = False
    debug: bool = False
    log_file: Path | None = None
    public_dir: Path = Path("public")
    catalog_path: Path = Path("data/p0_models.jsonl")
    request_timeout: float = 600.0  # whole request deadline, seconds
    task_timeout: float = 300.0  # one model call, seconds
    status_timeout: float = 2.0
    status_cache_seconds: float = 30.0
    max_workers: int = 8
    max_body_bytes: int = 10 * 1024 * 1024
    max_fetch_bytes: int = 20 * 1024 * 1024
    fetch_timeout: float = 15.0
    local_models_dir: Path = Path("models")
    memory_budget_gb: float | None = None
    # models server: concurrent requests of one model gathered into one batch (modelhost/batching.py)
    batch_wait_ms: float = 5.0  # the most an idle model waits for company (only after a batch had company)
    max_batch_size: int = 32  # 1: no batching
    # models server: threads that load and run models, sharing the cores (modelhost/compute.py); None: 1 on the
    # CPU, 4 on an accelerator
    compute_threads: int | None = None
    # a running task's progress (task_progress events): at most one per this many ms per task, besides each change
    # of phase and the last step; 0: every event the models server sends
    progress_interval_ms: float = 250.0
    semantic_ranking: bool = True
    embedding_precision: str = "int8"  # the sentence model's graph: int8 (about 0.6x the CPU) or fp32
    preferred_language: str | None = None  # e.g. "de": models for this language rank higher
    max_model_size_mb: float | None = None  # catalog rows with a larger `size_mb` are never candidates
    cache_dir: Path = Path(".cache")
    warnings: tuple[str, ...] = ()  # e.g. unknown keys; the entry points print them
    planner_max_tokens: int | None = None  # cap on the plan's length (a small model under a grammar may not stop)
    max_tasks: int = 32  # a plan with more tasks is refused at once (a runaway chain would hold the request)
    planner_demos: int = 0  # demos picked per request from planner_demo_pool (0: only the fixed demos)
    planner_demo_pool: Path | None = None  # {"request", "plan"} examples to pick from (demopick.py)
    allowed_models: tuple[str, ...] = ()  # model id patterns (fnmatch) selection may use; empty: any
    denied_models: tuple[str, ...] = ()  # model id patterns never used; wins over allowed_models
    stream_plan: bool = True  # read the plan as it streams and start final tasks at once
    max_replans: int = 1  # planner calls allowed to recover from an invalid plan or tasks that failed everywhere
    choose_model: str = "auto"  # llm | ranking | auto (ask the LLM only when the top candidates are close)
    choose_model_margin: float = 0.01  # "auto": the ranker's score lead that makes the choice clear (bench/choose_model.py)
    structured_output: str = "auto"  # auto | on | off: JSON-schema-constrained plans where the backend allows
    max_concurrent_requests: int = 64  # past it: 429 + Retry-After (requests mostly wait on I/O)
    http_threads: int | None = None  # waitress threads; default max_concurrent_requests + 16 (health, files)
    http_workers: int = 1  # server processes on the one port (hugginggpt/workers.py): one GIL each
    # slow clients (both servers): open connections, and total deadlines for a request to arrive (issue 20)
    http_connection_limit: int = 1000
    http_header_timeout: float = 10.0  # first byte (or accept) to the end of the headers
    http_read_timeout: float = 120.0  # first byte to the end of the body
    http_idle_timeout: float = 60.0  # a keep-alive connection with nothing in progress
    http_connections_per_client: int | None = None  # per client address; None: http_connection_limit / 4
    # deployment and access control (see README "Deploying it")
    url_allowlist: tuple[str, ...] = ()  # hosts / CIDRs that user-named URLs may reach despite the policy
    allow_request_endpoints: bool = True  # may a request name its own api_endpoint?
    api_tokens: tuple[str, ...] = ()  # empty: no Authorization required
    allowed_hosts: tuple[str, ...] = ()  # names clients use for this server without api_tokens (Host check)
    models_server_token: str | None = None
    models_server_hosts: tuple[str, ...] = ()  # names clients use for a models server without a token (Host check)
    cors_origins: tuple[str, ...] = ()  # empty: same origin and localhost only
    upload_quota_bytes: int = 1024 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_output_bytes: int = 200 * 1024 * 1024  # one generated file copied from the models server
    # Hub models outside the curated catalog (issue 17): hosted (only where a hosted provider serves them),
    # local (the models server may also download and run them), off (the curated catalog only)
    discovered_models: str = "hosted"
    discovered_authors_allow: tuple[str, ...] = ()  # Hub authors / orgs; empty: any author not denied
    discovered_authors_deny: tuple[str, ...] = ()  # never these authors; wins over the allow list
    # the Hub catalog store (README "The whole Hub as the catalog")
    catalog_store: Path = Path("data/catalog.sqlite")  # built by `tools/build_catalog.py sync`, not committed
    catalog_refresh_hours: float = 0.0  # > 0: the server re-syncs in the background this often
    catalog_sync_tasks: tuple[str, ...] = ()  # pipeline tags to sync; empty: every planner task the Hub has
    catalog_sync_per_task: int | None = None  # most downloaded N per task; None: all
    catalog_endpoint: str | None = None  # the Hub's URL; None: HF_ENDPOINT, else huggingface.co
    catalog_weights: dict[str, float] = field(default_factory=dict)  # scoring.Weights overrides

    @property
    def models_server_url(self) -> str:
        return f"http://{self.models_host}:{self.models_port}"

    def http_limits(self) -> HttpLimits:
        return HttpLimits(connection_limit=self.http_connection_limit, header_timeout=self.http_header_timeout,
                          read_timeout=self.http_read_timeout, idle_timeout=self.http_idle_timeout,
                          connections_per_client=self.http_connections_per_client)

    def url_policy(self):
        from .urlpolicy import UrlPolicy

        return UrlPolicy.from_entries(self.url_allowlist)

    def with_overrides(self, **changes: Any) -> Config:
        return replace(self, **changes)


def _get(data: dict, dotted: str, default: Any = None) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _secret(value: Any) -> str | None:
    if not value or not isinstance(value, str) or value.startswith(PLACEHOLDER_PREFIX):
        return None
    return value.strip()


def _typed(data: dict, key: str, kind: type, default: Any, path: Path) -> Any:
    value = _get(data, key, default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{path}: `{key}` must be a {kind.__name__}, got {value!r}")
    return value


def _strings(data: dict, key: str, path: Path, env_value: str | None = None) -> tuple[str, ...]:
    """A list of strings in the file (or one comma-separated string, as in an environment variable)."""
    value = _get(data, key)
    if value is None and env_value:
        value = env_value
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise ConfigError(f"{path}: `{key}` must be a list of strings")
    return tuple(s for s in (str(v).strip() for v in value) if s)


def _positive(data: dict, key: str, default: int, path: Path) -> int:
    value = _typed(data, key, int, default, path)
    if value < 0 or (value == 0 and _get(data, key) is not None):  # a dotted key's 0 too, not only a top-level one
        raise ConfigError(f"{path}: `{key}` must be a positive whole number, got {value!r}")
    return value


def _count(data: dict, key: str, default: int, path: Path) -> int:
    """A whole number, 0 or more."""
    value = _typed(data, key, int, default, path)
    if value < 0:
        raise ConfigError(f"{path}: `{key}` must be 0 or more, got {value!r}")
    return value


def _number(data: dict, key: str, path: Path) -> int | float | None:
    """An optional number, None when absent; a word or a bool (YAML's `true` is an int to Python) is refused at
    start, not met as a TypeError when a request compares with it."""
    value = _get(data, key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{path}: `{key}` must be a number")
    return value


def _workers(data: dict, path: Path) -> int:
    value = _positive(data, "http_workers", 1, path)
    if value > MAX_HTTP_WORKERS:
        raise ConfigError(f"{path}: `http_workers` must be at most {MAX_HTTP_WORKERS} (each loads the ranking model), "
                          f"got {value}")
    return value


def _seconds(data: dict, key: str, default: float, path: Path) -> float:
    value = _get(data, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise ConfigError(f"{path}: `{key}` must be a number of seconds above 0 (default {default:g})")
    return float(value)


def _milliseconds(data: dict, key: str, default: float, path: Path) -> float:
    value = _get(data, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1000:
        raise ConfigError(f"{path}: `{key}` must be a number of milliseconds from 0 to 1000 (default {default:g})")
    return float(value)


def _batch_wait(data: dict, path: Path) -> float:
    return _milliseconds(data, "batch_wait_ms", 5.0, path)


def _choice(data: dict, key: str, options: tuple[str, ...], default: str, path: Path) -> str:
    value = _get(data, key, default)
    if value not in options:
        raise ConfigError(f"{path}: `{key}` must be one of {', '.join(options)}, got {value!r}")
    return value


def _providers(data: dict, path: Path) -> tuple[str, ...]:
    """`huggingface.providers`: auto (empty: the order the user set on the Hub) or a list of provider names."""
    value = _get(data, "huggingface.providers", "auto")
    if value == "auto":
        return ()
    from .backends.hosted import known_providers

    known = known_providers()
    if isinstance(value, str) and value.strip():
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: `huggingface.providers` must be auto or a list of Inference Providers "
                          f"({', '.join(known)}), got {value!r}")
    names = tuple(dict.fromkeys(v.strip() for v in value))
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"{path}: `huggingface.providers` names {name!r}, which is not an Inference Provider"
                              f"{hint} (known: auto, {', '.join(known)})")
    if _get(data, "huggingface.base_url"):
        raise ConfigError(f"{path}: `huggingface.providers` cannot be used with `huggingface.base_url` (an own "
                          "endpoint serves its models itself): remove one of them")
    return names


def _url(data: dict, key: str, path: Path) -> str | None:
    value = _get(data, key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ConfigError(f"{path}: `{key}` must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def _authors(data: dict, key: str, path: Path) -> tuple[str, ...]:
    """A list of Hub authors / organisations (the owner part of `owner/name`)."""
    from .modelhost.discover import name_problem

    authors = _strings(data, key, path)
    for author in authors:
        problem = name_problem(author, "author")
        if problem:
            raise ConfigError(f"{path}: `{key}` holds {author!r}, which is not a Hub author name: {problem}")
    return authors


def _llm_settings(data: dict, path: Path, env: dict[str, str]) -> LLMSettings:
    """JARVIS's choice of backend: dev -> local, else azure, else openai, else local."""
    model = _typed(data, "model", str, "gpt-4o-mini", path)
    common = dict(
        model=model,
        use_completion=_typed(data, "use_completion", bool, False, path),
        timeout=_typed(data, "llm_timeout", float, 120.0, path),
        max_retries=_typed(data, "llm_max_retries", int, 3, path),
        max_context_tokens=_positive(data, "max_context_tokens", 0, path) or None,
        url_allowlist=_strings(data, "url_allowlist", path),
    )
    if _get(data, "dev", False) or ("local" in data and "openai" not in data and "azure" not in data):
        endpoint = _get(data, "local.endpoint")
        if not endpoint:
            raise NoLLMConfigured(f"{path}: `local.endpoint` is required for a local LLM (e.g. http://localhost:8006/v1)")
        key = _secret(_get(data, "local.api_key")) or _secret(env.get("OPENAI_API_KEY"))  # None: a keyless server
        return LLMSettings(api_type="local", api_key=key, endpoint=str(endpoint), **common)
    if "azure" in data:
        azure = data.get("azure") or {}
        key = _secret(azure.get("api_key")) or _secret(env.get("AZURE_OPENAI_API_KEY"))
        if not key:
            raise NoLLMConfigured(f"{path}: `azure.api_key` is missing (or set AZURE_OPENAI_API_KEY)")
        base = azure.get("base_url")
        if not _secret(base):
            raise NoLLMConfigured(f"{path}: `azure.base_url` is missing (your https://<resource>.openai.azure.com)")
        deployment = azure.get("deployment_name")
        if not _secret(deployment):
            raise NoLLMConfigured(f"{path}: `azure.deployment_name` is missing")
        return LLMSettings(
            api_type="azure",
            api_key=key,
            endpoint=str(base),
            azure_deployment=str(deployment),
            azure_api_version=str(azure.get("api_version") or "2024-06-01"),
            **common,
        )
    if "openai" in data:
        key = _secret(_get(data, "openai.api_key")) or _secret(env.get("OPENAI_API_KEY"))
        if not key:
            raise NoLLMConfigured(f"{path}: `openai.api_key` is missing (set it in the file or export OPENAI_API_KEY)")
        endpoint = _get(data, "openai.base_url")
        return LLMSettings(api_type="openai", api_key=key, endpoint=endpoint, **common)
    # No backend in the file: every request must bring api_type/api_endpoint/api_key (JARVIS allows this).
    return LLMSettings(api_type=None, api_key=_secret(env.get("OPENAI_API_KEY")), **common)


def load_config(path: str | os.PathLike, env: dict[str, str] | None = None, need_llm: bool = True,
                strict: bool = False) -> Config:
    """Read a JARVIS-style YAML config. Raises ConfigError with a one-line, actionable message.

    need_llm=False (the models server) skips the LLM keys, which that process never uses.
    strict=True makes an unknown key an error instead of a warning.
    """
    env = dict(os.environ) if env is None else env
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}{_other_configs(path)}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_message(path, exc)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    unknown = unknown_keys(data)
    if strict and unknown:
        raise ConfigError(f"{path}: {unknown[0]}" + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""))
    try:
        return _build(path, data, env, need_llm, unknown)
    except ConfigError as exc:
        if not unknown:
            raise
        # a key that is "missing" is often one misspelt: name the misspellings with the error
        raise exc.__class__(f"{exc}; the file also has {'; '.join(unknown)}") from None


def _other_configs(path: Path) -> str:
    """"; did you mean ...? the configs in <folder>: a, b" for a config path that does not exist."""
    folder = path.parent if path.parent.is_dir() and str(path.parent) != "." else PROJECT_ROOT / "configs"
    found = sorted(p.name for p in folder.glob("*.y*ml"))
    if not found:
        return ""
    close = difflib.get_close_matches(path.name, found)  # the closest first
    where = folder.relative_to(Path.cwd()) if folder.is_absolute() and folder.is_relative_to(Path.cwd()) else folder
    hint = f"; did you mean {where / close[0]}?" if close else ""
    return f"{hint} (the configs in {where}/: {', '.join(found)})"


def _yaml_message(path: Path, exc: yaml.YAMLError) -> str:
    """"<file>:<line>:<column>: not valid YAML: <problem> (<context>)", the line where the parser stopped."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    context_mark = getattr(exc, "context_mark", None)
    if context and context_mark is not None and mark is not None and context_mark.line != mark.line:
        context = f"{context} at line {context_mark.line + 1}"
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def _build(path: Path, data: dict, env: dict[str, str], need_llm: bool, unknown: list[str]) -> Config:
    root = Path(_get(data, "root", path.resolve().parent.parent))
    if not root.is_absolute():
        root = (path.resolve().parent / root).resolve()

    def rel(value: str | os.PathLike) -> Path:
        """Beside the config's root, else beside the config, else in the project (a config copied elsewhere)."""
        p = Path(value)
        if p.is_absolute():
            return p
        for base in (root, path.resolve().parent, PROJECT_ROOT):
            if (base / p).exists():
                return base / p
        return root / p

    inference_mode = _choice(data, "inference_mode", INFERENCE_MODES, "hybrid", path)
    token = _secret(_get(data, "huggingface.token")) or _secret(env.get("HUGGINGFACE_ACCESS_TOKEN")) or _secret(
        env.get("HF_TOKEN")
    )
    demos: dict[str, Path] = {}
    for stage in STAGES:
        value = _get(data, f"demos_or_presteps.{stage}", f"demos/demo_{stage}.json")
        demos[stage] = rel(value)
    for section in ("tprompt", "prompt"):
        for stage in STAGES:
            value = _get(data, f"{section}.{stage}")
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{path}: `{section}.{stage}` must be a string")
    logit_bias = {}
    for stage in ("parse_task", "choose_model"):
        logit_bias[stage] = _typed(data, f"logit_bias.{stage}", float, 0.0, path)
    log_file = _get(data, "log_file")
    memory_budget = _number(data, "memory_budget_gb", path)
    return Config(
        path=path,
        root=root,
        llm=_llm_settings(data, path, env) if need_llm else LLMSettings(api_type=None),
        huggingface_token=token,
        huggingface_base_url=_get(data, "huggingface.base_url"),
        huggingface_providers=_providers(data, path),
        huggingface_router_url=_url(data, "huggingface.router_url", path),
        inference_mode=inference_mode,
        local_deployment=_choice(data, "local_deployment", DEPLOYMENTS, "full", path),
        device=str(_get(data, "device", "cpu")),
        num_candidate_models=_typed(data, "num_candidate_models", int, 5, path),
        max_description_length=_typed(data, "max_description_length", int, 100, path),
        proxy=_get(data, "proxy"),
        http_host=str(_get(data, "http_listen.host", "0.0.0.0")),
        http_port=_typed(data, "http_listen.port", int, 8004, path),
        models_host=str(_get(data, "local_inference_endpoint.host", "localhost")),
        models_port=_typed(data, "local_inference_endpoint.port", int, 8005, path),
        logit_bias=logit_bias,
        tprompt={k: v for k, v in (_get(data, "tprompt", {}) or {}).items()},
        prompt={k: v for k, v in (_get(data, "prompt", {}) or {}).items()},
        demos=demos,
        dev=bool(_get(data, "dev", False)),
        debug=bool(_get(data, "debug", False)),
        log_file=rel(log_file) if log_file else None,
        public_dir=rel(_get(data, "public_dir", "public")),
        catalog_path=rel(_get(data, "catalog", "data/p0_models.jsonl")),
        request_timeout=_typed(data, "request_timeout", float, 600.0, path),
        task_timeout=_typed(data, "task_timeout", float, 300.0, path),
        status_timeout=_typed(data, "status_timeout", float, 2.0, path),
        status_cache_seconds=_typed(data, "status_cache_seconds", float, 30.0, path),
        max_workers=_typed(data, "max_workers", int, 8, path),
        max_body_bytes=_positive(data, "max_body_bytes", 10 * 1024 * 1024, path),
        max_fetch_bytes=_positive(data, "max_fetch_bytes", 20 * 1024 * 1024, path),
        fetch_timeout=_typed(data, "fetch_timeout", float, 15.0, path),
        local_models_dir=rel(_get(data, "local_models_dir", "models")),
        memory_budget_gb=float(memory_budget) if memory_budget is not None else None,
        batch_wait_ms=_batch_wait(data, path),
        max_batch_size=_positive(data, "max_batch_size", 32, path),
        compute_threads=_positive(data, "compute_threads", 0, path) or None,
        progress_interval_ms=_milliseconds(data, "progress_interval_ms", 250.0, path),
        semantic_ranking=bool(_get(data, "semantic_ranking", True)),
        embedding_precision=_choice(data, "embedding_precision", ("int8", "fp32"), "int8", path),
        preferred_language=_get(data, "model_constraints.language"),
        max_model_size_mb=_number(data, "model_constraints.max_size_mb", path),
        cache_dir=rel(_get(data, "cache_dir", ".cache")),
        url_allowlist=_strings(data, "url_allowlist", path),
        allow_request_endpoints=_typed(data, "allow_request_endpoints", bool, True, path),
        api_tokens=tuple(t for t in _strings(data, "api_tokens", path, env.get("HUGGINGGPT_API_TOKENS"))
                         if not t.startswith(PLACEHOLDER_PREFIX)),
        models_server_token=_secret(_get(data, "models_server_token")) or _secret(env.get("HUGGINGGPT_MODELS_TOKEN")),
        cors_origins=_strings(data, "cors_origins", path),
        allowed_hosts=_strings(data, "allowed_hosts", path),
        models_server_hosts=_strings(data, "models_server_hosts", path),
        upload_quota_bytes=int(_typed(data, "upload_quota_mb", float, 1024.0, path) * 1024 * 1024),
        max_image_pixels=_typed(data, "max_image_pixels", int, 40_000_000, path),
        max_output_bytes=int(_typed(data, "max_output_mb", float, 200.0, path) * 1024 * 1024),
        warnings=tuple(f"{path}: {w}" for w in unknown),
        max_concurrent_requests=_positive(data, "max_concurrent_requests", 64, path),
        structured_output=_choice(data, "structured_output", ("auto", "on", "off"), "auto", path),
        choose_model=_choice(data, "choose_model", ("llm", "ranking", "auto"), "auto", path),
        max_replans=_typed(data, "max_replans", int, 1, path),
        stream_plan=_typed(data, "stream_plan", bool, True, path),
        planner_max_tokens=_positive(data, "planner_max_tokens", 0, path) or None,
        max_tasks=_positive(data, "max_tasks", 32, path),
        planner_demos=_count(data, "planner_demos", 0, path),
        planner_demo_pool=rel(pool) if (pool := _typed(data, "planner_demo_pool", str, "", path)) else None,
        allowed_models=_strings(data, "allowed_models", path),
        denied_models=_strings(data, "denied_models", path),
        choose_model_margin=_typed(data, "choose_model_margin", float, 0.01, path),
        http_threads=_positive(data, "http_threads", 0, path) or None,
        http_workers=_workers(data, path),
        http_connection_limit=_positive(data, "http_connection_limit", 1000, path),
        http_header_timeout=_seconds(data, "http_header_timeout", 10.0, path),
        http_read_timeout=_seconds(data, "http_read_timeout", 120.0, path),
        http_idle_timeout=_seconds(data, "http_idle_timeout", 60.0, path),
        http_connections_per_client=_per_client(data, path),
        discovered_models=_choice(data, "discovered_models", ("hosted", "local", "off"), "hosted", path),
        discovered_authors_allow=_authors(data, "discovered_authors_allow", path),
        discovered_authors_deny=_authors(data, "discovered_authors_deny", path),
        catalog_store=rel(_get(data, "catalog_store", "data/catalog.sqlite")),
        catalog_refresh_hours=_typed(data, "catalog_refresh_hours", float, 0.0, path),
        catalog_sync_tasks=_strings(data, "catalog_sync.tasks", path),
        catalog_sync_per_task=_positive(data, "catalog_sync.per_task", 0, path) or None,
        catalog_endpoint=_get(data, "catalog_sync.endpoint"),
        catalog_weights=_weights(data, path),
    )


def _per_client(data: dict, path: Path) -> int | None:
    """`http_connections_per_client`: a positive number no larger than `http_connection_limit`."""
    value = _positive(data, "http_connections_per_client", 0, path) or None
    limit = _positive(data, "http_connection_limit", 1000, path)
    if value is not None and value > limit:
        raise ConfigError(f"{path}: `http_connections_per_client` ({value}) must not exceed `http_connection_limit` "
                          f"({limit})")
    return value


def _weights(data: dict, path: Path) -> dict[str, float]:
    raw = _get(data, "catalog_weights", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: `catalog_weights` must be a mapping of factor: weight")
    out = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: `catalog_weights.{key}` must be a number, got {value!r}")
        out[str(key)] = float(value)
    return out
