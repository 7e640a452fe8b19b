"""Client of the local models server, speaking JARVIS's protocol (`/status/<id>`, `/models/<id>`).

The models server may run on another machine with its own `public/`: a file it generated is copied from
its `GET /images|audios|videos/<name>` into our `public/` (size and time limits), so chains, the final
answer and the web page only ever name files this server can serve.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import certifi
import urllib3

from .. import taskprogress
from ..errors import BackendError, ResourceError
from ..resources import KIND_DIRS, OUTPUT_PATH, extension_for, save_bytes, sniff_mime
from ..urlpolicy import WATCHED_POOL_CLASSES, UrlPolicy, deadline_scope, fetch
from . import TaskInputs
from .events import WATCH, read_events
from .normalize import FILE_KEYS, normalize

_KIND_OF_DIR = {folder: kind for kind, folder in KIND_DIRS.items()}

log = logging.getLogger(__name__)


class LocalModelsServer:
    name = "local"

    def __init__(self, base_url: str, public_dir: Path,
                 status_timeout: float = 2.0, task_timeout: float = 300.0,  # pragma: no mutate: the server passes all
                 token: str | None = None, policy: UrlPolicy | None = None, max_output_bytes: int = 200 * 1024 * 1024,
                 copy_timeout: float = 60.0, connections: int = 64,  # pragma: no mutate: the server passes all
                 ):
        """connections: kept-alive connections to the models server, about the requests in flight at once (a
        smaller pool closes and reopens a connection per call under load, and says so in the log)."""
        self.base_url = base_url.rstrip("/")
        self.public_dir = public_dir
        self.status_timeout = status_timeout
        self.task_timeout = task_timeout
        self.policy = policy or UrlPolicy()
        self.max_output_bytes = max_output_bytes
        self.copy_timeout = copy_timeout
        # urllib3 itself, not requests: a model call is on every task's path, and requests' session machinery
        # (settings merged per call, hooks, cookies) cost more CPU than the call. A configured, trusted
        # endpoint: no proxy from the environment, no redirects followed, no retries (a task is not repeated).
        # Connections obey `deadline_scope`: a peer that dribbles bytes cannot stretch a call past its deadline.
        self._http = urllib3.PoolManager(maxsize=max(10, connections), retries=False,
                                         num_pools=2, ca_certs=certifi.where(),  # pragma: no mutate: one host; no TLS in tests
                                         )
        self._http.pool_classes_by_scheme = WATCHED_POOL_CLASSES
        self._headers = {
            "Authorization": f"Bearer {token}",  # pragma: no mutate: header names are case-insensitive
        } if token else {}

    def _get_json(self, path: str) -> tuple[int, Any]:
        resp = self._http.request(
            "GET",  # pragma: no mutate: urllib3 upper-cases the method
            self.base_url + path, headers=self._headers, timeout=urllib3.Timeout(total=self.status_timeout))
        return resp.status, json.loads(resp.data)

    def running(self) -> bool:
        try:
            return bool(self._get_json("/running")[1].get("running"))
        except (urllib3.exceptions.HTTPError, ValueError, AttributeError):
            return False

    def is_available(self, model_id: str) -> bool:
        """Servable there now (`loaded`, JARVIS's word), or a Hub model it downloads on first use (`loadable`)."""
        try:
            status, state = self._get_json(f"/status/{quote(model_id)}")
            return status == 200 and bool(state.get("loaded") or state.get("loadable"))
        except (urllib3.exceptions.HTTPError, ValueError, AttributeError):
            return False

    def body(self, inputs: TaskInputs) -> dict[str, Any]:
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
        url = f"{self.base_url}/models/{quote(model_id)}"
        body = json.dumps(self.body(inputs)).encode()  # ASCII: a lone surrogate travels as \ud800
        # task_timeout is the whole call's deadline (or the request's, if that comes first), not a per-read timeout
        own_deadline = time.monotonic() + self.task_timeout
        with deadline_scope(own_deadline) as watch:
            if watch is not None and watch.deadline < own_deadline:  # the request's deadline comes first
                timed_out = f"the request's deadline passed while the local models server ran {model_id}"
            else:
                timed_out = f"the local models server timed out after {self.task_timeout:.0f}s on {model_id}"
            listen = taskprogress.listener()  # someone watches this task: ask for the call's progress events
            try:
                resp = self._http.request(
                    "POST",  # pragma: no mutate: urllib3 upper-cases the method
                    url, body=body,
                    headers={**self._headers, **(WATCH if listen is not None else {}),
                             "Content-Type": "application/json"},  # pragma: no mutate: header names are case-insensitive
                    timeout=urllib3.Timeout(connect=self.task_timeout,
                                            read=self.task_timeout,  # pragma: no mutate: the deadline comes first
                                            ),
                    preload_content=listen is None)
                status, data = (resp.status, resp.data) if listen is None else answer_of_stream(resp, listen)
            except urllib3.exceptions.NewConnectionError:  # a subclass of TimeoutError, but nothing timed out
                raise BackendError("the local models server is unreachable (ConnectionError)") from None
            except urllib3.exceptions.TimeoutError:
                raise BackendError(timed_out) from None
            except urllib3.exceptions.HTTPError as exc:
                if watch is not None and watch.fired:
                    raise BackendError(timed_out) from None
                raise BackendError(f"the local models server is unreachable ({_cause(exc)})") from None
            if watch is not None and watch.fired:  # a body sent without a length, cut at the deadline, ends "whole"
                raise BackendError(timed_out)
        if 300 <= status < 400:  # not followed: the configured address is the one that is trusted
            location = resp.headers.get(
                "Location",  # pragma: no mutate: header names are case-insensitive
                "?")
            raise BackendError(f"the local models server answered HTTP {status} (a redirect to "
                               f"{location[:200]!r}): set local_inference_endpoint to the address that answers")
        try:
            raw = json.loads(data)
        except ValueError:
            raise BackendError(f"local models server answered HTTP {status} without JSON for {model_id}") from None
        if status >= 400 and not (isinstance(raw, dict) and "error" in raw):
            raw = {"error": {"message": f"HTTP {status}"}}
        result = normalize(inputs.task, raw, inputs, self.public_dir)
        for key in FILE_KEYS:
            if isinstance(result.get(key), str) and result[key]:
                result[key] = self.bring_home(result[key])
        return result

    def bring_home(self, named: str) -> str:
        """A generated file the models server named -> a path under our own public/."""
        if re.match(r"(?i)https?://", named):  # a URL in a result is as untrusted as a user's
            try:
                got = fetch(named, self.policy, self.max_output_bytes, self.copy_timeout)
            except ResourceError as exc:
                raise BackendError(f"the models server named an output URL that cannot be fetched: {exc}") from None
            mime = got.content_type or sniff_mime(got.data, named)
            kind = mime.split("/")[0] if mime.split("/")[0] in ("audio", "video") else "image"
            return save_bytes(self.public_dir, kind, got.data, extension_for(mime, "bin"))
        m = OUTPUT_PATH.match("/" + named.strip().lstrip("/").removeprefix("public/"))
        if not m:
            raise BackendError(f"the models server named an output that is not a generated file: {named[:200]!r}")
        folder, name = m.groups()
        if (self.public_dir / folder / name).is_file():  # the two servers share one public/
            return f"/{folder}/{name}"
        url = f"{self.base_url}/{folder}/{quote(name)}"
        own = time.monotonic() + self.copy_timeout
        try:
            with deadline_scope(own) as watch:
                if watch is not None and watch.deadline < own:  # the request's deadline comes first
                    slow = f"the request's deadline passed while copying {named} from the models server"
                else:
                    slow = f"copying {named} from the models server took longer than {self.copy_timeout:.0f}s"
                resp = self._http.request(
                    "GET",  # pragma: no mutate: urllib3 upper-cases the method
                    url, headers=self._headers,
                    preload_content=False,  # pragma: no mutate: None reads as False to urllib3
                    timeout=urllib3.Timeout(connect=self.status_timeout,
                                            read=self.copy_timeout,  # pragma: no mutate: the deadline comes first
                                            ))
                try:
                    if resp.status != 200:
                        raise BackendError(f"copying {named} from the models server failed: HTTP {resp.status}")
                    chunks, size = [], 0
                    for chunk in resp.stream():  # 64 KiB at a time
                        size += len(chunk)
                        if size > self.max_output_bytes:
                            raise BackendError(f"{named} on the models server is larger than the "
                                               f"{self.max_output_bytes // (1024 * 1024)} MiB output limit")
                        chunks.append(chunk)
                except BaseException:  # a body not read to its end must not go back to the pool: the next
                    resp.close()  # call on that connection would read its rest as an answer
                    raise
                finally:
                    resp.release_conn()
                if watch is not None and watch.fired:  # a body sent without a length, cut at the deadline, ends
                    raise BackendError(slow)  # as if whole: not a file to keep
        except urllib3.exceptions.HTTPError as exc:
            if watch is not None and watch.passed():  # the deadline came (its watchdog, or the read timeout that
                # ends with it, whichever woke first): it was slow, not broken
                raise BackendError(slow) from None
            raise BackendError(f"copying {named} from the models server failed ({_cause(exc)})") from None
        ext = name.rpartition(".")[2] if "." in name else "bin"
        return save_bytes(self.public_dir, _KIND_OF_DIR[folder], b"".join(chunks), ext)


def answer_of_stream(resp: Any, listen: Any) -> tuple[int, bytes]:
    """The call's answer from its event stream; the connection goes back to the pool once the stream has ended
    (a connection left half-read would be dropped: a new one for every watched call), or is closed on a failure."""
    try:
        answer = read_events(resp, listen)
    except BaseException:
        resp.close()
        raise
    resp.drain_conn()  # the stream's end follows its answer at once
    return answer


def _cause(exc: urllib3.exceptions.HTTPError) -> str:
    """What went wrong, in requests' names, which the messages always used."""
    if isinstance(exc, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ProtocolError):
        return "ConnectionError"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return "ConnectTimeout"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "ReadTimeout"
    if isinstance(exc, urllib3.exceptions.LocationParseError):
        return "InvalidURL"
    return exc.__class__.__name__
