"""One LLM client for OpenAI, Azure OpenAI and any OpenAI-compatible server (vLLM, Ollama, llama.cpp).

Built on the official `openai` SDK, which already retries 408/409/429/5xx and connection errors
with exponential backoff (honouring Retry-After); we set how many times and how long to wait.
"""

from __future__ import annotations

import email.utils
import functools
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import openai

from . import cancel
from .config import API_TYPES, LLMSettings
from .errors import BadRequest, DeadlineExceeded, Forbidden, LLMError, ResourceError
from .textsafe import clean_text
from .urlpolicy import UrlPolicy, bound_by_deadlines, deadline_scope, redact_url, redact_urls_in

MAX_ENDPOINT_LENGTH = 2048
# One answer for a request's endpoint that the policy refuses, that does not resolve or that does not accept a
# connection: which of these it was would tell a client which internal ports are open.
UNREACHABLE_ENDPOINT = ("the LLM at the request's api_endpoint cannot be reached from this server (the URL policy "
                        "refuses loopback, private and link-local addresses unless url_allowlist names them, and "
                        "the address must accept connections)")

log = logging.getLogger(__name__)

# The planner's vocabulary, biased up with logit_bias where the backend supports it (as JARVIS does).
HIGHLIGHT_WORDS = (
    "text", "image", "audio", "video", "task", "id", "dep", "args", "<GENERATED>", "-", "{", "}", "[", "]",
)


def normalize_endpoint(url: str) -> str:
    """Accept a base URL (`http://h:8006`, `.../v1`) or JARVIS's full URL (`.../v1/chat/completions`)."""
    url = _http_url(url)
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    if path == "":
        path = "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def check_request_endpoint(url: Any) -> str:
    """A request's api_endpoint, well formed (400 with a one-line reason otherwise)."""
    if not isinstance(url, str):
        raise BadRequest("api_endpoint must be a string URL")
    if len(url) > MAX_ENDPOINT_LENGTH:
        raise BadRequest(f"api_endpoint is longer than {MAX_ENDPOINT_LENGTH} characters")
    url = url.strip()
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise BadRequest("api_endpoint must not contain spaces or control characters")
    if not url.isascii():
        raise BadRequest("api_endpoint must be ASCII (write an international domain name in its xn-- form)")
    if not re.match(r"^https?://", url, re.IGNORECASE):
        raise BadRequest("api_endpoint must be an http(s) URL")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadRequest(f"api_endpoint is not a valid URL ({str(exc).splitlines()[0][:80]})") from None
    if not parts.hostname:
        raise BadRequest("api_endpoint has no host")
    if port == 0:
        raise BadRequest("api_endpoint has an invalid port")
    if parts.username is not None or parts.password is not None:
        raise BadRequest("api_endpoint must not carry credentials; send the key as api_key")
    return url


def _check_reachable_by_policy(endpoint: str, policy: UrlPolicy) -> str:
    """A request-chosen endpoint passes the same outbound URL policy as any URL a request names; returns the
    address that was checked, the only one its client will connect to (no second lookup to rebind)."""
    try:
        return policy.check(endpoint).address
    except ResourceError:
        raise LLMError(UNREACHABLE_ENDPOINT) from None


def check_api_key(key: Any) -> None:
    """A key goes into an HTTP header: printable ASCII only (a pasted key often brings curly quotes)."""
    if not isinstance(key, str):
        raise BadRequest("api_key must be a string")
    if any(not (0x20 < ord(c) < 0x7F) for c in key):
        raise BadRequest("api_key has characters an HTTP header cannot carry (curly quotes, spaces, non-ASCII "
                         "letters?); paste the key again as plain text")


def with_overrides(
    settings: LLMSettings,
    api_key: str | None = None,
    api_type: str | None = None,
    api_endpoint: str | None = None,
    model: str | None = None,
    *,
    allow_endpoints: bool = True,
    policy: UrlPolicy | None = None,
) -> LLMSettings:
    """Per-request overrides from the request body; the config stays untouched.

    The configured key only ever goes to the configured endpoint: a request that names another endpoint
    brings its own key, or none for a keyless local server. That endpoint must pass `policy` (default: the
    settings' url_allowlist), and the address it checked is pinned in the settings for the client.
    """
    changes: dict[str, Any] = {}
    if api_type is not None:
        if api_type not in API_TYPES:
            raise BadRequest(f"api_type must be one of {', '.join(API_TYPES)}, got {api_type!r}")
        changes["api_type"] = api_type
    if api_key is not None:
        check_api_key(api_key)
        changes["api_key"] = api_key
    own_endpoint = False
    if api_endpoint is not None:
        api_endpoint = check_request_endpoint(api_endpoint)
        azure = (api_type or settings.api_type) == "azure"
        endpoint = _azure_endpoint(api_endpoint) if azure else normalize_endpoint(api_endpoint)
        configured = settings.endpoint
        if configured is not None:  # the portal's `https://res.openai.azure.com/` is the same endpoint
            configured = _azure_endpoint(configured) if azure else normalize_endpoint(configured)
        if endpoint != configured:
            if not allow_endpoints:
                raise Forbidden("this server does not accept `api_endpoint` in requests "
                                "(allow_request_endpoints is false in its config)")
            own_endpoint = True
            address = _check_reachable_by_policy(endpoint, policy or UrlPolicy.from_entries(settings.url_allowlist))
            changes.update(endpoint=endpoint, api_key=api_key, trusted=False, endpoint_address=address)
    if model is not None:
        changes["model"] = model
    merged = replace(settings, **changes)
    if merged.api_type is None:
        merged = replace(merged, api_type="local" if merged.endpoint else "openai")
    if merged.api_type == "local" and not merged.endpoint:
        raise BadRequest("api_type 'local' needs api_endpoint (e.g. http://localhost:8006/v1)")
    if merged.api_type in ("openai", "azure") and not merged.api_key and not own_endpoint:
        raise BadRequest(f"no API key for the {merged.api_type} backend: send api_key or configure one")
    return merged


def _pins(settings: LLMSettings) -> dict[tuple[str, int], str] | None:
    """(host, port) -> the checked address, for an endpoint a request named; None for a configured one."""
    if settings.endpoint_address is None or not settings.endpoint:
        return None
    parts = urlsplit(settings.endpoint)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return {(parts.hostname or "", port): settings.endpoint_address}


def _http_url(url: str) -> str:
    """`url` stripped, its http(s) scheme in lower case (check_request_endpoint accepts `HTTP://` too); a 400
    for any other scheme."""
    url = url.strip()
    scheme = re.match(r"^https?://", url, re.IGNORECASE)
    if not scheme:
        raise BadRequest(f"api_endpoint must be an http(s) URL, got {url!r}")
    return scheme.group(0).lower() + url[scheme.end():]


def _azure_endpoint(url: str) -> str:
    return _http_url(url).rstrip("/")


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
        self.schema_format = 0  # index into SCHEMA_FORMATS of the first form not yet rejected
        # The SDK's own HTTP stack, with every read and write bounded by the request's deadline (a peer that
        # dribbles one byte at a time would otherwise restart the read timeout forever); a request's own
        # endpoint is connected only at the address the URL policy checked (behind a proxy, the proxy connects).
        transport = bound_by_deadlines(httpx2.HTTPTransport(proxy=proxy, limits=openai.DEFAULT_CONNECTION_LIMITS),
                                       pins=None if proxy else _pins(settings))
        http_client = httpx2.Client(transport=transport, timeout=settings.timeout, follow_redirects=True)
        common: dict[str, Any] = dict(
            api_key=settings.api_key or "not-needed",
            timeout=settings.timeout,
            max_retries=0,  # we retry ourselves, within the request's deadline (see `_call`)
            http_client=http_client,
        )
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
        """The backend by its kind, never its URL (which may carry credentials or name an internal host)."""
        s = self.settings
        where = "the configured LLM" if s.trusted else "the LLM at the request's api_endpoint"
        return f"{where} ({s.api_type}, model {s.model})"

    @property
    def describe_for_log(self) -> str:
        s = self.settings
        return f"{self.describe} at {redact_url(s.endpoint or 'https://api.openai.com/v1')}"

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
        deadline: float | None = None,
        json_schema: dict[str, Any] | None = None,
        structured: str = "auto",
        max_tokens: int | None = None,
        on_usage: Callable[[dict[str, Any]], None] | None = None,
    ) -> str:
        """Send messages, return the reply text. With on_token, stream and report each piece.

        deadline (time.monotonic()): every attempt, retry wait and streamed chunk must fit before it.
        json_schema with structured "auto": ask for output constrained to the schema in each form of
        SCHEMA_FORMATS the backend has not rejected yet; once it rejected them all it is asked in free text
        from then on. "on": rejection is an error.
        on_usage: called with the `usage` object of the answer, when the backend sends one.
        """
        bias = self.logit_bias(logit_bias_weight)
        extra: dict[str, Any] = {"temperature": temperature}
        if bias:
            extra["logit_bias"] = bias
        if max_tokens:
            extra["max_tokens"] = max_tokens
        if self.settings.use_completion:
            prompt = messages_to_prompt(messages)
            return self._call(lambda timeout: self._complete(prompt, extra, on_token, timeout, deadline, on_usage),
                              deadline)
        if json_schema is not None and structured != "off":
            status = 0
            for index in range(self.schema_format, len(SCHEMA_FORMATS)):
                constrained = {**extra, "response_format": SCHEMA_FORMATS[index](json_schema)}
                try:
                    return self._call(lambda timeout, c=constrained: self._chat(messages, c, on_token, timeout,
                                                                                deadline, on_usage), deadline)
                except _SchemaRejected as exc:
                    status = exc.status
                    self.schema_format = index + 1  # remembered: this form is not asked again
                    if self.schema_format == len(SCHEMA_FORMATS):
                        log.info("%s rejects structured output; planning in free text from now on", self.describe)
            if structured == "on":
                raise LLMError(f"{self.describe} does not accept structured output (response_format json_schema "
                               f"or json_object with a schema{f', HTTP {status}' if status else ''}); "
                               "set structured_output: auto or off")
        return self._call(lambda timeout: self._chat(messages, extra, on_token, timeout, deadline, on_usage), deadline)

    def _chat(self, messages, extra, on_token, timeout: float, deadline: float | None, on_usage=None) -> str:
        try:
            return self._chat_once(messages, extra, on_token, timeout, deadline, on_usage)
        except openai.APIStatusError as exc:
            rejected = exc.status_code in (400, 422) or (exc.status_code == 500 and "response_format" in str(exc))
            if "response_format" in extra and rejected:  # not 404: that is a wrong URL
                raise _SchemaRejected(exc.status_code) from None
            raise

    def _chat_once(self, messages, extra, on_token, timeout: float, deadline: float | None, on_usage=None) -> str:
        body = {**extra, "model": self.settings.model, "messages": messages}
        return self._request("/chat/completions", body, on_token, timeout, deadline,
                             lambda choice: (choice.get("message") or {}).get("content"),
                             lambda choice: (choice.get("delta") or {}).get("content"), on_usage)

    def _complete(self, prompt: str, extra, on_token, timeout: float, deadline: float | None, on_usage=None) -> str:
        body = {"max_tokens": 2048, **extra, "model": self.settings.model, "prompt": prompt}
        return self._request("/completions", body, on_token, timeout, deadline,
                             lambda choice: choice.get("text"), lambda choice: choice.get("text"), on_usage)

    def _request(self, path: str, body: dict[str, Any], on_token, timeout: float, deadline: float | None,
                 text_of: Callable[[dict], Any], piece_of: Callable[[dict], Any], on_usage=None) -> str:
        """One call through the SDK's client (its auth, Azure routing, errors, SSE), with plain JSON in and out:
        its typed `create` spends more CPU checking our messages and building a model per streamed chunk than
        the rest of a request does (bench/load.py)."""
        with deadline_scope(deadline):  # a read past it, or past `timeout`, is the SDK's APITimeoutError (`_call`)
            return self._request_within(path, body, on_token, timeout, text_of, piece_of, on_usage)

    def _request_within(self, path: str, body: dict[str, Any], on_token, timeout: float,
                        text_of: Callable[[dict], Any], piece_of: Callable[[dict], Any], on_usage=None) -> str:
        options = {"timeout": timeout}
        if on_token is None:
            resp = self._client.post(path, body=body, cast_to=object, options=options)
            choices = resp.get("choices") if isinstance(resp, dict) else None
            if not isinstance(choices, list):
                raise _NotOpenAI()
            if on_usage is not None and isinstance(resp.get("usage"), dict):
                on_usage(resp["usage"])
            if not choices:
                raise LLMError(f"{self.describe} returned no choices")
            first = choices[0] if isinstance(choices[0], dict) else {}
            return clean_text(str(text_of(first) or ""))
        stream = self._client.post(path, body={**body, "stream": True}, cast_to=object, options=options,
                                   stream=True, stream_cls=_ChunkStream)
        chunks = []
        try:
            for chunk in stream:  # every read is bounded by the request's deadline (`deadline_scope` in _request)
                choices = chunk.get("choices") if isinstance(chunk, dict) else None
                if on_usage is not None and isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                    on_usage(chunk["usage"])
                piece = piece_of(choices[0]) if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                    else None
                if piece:
                    piece = clean_text(str(piece))
                    chunks.append(piece)
                    _deliver(on_token, piece)
        finally:
            stream.close()
        return "".join(chunks)

    def _call(self, attempt: Callable[[float], str], deadline: float | None) -> str:
        """Run one attempt after another on 408/409/429/5xx and connection errors, as the SDK would,
        but never past the deadline: each attempt's timeout is the time left."""
        tries = 0
        while True:
            timeout = self.settings.timeout
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0.05:
                    raise DeadlineExceeded(f"the request's deadline passed before {self.describe} answered")
                timeout = min(timeout, left)
            try:
                try:
                    return attempt(timeout)
                except Exception:
                    cancel.check(f"the call to {self.describe}")  # a cancelled request's call broke off on purpose
                    raise
            except _CallbackFailed as exc:  # our own code failed, not the LLM: its error, status and all
                raise exc.error from exc.error.__cause__
            except (LLMError, DeadlineExceeded, _SchemaRejected):
                raise
            except openai.APIStatusError as exc:
                if exc.status_code not in (408, 409, 429) and exc.status_code < 500 or tries >= self.settings.max_retries:
                    raise LLMError(self._status_message(exc)) from None
                wait = _retry_after(exc) or _backoff(tries)
            except openai.APITimeoutError:
                if deadline is not None and time.monotonic() >= deadline - 0.05:
                    raise DeadlineExceeded(f"{self.describe} did not answer before the request's deadline") from None
                if self.settings.api_type == "local":  # one request at a time there: a retry queues behind itself
                    raise LLMError(f"{self.describe} timed out after {timeout:g}s (not retried: a local LLM server "
                                   "runs one request at a time; raise llm_timeout for a slow machine)") from None
                if tries >= self.settings.max_retries:
                    raise LLMError(f"{self.describe} timed out after {timeout:g}s") from None
                wait = _backoff(tries)
            except openai.APIConnectionError as exc:
                # No connection at all (refused, no such host): retrying would only make the person wait.
                if tries >= self.settings.max_retries or isinstance(exc.__cause__, httpx2.ConnectError):
                    if not self.settings.trusted:
                        raise LLMError(UNREACHABLE_ENDPOINT) from None
                    raise LLMError(f"{self.describe} is unreachable (connection failed)") from None
                wait = _backoff(tries)
            except _NotOpenAI:
                raise LLMError(f"{self.describe} answered with something that is not an OpenAI-style completion "
                               "(is api_endpoint the /v1 base of an OpenAI-compatible server?)") from None
            except openai.OpenAIError as exc:
                raise LLMError(self._redact(f"{self.describe} failed: {self._detail(exc)}")) from None
            except (AttributeError, TypeError, ValueError, KeyError, IndexError):
                raise LLMError(f"{self.describe} answered in an unexpected shape (not an OpenAI-style completion)") \
                    from None
            tries += 1
            if deadline is not None and time.monotonic() + wait >= deadline:
                raise DeadlineExceeded(f"{self.describe} kept failing until the request's deadline")
            log.warning("%s: retrying in %.1fs (attempt %d of %d)", self.describe_for_log, wait, tries + 1,
                        self.settings.max_retries + 1)
            cancel.sleep(wait)

    def _status_message(self, exc: openai.APIStatusError) -> str:
        """An endpoint the request chose gets no echo of its error body (it could be any internal service)."""
        if not self.settings.trusted:
            return f"{self.describe} answered HTTP {exc.status_code}"
        return self._redact(f"{self.describe} answered HTTP {exc.status_code}: {_short(exc)}")

    def _detail(self, exc: Exception) -> str:
        return _short(exc) if self.settings.trusted else exc.__class__.__name__

    def _redact(self, text: str) -> str:
        key = self.settings.api_key
        if key and len(key) >= 4:
            text = text.replace(key, "***")
        return redact_urls_in(re.sub(r"sk-[A-Za-z0-9_\-*]{6,}", "sk-***", text))


# The ways OpenAI-compatible servers take a JSON schema, tried in order until one is accepted: OpenAI, Azure,
# vLLM, Ollama and recent llama.cpp take the first; llama-cpp-python's server (and llama.cpp) the second.
SCHEMA_FORMATS = (
    lambda schema: {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema, "strict": True}},
    lambda schema: {"type": "json_object", "schema": schema},
)


DRAIN_SECONDS = 1.0  # how long the end of a streamed body after [DONE] is waited for (normally: no time at all)


class _ChunkStream(openai.Stream[object]):
    """The SDK's stream of JSON chunks (its SSE decoding), with the body read to its end after `[DONE]`: an
    HTTP/1.1 connection goes back to the pool only then. The SDK's async stream does this; its sync stream
    closes the response at `[DONE]`, so every streamed call (each plan) paid a new connection, a TLS handshake
    with a hosted LLM. What follows `[DONE]` is waited for at most DRAIN_SECONDS."""

    def __stream__(self) -> Iterator[object]:
        events = self._iter_events()
        try:
            for sse in events:
                if sse.data.startswith("[DONE]"):
                    if self.response.http_version == "HTTP/1.1":
                        _drain(events)
                    break
                data = sse.json()
                if isinstance(data, dict) and data.get("error"):
                    error = data["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    raise openai.APIError(message=message if isinstance(message, str) and message
                                          else "An error occurred during streaming",
                                          request=self.response.request, body=error)
                yield data
        finally:
            self.response.close()


# Token caps of the LLM stages on a local backend, sized to what each writes: a choice is one short JSON object,
# an answer a few paragraphs. Such a server runs one request at a time and a reply with no cap can run to the
# end of its context, holding everyone behind it. (The plan's cap follows from max_tasks: planner.py.)
LOCAL_TOKEN_CAPS = {"choose_model": 160, "answer": 700, "chat": 500, "text_task": 500}


def is_local(llm: Any) -> bool:
    """Whether a client (or its settings) talks to a local server (llama.cpp, Ollama, vLLM: `local.endpoint`)."""
    settings = getattr(llm, "settings", llm)
    return getattr(settings, "api_type", None) == "local"


def stage_cap(llm: Any, stage: str) -> int | None:
    """The token cap of one stage's call: on a local backend LOCAL_TOKEN_CAPS, elsewhere none (the provider's)."""
    return LOCAL_TOKEN_CAPS[stage] if is_local(llm) else None


def ignore_tokens(piece: str) -> None:
    """The token sink of a call streamed only so that a local server notices when its caller leaves."""


def _drain(events: Iterator[Any]) -> None:
    """Read what is left of a streamed body (its last chunk), a few events and DRAIN_SECONDS at most: a peer
    that keeps writing after `[DONE]` loses its connection, not the request's time."""
    try:
        with deadline_scope(time.monotonic() + DRAIN_SECONDS):
            for n, _ in enumerate(events):
                if n >= 8:
                    return
    except (openai.APIError, httpx2.HTTPError):
        pass


class _SchemaRejected(Exception):
    """The backend refused `response_format` json_schema (it does not support structured output)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class _NotOpenAI(Exception):
    """The endpoint answered 200 with something that is not a completion object."""


class _CallbackFailed(Exception):
    """The caller's `on_token` raised: carried past the handlers that judge the LLM's answer, then re-raised
    as itself (a sink's BadRequest stays a 400, a bug in our code is not blamed on the LLM's shape)."""

    def __init__(self, error: Exception):
        super().__init__(error)
        self.error = error


def _deliver(on_token: Callable[[str], None], piece: str) -> None:
    try:
        on_token(piece)
    except Exception as exc:  # noqa: BLE001 - re-raised unchanged by LLMClient._call
        raise _CallbackFailed(exc) from None


def _backoff(tries: int) -> float:
    return min(8.0, 0.5 * 2**tries) * random.uniform(0.75, 1.0)


def _retry_after(exc: openai.APIStatusError) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms), capped at 60."""
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        if headers.get("retry-after-ms"):
            return min(60.0, max(0.0, float(headers["retry-after-ms"]) / 1000))
        value = headers.get("retry-after")
        if value:
            try:
                return min(60.0, max(0.0, float(value)))
            except ValueError:
                when = email.utils.parsedate_to_datetime(value).timestamp()
                return min(60.0, max(0.0, when - time.time()))
    except (TypeError, ValueError):
        return None
    return None


def _short(exc: Exception) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str):
            return err[:300]
    response = getattr(exc, "response", None)
    text = getattr(response, "text", None) if response is not None else None
    if isinstance(text, str) and text.strip():
        return " ".join(text.split())[:300]
    return str(exc).splitlines()[0][:300] if str(exc) else exc.__class__.__name__


class DeadlineLLM:
    """One request's view of a shared client: every call carries that request's deadline."""

    def __init__(self, client: LLMClient, deadline: float | None,
                 observe: Callable[[str, bool, float, dict[str, Any] | None], None] | None = None):
        """observe(backend kind, ok, seconds, usage): told of every call (the server's metrics)."""
        self.client = client
        self.deadline = deadline
        self.observe = observe
        self.usage: dict[str, int] = {}  # tokens this request's calls used, as their backends reported them
        self._usage_lock = threading.Lock()

    @property
    def settings(self) -> LLMSettings:
        return self.client.settings

    @property
    def describe(self) -> str:
        return self.client.describe

    def chat(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        kwargs.setdefault("deadline", self.deadline)
        usage: list[dict[str, Any]] = []
        started, ok = time.perf_counter(), False
        try:
            reply = self.client.chat(messages, on_usage=usage.append, **kwargs)
            ok = True
            return reply
        finally:
            last = usage[-1] if usage else None  # a stream may report usage more than once: the last is the total
            if last:
                with self._usage_lock:
                    for key in ("prompt_tokens", "completion_tokens"):
                        value = last.get(key)
                        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                            self.usage[key] = self.usage.get(key, 0) + value
            if self.observe is not None:
                self.observe(self.client.settings.api_type or "none", ok, time.perf_counter() - started, last)


class ClientCache:
    """LLM clients by their settings, shared by requests: they are thread-safe and costly to build (TLS)."""

    def __init__(self, proxy: str | None = None, limit: int = 64):
        self.proxy = proxy
        self.limit = limit
        self._clients: dict[LLMSettings, LLMClient] = {}
        self._lock = threading.Lock()

    def get(self, settings: LLMSettings) -> LLMClient:
        with self._lock:
            client = self._clients.get(settings)
            if client is None:
                if len(self._clients) > self.limit:
                    self._clients.clear()
                client = self._clients[settings] = LLMClient(settings, proxy=self.proxy)
            return client
