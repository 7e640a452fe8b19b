"""One LLM client for OpenAI, Azure OpenAI and any OpenAI-compatible server (vLLM, Ollama, llama.cpp).

Built on the official `openai` SDK, which already retries 408/409/429/5xx and connection errors
with exponential backoff (honouring Retry-After); we set how many times and how long to wait.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai

from .config import API_TYPES, LLMSettings
from .errors import BadRequest, LLMError

log = logging.getLogger(__name__)

# The planner's vocabulary, biased up with logit_bias where the backend supports it (as JARVIS does).
HIGHLIGHT_WORDS = (
    "text", "image", "audio", "video", "task", "id", "dep", "args", "<GENERATED>", "-", "{", "}", "[", "]",
)


def normalize_endpoint(url: str) -> str:
    """Accept a base URL (`http://h:8006`, `.../v1`) or JARVIS's full URL (`.../v1/chat/completions`)."""
    url = url.strip()
    if not re.match(r"^https?://", url):
        raise BadRequest(f"api_endpoint must be an http(s) URL, got {url!r}")
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    if path == "":
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def with_overrides(
    settings: LLMSettings,
    api_key: str | None = None,
    api_type: str | None = None,
    api_endpoint: str | None = None,
    model: str | None = None,
) -> LLMSettings:
    """Per-request overrides from the request body; the config stays untouched."""
    changes: dict[str, Any] = {}
    if api_type is not None:
        if api_type not in API_TYPES:
            raise BadRequest(f"api_type must be one of {', '.join(API_TYPES)}, got {api_type!r}")
        changes["api_type"] = api_type
    if api_key is not None:
        changes["api_key"] = api_key
    if api_endpoint is not None:
        changes["endpoint"] = api_endpoint if (api_type or settings.api_type) == "azure" else normalize_endpoint(
            api_endpoint
        )
    if model is not None:
        changes["model"] = model
    merged = replace(settings, **changes)
    if merged.api_type is None:
        merged = replace(merged, api_type="local" if merged.endpoint else "openai")
    if merged.api_type == "local" and not merged.endpoint:
        raise BadRequest("api_type 'local' needs api_endpoint (e.g. http://localhost:8006/v1)")
    if merged.api_type in ("openai", "azure") and not merged.api_key:
        raise BadRequest(f"no API key for the {merged.api_type} backend: send api_key or configure one")
    return merged


@functools.lru_cache(maxsize=16)
def _highlight_token_ids(model: str) -> tuple[int, ...] | None:
    """Token ids to bias; None when tiktoken or its encoding is not available offline."""
    try:
        import tiktoken  # optional: its encodings are downloaded on first use

        enc = tiktoken.encoding_for_model(model)
    except Exception:  # noqa: BLE001 - any failure just means no bias
        return None
    ids: set[int] = set()
    for word in HIGHLIGHT_WORDS:
        ids.update(enc.encode(" " + word))
        ids.update(enc.encode(word))
    return tuple(sorted(ids))


def messages_to_prompt(messages: Iterable[dict[str, str]]) -> str:
    """Render chat messages for completion-only models (`use_completion: true`)."""
    parts = [f"<im_start>{m['role']}\n{m['content']}<im_end>" for m in messages]
    return "\n".join(parts) + "\n<im_start>assistant\n"


class LLMClient:
    """A thin, typed wrapper: one call in, text out, one exception type out."""

    def __init__(self, settings: LLMSettings, proxy: str | None = None):
        if settings.api_type is None:
            settings = with_overrides(settings)
        self.settings = settings
        http_client = None
        if proxy:
            import httpx2  # the SDK's own HTTP stack

            http_client = httpx2.Client(proxy=proxy, timeout=settings.timeout)
        common: dict[str, Any] = dict(
            api_key=settings.api_key or "not-needed",
            timeout=settings.timeout,
            max_retries=settings.max_retries,
        )
        if http_client is not None:
            common["http_client"] = http_client
        if settings.api_type == "azure":
            self._client = openai.AzureOpenAI(
                azure_endpoint=settings.endpoint,
                azure_deployment=settings.azure_deployment,
                api_version=settings.azure_api_version,
                **common,
            )
        else:
            base = settings.endpoint
            self._client = openai.OpenAI(base_url=normalize_endpoint(base) if base else None, **common)

    @property
    def describe(self) -> str:
        s = self.settings
        return f"{s.api_type} LLM backend ({s.endpoint or 'api.openai.com'}, model {s.model})"

    def supports_logit_bias(self) -> bool:
        return self.settings.api_type in ("openai", "azure") and _highlight_token_ids(self.settings.model) is not None

    def logit_bias(self, weight: float) -> dict[str, float] | None:
        if not weight or not self.supports_logit_bias():
            return None
        ids = _highlight_token_ids(self.settings.model) or ()
        return {str(i): weight for i in ids}

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float = 0.0,
        logit_bias_weight: float = 0.0,
        on_token: Callable[[str], None] | None = None,
    ) -> str:
        """Send messages, return the reply text. With on_token, stream and report each piece."""
        bias = self.logit_bias(logit_bias_weight)
        extra: dict[str, Any] = {"temperature": temperature}
        if bias:
            extra["logit_bias"] = bias
        try:
            if self.settings.use_completion:
                return self._complete(messages_to_prompt(messages), extra, on_token)
            if on_token is None:
                resp = self._client.chat.completions.create(model=self.settings.model, messages=messages, **extra)
                if not resp.choices:
                    raise LLMError(f"{self.describe} returned no choices")
                return resp.choices[0].message.content or ""
            chunks = []
            stream = self._client.chat.completions.create(
                model=self.settings.model, messages=messages, stream=True, **extra
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
                    piece = chunk.choices[0].delta.content
                    chunks.append(piece)
                    on_token(piece)
            return "".join(chunks)
        except openai.APIStatusError as exc:
            raise LLMError(self._redact(f"{self.describe} answered HTTP {exc.status_code}: {_short(exc)}")) from None
        except openai.APITimeoutError:
            raise LLMError(f"{self.describe} timed out after {self.settings.timeout:.0f}s") from None
        except openai.APIConnectionError:
            raise LLMError(f"{self.describe} is unreachable (connection failed)") from None
        except openai.OpenAIError as exc:
            raise LLMError(self._redact(f"{self.describe} failed: {_short(exc)}")) from None

    def _complete(self, prompt: str, extra: dict[str, Any], on_token: Callable[[str], None] | None) -> str:
        if on_token is None:
            resp = self._client.completions.create(model=self.settings.model, prompt=prompt, max_tokens=2048, **extra)
            return resp.choices[0].text if resp.choices else ""
        chunks = []
        for chunk in self._client.completions.create(
            model=self.settings.model, prompt=prompt, max_tokens=2048, stream=True, **extra
        ):
            if chunk.choices and chunk.choices[0].text:
                chunks.append(chunk.choices[0].text)
                on_token(chunk.choices[0].text)
        return "".join(chunks)

    def _redact(self, text: str) -> str:
        key = self.settings.api_key
        if key and len(key) >= 4:
            text = text.replace(key, "***")
        return re.sub(r"sk-[A-Za-z0-9_\-*]{6,}", "sk-***", text)


def _short(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    return str(exc).splitlines()[0][:300] if str(exc) else exc.__class__.__name__
