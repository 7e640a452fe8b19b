"""Hosted inference through `huggingface_hub.InferenceClient` (Hugging Face's serverless API,
an own Inference Endpoint, or TGI), normalised exactly like local results.
"""

from __future__ import annotations

import base64
import io
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import requests

from ..errors import BackendError
from ..resources import decode_image, save_bytes, save_image
from ..urlpolicy import bound_by_deadlines, deadline_scope, redact_urls_in, watched_adapter
from . import TaskInputs
from .normalize import draw_boxes, overlay_masks

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://router.huggingface.co/hf-inference"


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

    def __init__(self, token: str | None, public_dir: Path, base_url: str | None = None, timeout: float = 120.0,
                 status_timeout: float = 3.0, proxy: str | None = None):
        self.token = token
        self.public_dir = public_dir
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.custom_base = base_url is not None
        self.timeout = timeout
        self.status_timeout = status_timeout
        self.proxies = {"http": proxy, "https": proxy} if proxy else None
        install_hub_client(proxy)
        self._http = requests.Session()
        adapter = watched_adapter()  # a status endpoint that dribbles is cut at status_timeout too
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)

    @classmethod
    def from_config(cls, config) -> HostedInference:
        return cls(config.huggingface_token, config.public_dir, config.huggingface_base_url, config.task_timeout,
                   config.status_timeout, config.proxy)

    def model_url(self, model_id: str) -> str:
        if "{model}" in self.base_url:
            return self.base_url.replace("{model}", model_id)
        return f"{self.base_url}/models/{model_id}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def is_available(self, model_id: str) -> bool:
        """A custom base URL answers JARVIS's `/status/<id>`; the public service is asked through the Hub."""
        if not self.token:
            return False
        try:
            with deadline_scope(time.monotonic() + self.status_timeout):
                if self.custom_base:
                    url = self.model_url(model_id).replace("/models/", "/status/", 1)
                    resp = self._http.get(url, headers=self._headers(), timeout=self.status_timeout,
                                          proxies=self.proxies)
                    data = resp.json() if resp.status_code == 200 else {}
                    return bool(data.get("loaded")) or data.get("state") in ("Loadable", "Loaded")
                from huggingface_hub import HfApi

                info = HfApi(token=self.token).model_info(model_id, expand=["inference"], timeout=self.status_timeout)
                return getattr(info, "inference", None) == "warm"
        except Exception:  # noqa: BLE001 - any failure means "not available now"
            return False

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]:
        if not self.token:
            raise BackendError("hosted inference needs a Hugging Face token: set huggingface.token in the config "
                               "or export HUGGINGFACE_ACCESS_TOKEN")
        from huggingface_hub import InferenceClient

        client = InferenceClient(provider="hf-inference", token=self.token, timeout=self.timeout)
        handler = HANDLERS.get(inputs.task)
        if handler is None:
            raise BackendError(f"hosted inference does not support {inputs.task}")
        # task_timeout bounds the whole call, however the endpoint paces its bytes (InferenceClient's own timeout
        # is per read); the request's deadline, when it comes first, is the bound (scopes nest)
        with deadline_scope(time.monotonic() + self.timeout) as watch:
            try:
                return handler(self, client, self.model_url(model_id), inputs)
            except BackendError:
                raise
            except Exception as exc:  # noqa: BLE001 - the client raises many types; report one line
                if _timed_out(exc):
                    left = watch.deadline - time.monotonic() if watch is not None else 1.0
                    why = "the deadline passed" if left <= 0.05 else f"no answer for {self.timeout:.0f}s"
                    raise BackendError(f"hosted inference of {model_id} timed out ({why})") from None
                message = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
                if self.token:
                    message = message.replace(self.token, "***")
                raise BackendError(f"hosted inference of {model_id} failed: {redact_urls_in(message)[:300]}") \
                    from None

    def save_image(self, image: Any) -> str:
        return save_image(self.public_dir, image)


_installed: list[str | None] = []
_install_lock = threading.Lock()


def install_hub_client(proxy: str | None) -> None:
    """huggingface_hub makes every HTTP call (InferenceClient, HfApi, downloads) through one process-wide client
    from a factory: ours bounds each read and write by the thread's `deadline_scope` (a hosted endpoint that
    dribbles a byte every few seconds would otherwise restart the read timeout for ever) and goes through
    `proxy`. Outside a deadline scope it behaves like the library's own client. Installed once per process."""
    with _install_lock:
        if _installed and _installed[0] == proxy:
            return
        import httpx2
        from huggingface_hub import set_client_factory

        try:
            from huggingface_hub.utils._http import hf_request_event_hook  # offline mode, request ids
            hooks = {"request": [hf_request_event_hook]}
        except ImportError:  # pragma: no cover - a huggingface_hub without it
            hooks = {}

        def factory() -> httpx2.Client:
            client = httpx2.Client(proxy=proxy, event_hooks=hooks, follow_redirects=True, timeout=None)
            for transport in (client._transport, *client._mounts.values()):  # env proxies are mounts
                if transport is not None:
                    bound_by_deadlines(transport)
            return client

        set_client_factory(factory)
        _installed[:] = [proxy]


def _timed_out(exc: BaseException | None) -> bool:
    """InferenceClient's timeout error, or the HTTP client's, anywhere in the chain."""
    import httpx2
    from huggingface_hub.errors import InferenceTimeoutError

    for _ in range(10):
        if exc is None:
            return False
        if isinstance(exc, (httpx2.TimeoutException, InferenceTimeoutError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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
    out = c.audio_to_audio(_need(i, "audio"), model=m)
    blob = out[0].blob if isinstance(out[0].blob, bytes) else base64.b64decode(out[0].blob)
    return {"generated audio": save_bytes(h.public_dir, "audio", blob, "flac"), "predicted": [o.label for o in out]}


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
