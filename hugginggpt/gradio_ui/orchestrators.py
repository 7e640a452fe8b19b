"""Where a request runs, behind one small interface: this process's engine, or a server over HTTP (SSE).

    run = orchestrator.start(messages, settings)   # returns at once
    for event in run: ...                          # the orchestrator's events, ending with answer/error/cancelled
    run.cancel()                                   # really stops it: RequestState.cancel / the stream closed

Both upload files the way the server's POST /upload does (UploadStore: decoded, size-checked, under a quota)
and hand generated files (`/images/ab12.png`) back as local paths the UI can show.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests
from urllib3.exceptions import ReadTimeoutError

from ..errors import BadRequest, HuggingGPTError

log = logging.getLogger(__name__)

GENERATED = re.compile(r"^/(images|audios|videos|uploads|examples)/[\w.-]+$")
MAX_DOWNLOAD_BYTES = 200 * 1024 * 1024


def size_text(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB" if n >= 1024 * 1024 else f"{n / 1024:.0f} KiB"


class UserError(Exception):
    """Something the visitor can act on, shown as one line."""


@dataclass(frozen=True)
class VisitorLLM:
    """One visitor's LLM settings (from their settings box); the key never leaves this object but to the LLM."""

    api_key: str | None = None
    api_type: str | None = None
    api_endpoint: str | None = None

    def __repr__(self) -> str:  # never the key, in a log line or a traceback
        return f"VisitorLLM(api_type={self.api_type!r}, api_key={'set' if self.api_key else 'unset'})"

    def body(self) -> dict[str, str]:
        return {k: v for k, v in (("api_key", self.api_key), ("api_type", self.api_type),
                                  ("api_endpoint", self.api_endpoint)) if v}


class Run:
    """One running request: iterate for its events; `cancel` stops it and ends the iteration at once."""

    def __init__(self) -> None:
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.cancelled = threading.Event()
        self.finished = threading.Event()
        self._stop = None  # how to stop the work: set by the orchestrator

    def put(self, event: dict[str, Any] | None) -> None:
        if not self.cancelled.is_set():
            self.events.put(event)

    def cancel(self) -> None:
        if self.finished.is_set() or self.cancelled.is_set():
            return
        self.cancelled.set()
        if self._stop is not None:
            self._stop()
        self.events.put({"event": "cancelled"})
        self.events.put(None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            event = self.events.get()
            if event is None:
                self.finished.set()
                return
            yield event


class Orchestrator(Protocol):
    needs_llm_settings: bool  # the config names no LLM: each visitor brings their own

    def upload(self, data: bytes, filename: str) -> tuple[str, str]: ...
    def start(self, messages: list[dict[str, str]], llm: VisitorLLM) -> Run: ...
    def local_file(self, path: str) -> Path | None: ...


def error_event(message: str) -> dict[str, Any]:
    return {"event": "error", "error": {"message": message}}


class InProcess:
    """The engine in this process (`HuggingGPT.run` on a worker thread), each run holding one slot of the engine's
    admission (`max_concurrent_requests`, shared with every other door of that engine) until its work has ended."""

    def __init__(self, engine, config):
        from ..uploads import UploadStore

        self.engine = engine
        self.public = config.public_dir.resolve()
        self.uploads = UploadStore(self.public, config.upload_quota_bytes, config.max_image_pixels)
        self.max_bytes = config.max_body_bytes
        self.slots = config.max_concurrent_requests
        self.needs_llm_settings = config.llm.api_type is None and not config.llm.api_key

    def upload(self, data: bytes, filename: str) -> tuple[str, str]:
        if len(data) > self.max_bytes:
            raise UserError(f"{filename or 'the file'} is larger than {size_text(self.max_bytes)}")
        try:
            return self.uploads.store(data, filename)
        except HuggingGPTError as exc:
            raise UserError(str(exc)) from None

    def start(self, messages: list[dict[str, str]], llm: VisitorLLM) -> Run:
        """Raises UserError (bad settings) or admission.Busy (every slot taken), each one line to show."""
        from ..admission import take
        from ..chat import ChatRequest

        try:
            request = ChatRequest.from_body({"messages": messages, **llm.body()})
            self.engine.llm_for(request)  # bad settings: one line now, not a failed run later
        except HuggingGPTError as exc:
            raise UserError(str(exc)) from None
        take(self.engine.admission, self.slots)  # Busy at once when full: never a silent queue
        try:
            return self._start(request)
        except BaseException:
            self.engine.admission.release()
            raise

    def _start(self, request) -> Run:
        run = Run()
        states: list = []

        def stop() -> None:
            if states:
                states[0].cancel()

        run._stop = stop

        def work() -> None:
            try:
                result = self.engine.run(request, "answer", on_event=lambda name, e: run.put(e),
                                         state_ready=lambda s: (states.append(s), run.cancelled.is_set() and s.cancel()))
                if isinstance(result, dict) and result.get("cancelled"):
                    run.put({"event": "cancelled"})
            except HuggingGPTError as exc:
                run.put(error_event(str(exc)))
            except Exception as exc:  # noqa: BLE001 - shown as one line; the trace goes to the log
                log.exception("[%s] request failed", request.request_id)
                run.put(error_event(f"internal error ({exc.__class__.__name__}); see the app's log"))
            finally:
                self.engine.admission.release()  # the work has ended (answered, failed or cancelled)
                run.put(None)

        threading.Thread(target=work, name=f"gradio-{request.request_id}", daemon=True).start()
        return run

    def local_file(self, path: str) -> Path | None:
        if not GENERATED.match(path):
            return None
        file = (self.public / path.lstrip("/")).resolve()
        return file if file.is_file() and file.is_relative_to(self.public) else None


class Remote:
    """A running orchestrator (`awesome_chat.py --mode server`) over HTTP: POST /hugginggpt with `stream: true`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0, stream_idle: float = 60.0):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        # The server writes a keep-alive comment every 10 s while a request works: a stream silent for six of
        # them is an orchestrator (or a proxy) that hangs, and the visitor is told rather than left waiting.
        self.stream_idle = stream_idle
        self.files = Path(tempfile.mkdtemp(prefix="hugginggpt-gradio-"))
        self.needs_llm_settings = False

    def check(self) -> None:
        """Reach the server once; learn whether it has an LLM of its own."""
        try:
            health = requests.get(self.url + "/health", timeout=self.timeout)
            health.raise_for_status()
            llm = health.json().get("llm") or {}
        except (requests.RequestException, ValueError) as exc:
            raise UserError(f"cannot reach the orchestrator at {self.url} ({exc.__class__.__name__})") from None
        self.needs_llm_settings = llm.get("api_type") is None and llm.get("api_key") != "set"

    def _error(self, resp: requests.Response) -> str:
        try:
            return str(resp.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            return f"the orchestrator answered HTTP {resp.status_code}"

    def upload(self, data: bytes, filename: str) -> tuple[str, str]:
        try:
            resp = requests.post(self.url + "/upload", files={"file": (filename or "file", data)},
                                 headers=self.headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise UserError(f"cannot reach the orchestrator at {self.url} ({exc.__class__.__name__})") from None
        if resp.status_code != 200:
            raise UserError(self._error(resp))
        body = resp.json()
        return body["path"], body["kind"]

    def start(self, messages: list[dict[str, str]], llm: VisitorLLM) -> Run:
        run = Run()
        holder: dict[str, requests.Response] = {}
        body = {"messages": messages, "stream": True, **llm.body()}

        def stop() -> None:  # the server cancels a request whose client went away
            resp = holder.get("resp")
            if resp is not None:
                resp.close()

        run._stop = stop

        def work() -> None:
            try:
                with requests.post(self.url + "/hugginggpt", json=body, headers=self.headers, stream=True,
                                   timeout=(self.timeout, self.stream_idle)) as resp:
                    holder["resp"] = resp
                    if run.cancelled.is_set():
                        return
                    if resp.status_code != 200:
                        run.put(error_event(self._error(resp)))
                        return
                    for event in sse_events(resp.iter_lines(decode_unicode=True)):
                        run.put(event)
            # AttributeError, ValueError, OSError: what reading a stream that cancel() closed under us raises
            except (AttributeError, ValueError, OSError) as exc:  # requests' errors are OSErrors too
                if not run.cancelled.is_set():
                    log.debug("the orchestrator's stream ended with an error", exc_info=True)
                    run.put(error_event(self._lost(exc)))
            finally:
                run.put(None)

        threading.Thread(target=work, name="gradio-remote", daemon=True).start()
        return run

    def _lost(self, exc: BaseException) -> str:
        # a late answer (requests' ReadTimeout) and a stream silent after it (its ConnectionError) both carry
        # urllib3's ReadTimeoutError
        if exc.args and isinstance(exc.args[0], ReadTimeoutError):
            return f"the orchestrator at {self.url} sent nothing for {self.stream_idle:g} s"
        return f"lost the orchestrator at {self.url} ({exc.__class__.__name__})"

    def local_file(self, path: str) -> Path | None:
        """Download a generated file once, into this app's own temporary folder (bounded in size)."""
        if not GENERATED.match(path):
            return None
        target = self.files / path.lstrip("/").replace("/", "_")
        if target.is_file():
            return target
        partial = target.with_suffix(target.suffix + ".part")
        try:
            with requests.get(self.url + path, headers=self.headers, stream=True, timeout=self.timeout) as resp:
                if resp.status_code != 200:
                    return None
                size = 0
                with partial.open("wb") as out:
                    for chunk in resp.iter_content(65536):
                        size += len(chunk)
                        if size > MAX_DOWNLOAD_BYTES:
                            raise BadRequest(f"larger than {size_text(MAX_DOWNLOAD_BYTES)}")
                        out.write(chunk)
                partial.replace(target)
        except BadRequest as exc:
            why = str(exc)
        except OSError as exc:  # requests' errors are OSErrors too
            why = exc.__class__.__name__
        else:
            return target
        log.warning("could not fetch %s from the orchestrator (%s)", path, why)
        partial.unlink(missing_ok=True)  # a refused or broken download leaves nothing behind
        return None


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """`event:`/`data:` blocks → the JSON objects the server sent. `done`, comments (`: keep-alive`), other
    fields and data that is no JSON object are skipped; JSON itself ignores the space after `data:`."""
    name, data = None, []
    for line in lines:
        if line is None:
            continue
        if not line:
            event = _json_object("\n".join(data)) if name and name != "done" else None
            if event is not None:
                event.setdefault("event", name)
                yield event
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:])


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
