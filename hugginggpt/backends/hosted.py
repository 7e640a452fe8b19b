"""Hosted inference through `huggingface_hub.InferenceClient`: Hugging Face Inference Providers (hf-inference,
fal-ai, replicate, together, ... through the Hub's router), or an own Inference Endpoint / TGI
(`huggingface.base_url`), normalised exactly like local results.

Which providers may serve a model is the model's `inferenceProviderMapping` on the Hub (live entries only),
read with the configured token, so `huggingface.providers: auto` keeps the order the user set in their Hub
settings (what `InferenceClient(provider="auto")` does); a list keeps the providers it names, in its order.
A call goes to the first provider; on a provider error (429, 503, 5xx, a timeout, a model the provider no
longer serves) the next one is tried, and only then the next model. A refused token (401) or spent credits
(402) are the account's, not the provider's: no other provider or hosted model is tried. The Hub's own
failures (its model API down, slow or refusing the token) are named as the Hub's, never a provider's, and a
provider's output file is fetched under the URL policy (hubclient.py); failures.py says what each one means.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from .. import cancel
from ..errors import BackendError
from ..resources import decode_image, save_bytes, save_image
from ..urlpolicy import UrlPolicy, current_deadline, deadline_scope, watched_adapter
from . import HostedFailure, ModelStatus, TaskInputs, note_attempts
from .failures import HUB_NAME, Failure, from_http, hub_failure, one_line, provider_failure
from .hubclient import HUB, HostedCall, hosted_call, install_hub_client
from .normalize import draw_boxes, overlay_masks

log = logging.getLogger(__name__)

ROUTER_URL = "https://router.huggingface.co"  # huggingface_hub's INFERENCE_PROXY_TEMPLATE, without the provider
DEFAULT_BASE_URL = f"{ROUTER_URL}/hf-inference"
ENDPOINT = "endpoint"  # the provider name of an own endpoint (`huggingface.base_url`), in records and metrics
TEXT_GENERATION = ("text-generation", "text2text-generation", "conversational")


def known_providers() -> tuple[str, ...]:
    """The Inference Providers this huggingface_hub can call (`provider=` values, "auto" aside)."""
    from huggingface_hub.inference._providers import PROVIDERS

    return tuple(PROVIDERS)


@dataclass(frozen=True)
class Route:
    """One provider serving a model: its name and the task the Hub maps the model to on it; `mapping`: the Hub's
    whole entry (huggingface_hub's InferenceProviderMapping), handed to InferenceClient with the call."""

    provider: str
    task: str
    mapping: Any = field(default=None, compare=False, repr=False)

    def fits(self, task: str) -> bool:
        """Can a planned `task` run on this route? (a chat model serves the text-generation tasks)"""
        return self.task == task or (task in TEXT_GENERATION and self.task in ("conversational", "text-generation"))


def plain(value: Any) -> Any:
    """InferenceClient output objects -> JSON-serialisable data."""
    if is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in asdict(value).items() if v is not None}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


class HostedInference:
    name = "huggingface"

    def __init__(self, token: str | None, public_dir: Path, base_url: str | None = None, timeout: float = 120.0,  # pragma: no mutate: from_config passes every setting
                 status_timeout: float = 3.0, proxy: str | None = None, providers: tuple[str, ...] = (),  # pragma: no mutate: from_config passes every setting
                 router_url: str | None = None, hub_url: str | None = None,  # pragma: no mutate: from_config passes every setting
                 status_ttl: float = 30.0,  # pragma: no mutate: from_config passes every setting
                 url_policy: UrlPolicy | None = None, max_fetch_bytes: int = 20 * 1024 * 1024,  # pragma: no mutate: from_config passes every setting
                 ):
        """providers: the Inference Providers allowed, in order (empty: auto, the user's order on the Hub).
        router_url: the Hub's router (default https://router.huggingface.co); hub_url: the Hub whose model
        API says which providers serve a model (default HF_ENDPOINT, else huggingface.co). Both are followed by
        InferenceClient's own calls too. status_ttl: how long a model's providers are remembered.
        url_policy, max_fetch_bytes: what a provider's output file (a URL the provider chose) may reach and weigh."""
        self.token = token
        self.public_dir = public_dir
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.custom_base = base_url is not None
        self.timeout = timeout
        self.status_timeout = status_timeout
        self.proxy = proxy
        self.proxies = {"http": proxy, "https": proxy} if proxy else None
        self.providers = tuple(providers)
        self.router_url = (router_url or ROUTER_URL).rstrip("/")
        self.hub_url = hub_url.rstrip("/") if hub_url else None
        self.status_ttl = status_ttl
        self.url_policy = url_policy or UrlPolicy()
        self.max_fetch_bytes = max_fetch_bytes
        # told of every provider call: observe_provider(provider, outcome, seconds) (the server's metrics)
        self.observe_provider: Callable[[str, str, float], None] | None = None
        # told of every failed Hub lookup: observe_hub(outcome) (the server's metrics; never a provider's)
        self.observe_hub: Callable[[str], None] | None = None
        self._routes: dict[str, tuple[tuple[Route, ...], float]] = {}  # every live route, before huggingface.providers
        self._routes_lock = threading.Lock()
        self._refused_tokens: set[str] = set()  # tokens the Hub refused, already logged (a digest, never the token)
        install_hub_client(proxy)
        self._http = requests.Session()
        adapter = watched_adapter()  # a status endpoint that dribbles is cut at status_timeout too
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)  # pragma: no mutate: no TLS peer in tests

    @classmethod
    def from_config(cls, config) -> HostedInference:
        return cls(config.huggingface_token, config.public_dir, config.huggingface_base_url, config.task_timeout,
                   config.status_timeout, config.proxy, providers=config.huggingface_providers,
                   router_url=config.huggingface_router_url, hub_url=config.catalog_endpoint,
                   status_ttl=config.status_cache_seconds, url_policy=config.url_policy(),
                   max_fetch_bytes=config.max_fetch_bytes)

    def model_url(self, model_id: str) -> str:
        if "{model}" in self.base_url:
            return self.base_url.replace("{model}", model_id)
        return f"{self.base_url}/models/{model_id}"

    def status_url(self, model_id: str) -> str:
        """JARVIS's `/status/<id>` beside its `/models/<id>` (in a template, `/models/{model}` is `/status/{model}`;
        a template without it is asked at the model's own URL)."""
        if "{model}" in self.base_url:
            return self.base_url.replace("/models/{model}", "/status/{model}").replace("{model}", model_id)
        return f"{self.base_url}/status/{model_id}"

    def _headers(self) -> dict[str, str]:  # asked for only with a token
        return {"Authorization": f"Bearer {self.token}"}  # pragma: no mutate: header names are case-insensitive

    def is_available(self, model_id: str) -> bool:
        return self.model_status(model_id).available

    def model_status(self, model_id: str) -> ModelStatus:
        """Can hosted inference run `model_id` now, and if not, why. A custom base URL answers JARVIS's
        `/status/<id>`; otherwise some allowed provider must serve the model (its live provider mapping on the
        Hub). The Hub failing or slow is no answer (`lasting` False: not remembered as "unavailable")."""
        if not self.token:
            return ModelStatus(False, NO_TOKEN)
        if self.custom_base:
            return self._endpoint_status(model_id)
        try:
            with deadline_scope(time.monotonic() + self.status_timeout):
                live = self._live_routes(model_id)
        except Exception as exc:  # noqa: BLE001 - the Hub's answer, whatever went wrong, in one line
            failure = self._hub_failed(exc, model_id, self.status_timeout)
            return ModelStatus(False, failure.line, lasting=failure.answered)
        if not live:
            return ModelStatus(False, f"no Inference Provider serves {model_id} now (the Hub maps it to none live)")
        if not self._allowed(live):
            served = ", ".join(dict.fromkeys(r.provider for r in live))
            return ModelStatus(False, f"{model_id} is served only by {served}, which huggingface.providers "
                                      f"({', '.join(self.providers)}) leaves out")
        return ModelStatus(True)

    def _endpoint_status(self, model_id: str) -> ModelStatus:
        try:
            with deadline_scope(time.monotonic() + self.status_timeout):
                resp = self._http.get(self.status_url(model_id), headers=self._headers(),
                                      timeout=self.status_timeout, proxies=self.proxies)
                data = resp.json() if resp.status_code == 200 else {}
        except Exception as exc:  # noqa: BLE001 - any failure means "not available now"
            return ModelStatus(False, f"the endpoint at huggingface.base_url did not answer its status check "
                                      f"({exc.__class__.__name__})", lasting=False)
        if bool(data.get("loaded")) or data.get("state") in ("Loadable", "Loaded"):
            return ModelStatus(True)
        return ModelStatus(False, f"the endpoint at huggingface.base_url does not serve {model_id} now")

    def routes(self, model_id: str) -> tuple[Route, ...]:
        """The allowed providers serving `model_id` now, in the order they are tried (remembered status_ttl s)."""
        return self._allowed(self._live_routes(model_id))

    def _allowed(self, live: tuple[Route, ...]) -> tuple[Route, ...]:
        if not self.providers:
            return live
        return tuple(sorted((r for r in live if r.provider in self.providers), key=lambda r: self.providers.index(r.provider)))

    def _live_routes(self, model_id: str) -> tuple[Route, ...]:
        """Every live provider of `model_id` this huggingface_hub can call, in the user's order (remembered
        status_ttl s; a failed lookup raises and is not remembered)."""
        now = time.monotonic()
        with self._routes_lock:
            hit = self._routes.get(model_id)
        if hit is not None and hit[1] > now:  # pragma: no mutate: > and >= differ only at one instant
            return hit[0]
        from huggingface_hub import HfApi

        info = HfApi(endpoint=self.hub_url, token=self.token).model_info(  # bounded by the caller's deadline_scope
            model_id, expand=["inferenceProviderMapping"])
        callable_ = _callable_tasks()
        found = tuple(Route(m.provider, m.task, m) for m in (info.inference_provider_mapping or [])
                      if m.status == "live" and m.task in callable_.get(m.provider, ()))
        if self.status_ttl > 0:  # pragma: no mutate: at 0 an entry would be stored expired, never read
            with self._routes_lock:
                if len(self._routes) > 10_000:
                    self._routes.clear()
                self._routes[model_id] = (found, now + self.status_ttl)
        return found

    def _hub_failed(self, exc: BaseException, model_id: str, slow_after: float) -> Failure:
        """The Hub's failure, logged (a refused token once per token, not per task) and counted as the Hub's.
        slow_after: the bound the lookup ran under."""
        failure = hub_failure(exc, model_id, slow_after, one_line(exc, self.token))
        if self.observe_hub is not None and (failure.account or not failure.answered):  # "no such model" is no failure
            self.observe_hub(failure.outcome)
        if failure.outcome == "unauthorized":
            digest = hashlib.sha256((self.token or "").encode()).hexdigest()
            with self._routes_lock:
                first = digest not in self._refused_tokens
                self._refused_tokens.add(digest)
            if first:
                log.error("hosted inference: %s", failure.line)
        elif not failure.answered:  # the Hub failed or was slow (a model it does not know is an answer)
            log.warning("hosted inference: %s", failure.line)
        return failure

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]:
        """The task's result, with `provider` (who served it) and, when providers before it failed,
        `fallback.tried`. Raises HostedFailure naming every provider tried and why it failed."""
        if not self.token:
            raise BackendError(NO_TOKEN)
        handler = HANDLERS.get(inputs.task)
        if handler is None:
            raise BackendError(f"hosted inference does not support {inputs.task}")
        if self.custom_base:
            note_attempts([], {"model": model_id, "hosted_on": self.name, "provider": ENDPOINT})
            return self._on_provider(ENDPOINT, "hf-inference", self.model_url(model_id), model_id, handler, inputs)
        try:
            with deadline_scope(time.monotonic() + self.status_timeout):
                routes = [r for r in self.routes(model_id) if r.fits(inputs.task)]
        except Exception as exc:  # noqa: BLE001 - the Hub's answer, whatever went wrong, in one line
            failure = self._hub_failed(exc, model_id, self.status_timeout)
            if failure.final:  # the Hub refused the token: the account's, as a router's 401 would be
                raise HostedFailure(failure.line, [{"model": model_id, "hosted_on": self.name, "error": failure.line}],
                                    final=True) from None
            raise BackendError(failure.line) from None
        if not routes:
            allowed = f" among huggingface.providers ({', '.join(self.providers)})" if self.providers else ""
            raise BackendError(f"no Inference Provider{allowed} serves {model_id} for {inputs.task} now")
        tried: list[dict[str, str]] = []
        for route in routes:
            token = cancel.current()
            if token is not None and token.cancelled:
                break
            use = CHAT if route.task == "conversational" and inputs.task in TEXT_GENERATION else handler
            note_attempts(tried, {"model": model_id, "hosted_on": self.name, "provider": route.provider})
            try:
                hand_over(route, model_id)
                result = self._on_provider(route.provider, route.provider, model_id, model_id, use, inputs)
            except HostedFailure as exc:
                tried += exc.tried
                if exc.final:
                    raise HostedFailure(str(exc), tried, final=True, account=exc.account) from None
                continue
            if tried:
                result["fallback"] = {"tried": tried}
            return result
        if len(tried) == 1:
            raise HostedFailure(f"hosted inference of {model_id} failed: {tried[0]['error']}", tried)
        reasons = "; ".join(t["error"] for t in tried) or "cancelled"
        raise HostedFailure(f"hosted inference of {model_id} failed on every provider: {reasons}", tried)

    def _call(self) -> HostedCall:
        """This call's view of the network (hubclient.py): the configured router and Hub, the token the Hub's
        lookups carry, and the policy a provider's files are fetched under."""
        from huggingface_hub import constants

        library_hub = constants.ENDPOINT.rstrip("/")
        hub = self.hub_url or library_hub
        moves = []
        if self.router_url != ROUTER_URL:
            moves.append((ROUTER_URL, self.router_url))
        if hub != library_hub:
            moves.append((library_hub, hub))
        if self.custom_base:  # an own endpoint: its origin is the configured one
            parts = urlsplit(self.base_url)
            router = f"{parts.scheme}://{parts.netloc}"
        else:
            router = self.router_url
        return HostedCall(tuple(moves), router, hub, self.token, self.url_policy, self.max_fetch_bytes, self.timeout,
                          self.proxy)

    def _on_provider(self, label: str, provider: str, model: str, model_id: str, handler: Handler,
                     inputs: TaskInputs) -> dict[str, Any]:
        """One call of `handler` on one provider (label: its name in records and metrics). task_timeout bounds
        the whole call, however the provider paces its bytes (InferenceClient's own timeout is per read); the
        request's deadline, when it comes first, is the bound (scopes nest)."""
        from huggingface_hub import InferenceClient

        client = InferenceClient(provider=provider, token=self.token, timeout=self.timeout)
        started = time.perf_counter()
        outcome, call = "error", self._call()
        try:
            request_deadline = current_deadline()  # the request's, before this call's own task_timeout scope
            with deadline_scope(time.monotonic() + self.timeout), hosted_call(call):
                try:
                    result = handler(self, client, model, inputs)
                    outcome = "ok"
                    return {**result, "provider": label}
                except BackendError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the client raises many types; report one line
                    # only the request's deadline ends every hosted try: a provider silent for task_timeout
                    # is one provider's failure, and the next one is asked
                    left = request_deadline - time.monotonic() if request_deadline is not None else math.inf
                    if call.last == HUB and from_http(exc):  # InferenceClient's own lookup: the Hub failed
                        failure = self._hub_failed(exc, model_id, self.timeout)
                        if left <= 0.05:
                            failure = Failure("timeout", f"{HUB_NAME} did not answer before the deadline passed", True)
                        entry = {"model": model_id, "hosted_on": self.name, "error": failure.line}
                    else:
                        who = "the endpoint at huggingface.base_url" if label == ENDPOINT else label
                        failure = provider_failure(exc, who, model_id, self.timeout, left,
                                                   one_line(exc, self.token))
                        outcome = failure.outcome
                        entry = {"model": model_id, "hosted_on": self.name, "provider": label, "error": failure.line}
                    raise HostedFailure(f"hosted inference of {model_id} failed: {failure.line}", [entry],
                                        final=failure.final, account=failure.account) from None
        finally:
            if self.observe_provider is not None and call.routed:  # a call that never reached the provider is not its
                self.observe_provider(label, outcome, time.perf_counter() - started)

    def save_image(self, image: Any) -> str:
        return save_image(self.public_dir, image)


NO_TOKEN = ("hosted inference needs a Hugging Face token: set huggingface.token in the config or export "
            "HUGGINGFACE_ACCESS_TOKEN")


def hand_over(route: Route, model_id: str) -> None:
    """InferenceClient's providers read a model's mapping from a table of the library's before they ask the Hub
    for it again (anonymously, or with a stale token from HF_HOME) and keep that answer for the life of the
    process (a provider added or gone later is never seen): the mapping just read, with the configured token and
    within status_cache_seconds, goes there. hf-inference takes no mapping: it looks the model up itself (that
    lookup carries the configured token, hubclient.py)."""
    if route.mapping is None or route.provider == "hf-inference":
        return
    from huggingface_hub.inference._providers._common import HARDCODED_MODEL_INFERENCE_MAPPING

    HARDCODED_MODEL_INFERENCE_MAPPING.setdefault(route.provider, {})[model_id] = route.mapping


def _callable_tasks() -> dict[str, set[str]]:
    """provider -> the tasks huggingface_hub can call it for and a handler here can run."""
    from huggingface_hub.inference._providers import PROVIDERS

    return {name: set(tasks) & set(HANDLERS) for name, tasks in PROVIDERS.items()}



def _need(inputs: TaskInputs, field: str) -> Any:
    value = getattr(inputs, field)
    if value is None:
        raise BackendError(f"{inputs.task} needs an {field} argument")
    return value.data if field in ("image", "audio") else value


def _split_pair(text: str) -> tuple[str, str]:
    for sep in ("\n", " | ", "|", " vs. ", " vs "):
        if sep in text:
            a, b = text.split(sep, 1)
            return a.strip(), b.strip()
    return text, text


Handler = Callable[[HostedInference, Any, str, TaskInputs], dict[str, Any]]


def _image(value: Any) -> Any:
    """A mask or picture the API sent as a PIL image or as base64 PNG."""
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(value))) if isinstance(value, str) else value


def _segmentation(h: HostedInference, c: Any, m: str, i: TaskInputs) -> dict[str, Any]:

    segments = c.image_segmentation(_need(i, "image"), model=m)
    base = decode_image(i.image.data, what="the input image")
    overlay = overlay_masks(base, [_image(seg.mask) for seg in segments])
    return {"generated image": h.save_image(overlay), "predicted": [{"label": s.label, "score": s.score} for s in segments]}


def _object_detection(h: HostedInference, c: Any, m: str, i: TaskInputs) -> dict[str, Any]:
    predicted = plain(c.object_detection(_need(i, "image"), model=m))
    return {"generated image": draw_boxes(i, predicted, h.public_dir), "predicted": predicted}


def _audio_to_audio(h: HostedInference, c: Any, m: str, i: TaskInputs) -> dict[str, Any]:
    out = c.audio_to_audio(_need(i, "audio"), model=m)  # the client decodes each base64 blob to bytes
    return {"generated audio": save_bytes(h.public_dir, "audio", out[0].blob, "flac"), "predicted": [o.label for o in out]}


def _chat(h: HostedInference, c: Any, m: str, i: TaskInputs) -> dict[str, Any]:
    """A text-generation task on a provider that serves the model as a chat model (the usual case)."""
    out = c.chat_completion([{"role": "user", "content": _need(i, "text")}], model=m)
    return {"generated text": out.choices[0].message.content or ""}


CHAT: Handler = _chat

HANDLERS: dict[str, Handler] = {
    "text-classification": lambda h, c, m, i: {"predicted": plain(c.text_classification(_need(i, "text"), model=m))},
    "token-classification": lambda h, c, m, i: {"predicted": plain(c.token_classification(_need(i, "text"), model=m))},
    "question-answering": lambda h, c, m, i: plain(c.question_answering(*_split_pair(_need(i, "text")), model=m)),
    "sentence-similarity": lambda h, c, m, i: {
        "score": c.sentence_similarity(_split_pair(_need(i, "text"))[0], [_split_pair(i.text)[1]], model=m)[0]},
    "summarization": lambda h, c, m, i: {"generated text": c.summarization(_need(i, "text"), model=m).summary_text},
    "translation": lambda h, c, m, i: {"generated text": c.translation(_need(i, "text"), model=m).translation_text},
    "text-generation": lambda h, c, m, i: {"generated text": c.text_generation(_need(i, "text"), model=m)},
    "text2text-generation": lambda h, c, m, i: {"generated text": c.text_generation(_need(i, "text"), model=m)},
    "conversational": lambda h, c, m, i: {"generated text": c.text_generation(_need(i, "text"), model=m)},
    "image-classification": lambda h, c, m, i: {"predicted": plain(c.image_classification(_need(i, "image"), model=m))},
    "object-detection": _object_detection,
    "image-segmentation": _segmentation,
    "image-to-text": lambda h, c, m, i: {"generated text": c.image_to_text(_need(i, "image"), model=m).generated_text},
    "text-to-image": lambda h, c, m, i: {"generated image": h.save_image(c.text_to_image(_need(i, "text"), model=m))},
    "image-to-image": lambda h, c, m, i: {"generated image": h.save_image(c.image_to_image(_need(i, "image"), prompt=i.text, model=m))},
    "visual-question-answering": lambda h, c, m, i: {"predicted": plain(c.visual_question_answering(_need(i, "image"), _need(i, "text"), model=m))},
    "document-question-answering": lambda h, c, m, i: {"predicted": plain(c.document_question_answering(_need(i, "image"), _need(i, "text"), model=m))},
    "text-to-speech": lambda h, c, m, i: {"generated audio": save_bytes(h.public_dir, "audio", c.text_to_speech(_need(i, "text"), model=m), "flac")},
    "text-to-video": lambda h, c, m, i: {"generated video": save_bytes(h.public_dir, "video", c.text_to_video(_need(i, "text"), model=m), "mp4")},
    "automatic-speech-recognition": lambda h, c, m, i: {"text": c.automatic_speech_recognition(_need(i, "audio"), model=m).text},
    "audio-classification": lambda h, c, m, i: {"predicted": plain(c.audio_classification(_need(i, "audio"), model=m))},
    "audio-to-audio": _audio_to_audio,
}
