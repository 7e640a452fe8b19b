"""Client of the local models server, speaking JARVIS's protocol (`/status/<id>`, `/models/<id>`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import requests

from ..errors import BackendError
from . import TaskInputs
from .normalize import normalize

log = logging.getLogger(__name__)


class LocalModelsServer:
    name = "local"

    def __init__(self, base_url: str, public_dir: Path, status_timeout: float = 2.0, task_timeout: float = 300.0):
        self.base_url = base_url.rstrip("/")
        self.public_dir = public_dir
        self.status_timeout = status_timeout
        self.task_timeout = task_timeout
        self._http = requests.Session()

    def running(self) -> bool:
        try:
            return bool(self._http.get(f"{self.base_url}/running", timeout=self.status_timeout).json().get("running"))
        except (requests.RequestException, ValueError, AttributeError):
            return False

    def is_available(self, model_id: str) -> bool:
        try:
            resp = self._http.get(f"{self.base_url}/status/{model_id}", timeout=self.status_timeout)
            return resp.status_code == 200 and bool(resp.json().get("loaded"))
        except (requests.RequestException, ValueError, AttributeError):
            return False

    def body(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]:
        """JARVIS's request bodies; resources travel as data URIs so the server needs no shared disk."""
        body: dict[str, Any] = {}
        if inputs.image is not None:
            body["img_url"] = inputs.image.data_uri()
        if inputs.audio is not None:
            body["audio_url"] = inputs.audio.data_uri()
        if inputs.text is not None:
            body["text"] = inputs.text
        return body

    def infer(self, model_id: str, inputs: TaskInputs) -> dict[str, Any]:
        url = f"{self.base_url}/models/{model_id}"
        try:
            resp = self._http.post(url, json=self.body(model_id, inputs), timeout=self.task_timeout)
        except requests.Timeout:
            raise BackendError(f"local models server timed out after {self.task_timeout:.0f}s on {model_id}") from None
        except requests.RequestException as exc:
            raise BackendError(f"local models server at {self.base_url} is unreachable ({exc.__class__.__name__})") from None
        try:
            raw = resp.json()
        except ValueError:
            raise BackendError(f"local models server answered HTTP {resp.status_code} without JSON for {model_id}") from None
        if resp.status_code >= 400 and not (isinstance(raw, dict) and "error" in raw):
            raw = {"error": {"message": f"HTTP {resp.status_code}"}}
        return normalize(inputs.task, raw, inputs, self.public_dir)
