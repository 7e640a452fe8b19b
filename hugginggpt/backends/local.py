"""Client of the local models server, speaking JARVIS's protocol (`/status/<id>`, `/models/<id>`).

The models server may run on another machine with its own `public/`: a file it generated is copied from
its `GET /images|audios|videos/<name>` into our `public/` (size and time limits), so chains, the final
answer and the web page only ever name files this server can serve.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any

import requests

from ..errors import BackendError, ResourceError
from ..resources import KIND_DIRS, OUTPUT_PATH, extension_for, save_bytes, sniff_mime
from ..urlpolicy import UrlPolicy, deadline_scope, fetch, watched_adapter
from . import TaskInputs
from .normalize import FILE_KEYS, normalize

_KIND_OF_DIR = {folder: kind for kind, folder in KIND_DIRS.items()}

log = logging.getLogger(__name__)


class LocalModelsServer:
    name = "local"

    def __init__(self, base_url: str, public_dir: Path, status_timeout: float = 2.0, task_timeout: float = 300.0,
                 token: str | None = None, policy: UrlPolicy | None = None,
                 max_output_bytes: int = 200 * 1024 * 1024, copy_timeout: float = 60.0, connections: int = 64):
        """connections: kept-alive connections to the models server, about the requests in flight at once (a
        smaller pool closes and reopens a connection per call under load, and says so in the log)."""
        self.base_url = base_url.rstrip("/")
        self.public_dir = public_dir
        self.status_timeout = status_timeout
        self.task_timeout = task_timeout
        self.policy = policy or UrlPolicy()
        self.max_output_bytes = max_output_bytes
        self.copy_timeout = copy_timeout
        self._http = requests.Session()
        self._http.trust_env = False  # a configured, trusted endpoint: no proxy from the environment
        # Connections that obey `deadline_scope`: a peer that dribbles bytes cannot stretch a call past its deadline.
        adapter = watched_adapter(pool_connections=2, pool_maxsize=max(10, connections))
        self._http.mount("http://", adapter)
        self._http.mount("https://", adapter)
        if token:
            self._http.headers["Authorization"] = f"Bearer {token}"

    def running(self) -> bool:
        try:
            return bool(self._http.get(f"{self.base_url}/running", timeout=self.status_timeout).json().get("running"))
        except (requests.RequestException, ValueError, AttributeError):
            return False

    def is_available(self, model_id: str) -> bool:
        """Servable there now (`loaded`, JARVIS's word), or a Hub model it downloads on first use (`loadable`)."""
        try:
            resp = self._http.get(f"{self.base_url}/status/{model_id}", timeout=self.status_timeout)
            state = resp.json()
            return resp.status_code == 200 and bool(state.get("loaded") or state.get("loadable"))
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
        timed_out = f"the local models server timed out after {self.task_timeout:.0f}s on {model_id}"
        # task_timeout is the whole call's deadline (or the request's, if that comes first), not a per-read timeout
        with deadline_scope(time.monotonic() + self.task_timeout) as watch:
            try:
                resp = self._http.post(url, json=self.body(model_id, inputs), timeout=self.task_timeout)
            except requests.Timeout:
                raise BackendError(timed_out) from None
            except requests.RequestException as exc:
                if watch is not None and watch.fired:
                    raise BackendError(timed_out) from None
                raise BackendError(f"the local models server is unreachable ({exc.__class__.__name__})") from None
        try:
            raw = resp.json()
        except ValueError:
            raise BackendError(f"local models server answered HTTP {resp.status_code} without JSON for {model_id}") from None
        if resp.status_code >= 400 and not (isinstance(raw, dict) and "error" in raw):
            raw = {"error": {"message": f"HTTP {resp.status_code}"}}
        result = normalize(inputs.task, raw, inputs, self.public_dir)
        for key in FILE_KEYS:
            if isinstance(result.get(key), str) and result[key]:
                result[key] = self.bring_home(result[key])
        return result

    def bring_home(self, named: str) -> str:
        """A generated file the models server named -> a path under our own public/."""
        if re.match(r"^https?://", named, re.IGNORECASE):  # a URL in a result is as untrusted as a user's
            try:
                got = fetch(named, self.policy, self.max_output_bytes, self.copy_timeout)
            except ResourceError as exc:
                raise BackendError(f"the models server named an output URL that cannot be fetched: {exc}") from None
            mime = got.content_type or sniff_mime(got.data, named)
            kind = mime.split("/")[0] if mime.split("/")[0] in ("image", "audio", "video") else "image"
            return save_bytes(self.public_dir, kind, got.data, extension_for(mime, "bin"))
        m = OUTPUT_PATH.match("/" + named.strip().lstrip("/").removeprefix("public/"))
        if not m:
            raise BackendError(f"the models server named an output that is not a generated file: {named[:200]!r}")
        folder, name = m.groups()
        if (self.public_dir / folder / name).is_file():  # the two servers share one public/
            return f"/{folder}/{name}"
        url = f"{self.base_url}/{folder}/{name}"
        try:
            with deadline_scope(time.monotonic() + self.copy_timeout), \
                    self._http.get(url, stream=True, timeout=(self.status_timeout, self.copy_timeout)) as resp:
                if resp.status_code != 200:
                    raise BackendError(f"copying {named} from the models server failed: HTTP {resp.status_code}")
                chunks, size = [], 0
                for chunk in resp.iter_content(65536):
                    size += len(chunk)
                    if size > self.max_output_bytes:
                        raise BackendError(f"{named} on the models server is larger than the "
                                           f"{self.max_output_bytes // (1024 * 1024)} MiB output limit")
                    chunks.append(chunk)
        except requests.RequestException as exc:
            raise BackendError(f"copying {named} from the models server failed ({exc.__class__.__name__})") from None
        ext = name.rsplit(".", 1)[-1] if "." in name else "bin"
        return save_bytes(self.public_dir, _KIND_OF_DIR[folder], b"".join(chunks), ext)
