"""One request as the client sent it, and everything it owns while it runs (plain data, one per request)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from .cancel import CancelToken
from .errors import BadRequest, LLMError
from .llm import DeadlineLLM, LLMClient
from .plan import Task
from .resources import OUTPUT_PATH
from .scheduler import Outcome, Scheduler
from .select import Selection

log = logging.getLogger(__name__)

EventSink = Callable[[str, dict[str, Any]], None]
MAX_MESSAGES = 200
MAX_CONTENT_CHARS = 100_000
SEARCH_LIMIT = 100
MAX_QUERY_CHARS = 1000



@dataclass
class ChatRequest:
    """One request as the client sent it; validated by `from_body`."""

    messages: list[dict[str, str]]
    api_key: str | None = None
    api_type: str | None = None
    api_endpoint: str | None = None
    model: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @classmethod
    def from_body(cls, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object with a `messages` list")
        messages = validate_messages(body.get("messages"))
        fields = {}
        for key in ("api_key", "api_type", "api_endpoint", "model"):
            value = body.get(key)
            if value is not None and not isinstance(value, str):
                raise BadRequest(f"`{key}` must be a string")
            if value:
                _check_unicode(value, f"`{key}`")
            fields[key] = value or None
        return cls(messages=messages, **fields)

    @property
    def user_input(self) -> str:
        return self.messages[-1]["content"]


def validate_messages(messages: Any) -> list[dict[str, str]]:
    if messages is None:
        raise BadRequest("`messages` is required: a list of {\"role\", \"content\"} objects, the last one the request")
    if not isinstance(messages, list):
        raise BadRequest("`messages` must be a list of {\"role\", \"content\"} objects")
    if not messages:
        raise BadRequest("`messages` is empty: send at least one user message")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"`messages` has {len(messages)} items; at most {MAX_MESSAGES} are accepted")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object with `role` and `content`")
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}].role must be user, assistant or system, got {role!r}")
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        if len(content) > MAX_CONTENT_CHARS:
            raise BadRequest(f"messages[{i}].content is longer than {MAX_CONTENT_CHARS} characters")
        _check_unicode(content, f"messages[{i}].content")
        clean.append({"role": role, "content": content})
    if not clean[-1]["content"].strip():
        raise BadRequest("the last message is empty: it must hold the request")
    return clean


def search_query(task: Any, q: Any, limit: Any, known: Iterable[str]) -> tuple[str | None, str, int]:
    """A catalog search (GET /models/search, the MCP tool `search_models`) checked: (task or None, q, limit).
    `limit` may come as text (a query string) or a number; `known`: the catalog's tasks."""
    task = "" if task is None else task
    q = "" if q is None else q
    if not isinstance(task, str) or not isinstance(q, str):
        raise BadRequest("`task` and `q` must be text")
    task = task.strip()
    try:
        if isinstance(limit, bool) or not isinstance(limit, int | str):
            raise ValueError
        number = int(limit)
    except ValueError:
        raise BadRequest(f"`limit` must be a whole number from 1 to {SEARCH_LIMIT}, got {str(limit)[:20]!r}") from None
    if not 1 <= number <= SEARCH_LIMIT:
        raise BadRequest(f"`limit` must be a whole number from 1 to {SEARCH_LIMIT}, got {number}")
    if len(q) > MAX_QUERY_CHARS:
        raise BadRequest(f"`q` is longer than {MAX_QUERY_CHARS} characters")
    known = set(known)
    if task and task not in known:
        raise BadRequest(f"unknown task {task[:60]!r}; the catalog has: {', '.join(sorted(known))}")
    return task or None, q, number


def _check_unicode(value: str, where: str) -> None:
    """JSON can carry lone UTF-16 surrogates (\\ud800) that no UTF-8 consumer downstream accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} contains invalid Unicode (a lone surrogate at position {exc.start})") from None


def collect_result(task: Task, choose: dict[str, str] | str, inference: dict[str, Any]) -> dict[str, Any]:
    """JARVIS's per-task record."""
    return {"task": task.to_dict(), "inference result": inference, "choose model result": choose}


def generated_files(results: dict[int, dict[str, Any]]) -> list[str]:
    """The files a request's tasks generated (their `generated ...` outputs, as public/ paths), in task order,
    each once: what the OpenAI and MCP front doors hand back as links and media."""
    found: list[str] = []
    for tid in sorted(results):
        inference = results[tid].get("inference result")
        if not isinstance(inference, dict):
            continue
        for key, value in inference.items():
            if key.startswith("generated") and isinstance(value, str) and OUTPUT_PATH.match(value) \
                    and value not in found:
                found.append(value)
    return found


class RequestState:
    """Everything one request owns: its LLM client, plan, selections, results and events."""

    def __init__(self, request: ChatRequest, llm: LLMClient, on_event: EventSink | None, timeout: float,
                 observe_llm=None):
        self.request = request
        self.started = time.perf_counter()
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.llm = DeadlineLLM(llm, self.deadline, observe_llm)
        self.on_event = on_event  # None: nobody listens, so nothing is streamed
        self.results: dict[int, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.selections: dict[int, Future] = {}  # task id -> its model choice (choose.Choice)
        self.executes = True  # the tasks will run (False for plan-only and decisions-only requests)
        self.scheduler: Scheduler | None = None  # the running round's, for cancel()
        self.outcomes: dict[int, Outcome] = {}  # the last round's, with start and finish times
        # cancel() stops the request's I/O in flight too (see cancel.py); `cancelled` is its event
        self.cancel_token = CancelToken()
        self.cancelled = self.cancel_token.event
        self.sealed = False  # set under `lock` when execution ends: late task results are dropped
        self._held: list[tuple[str, dict[str, Any]]] | None = None
        self._held_lock = threading.RLock()  # also orders delivery: events reach the listener one at a time
        self._last_t = 0.0  # `t` of the last event delivered: a stream's times never go back
        self.round: object | None = None  # the execution round whose tasks may write (each replan starts one)
        self.replans: list[str] = []  # what was replanned, for the answer
        self.replan_attempts = 0
        self.planner_messages: list[dict[str, str]] = []
        self.plan_reply = ""
        self.failed_models: set[str] = set()  # models that failed in this request (under `lock`)
        # backend -> why its account was refused in this request (a bad token, no credits): no later candidate,
        # fallback or replan of this request is sent there (under `lock`)
        self.refused: dict[str, str] = {}
        # task id -> its candidates tried so far, the one running last (under `lock`): what a deadline that cuts
        # the task off still reports
        self.attempts: dict[int, list[dict[str, str]]] = {}
        self.model_seconds: dict[int, float] = {}  # task id -> time spent in backends (not waiting, not choosing)

    def hold_events(self) -> None:
        """Queue task events until `release_events` (tasks may start before the plan is announced)."""
        with self._held_lock:
            self._held = []

    def release_events(self, drop: bool = False) -> None:
        with self._held_lock:  # delivered under the lock: an event emitted meanwhile waits and comes after them
            held, self._held = self._held, None
            for name, event in ([] if drop or held is None else held):
                self._deliver(name, event)

    def emit(self, name: str, payload: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        with self._held_lock:
            event = {"event": name, "request_id": self.request.request_id,
                     "t": round(time.perf_counter() - self.started, 4), **payload}
            if self._held is not None and name not in ("plan", "answer", "answer_token", "error"):
                self._held.append((name, event))
                return
            self._deliver(name, event)

    def _deliver(self, name: str, event: dict[str, Any]) -> None:
        """To the listener, in order, under `_held_lock`. `t` never goes back: an event held until the plan was
        announced carries the time it was announced."""
        self._last_t = event["t"] = max(event["t"], self._last_t)
        try:
            self.on_event(name, event)
        except Exception:  # noqa: BLE001 - a broken listener must not break the request
            log.exception("[%s] event listener failed", self.request.request_id)

    def cancel(self) -> None:
        self.cancel_token.cancel()
        if self.scheduler is not None:
            self.scheduler.cancel()

    def selection_of(self, task: Task, timeout: float | None = None, choice: Future | None = None) -> Selection:
        """The model chosen for `task` (or by `choice`), waiting for it if selection is still running."""
        fut = choice if choice is not None else self.selections[task.id]
        try:
            return fut.result(timeout=timeout)
        except LLMError:
            raise
        except FutureTimeout:
            return Selection(task.id, task.task, None, None, "",
                             error="no model was chosen before the request's deadline (request_timeout)")
        except Exception as exc:  # noqa: BLE001
            return Selection(task.id, task.task, None, None, "", error=f"model selection failed: {exc}")
