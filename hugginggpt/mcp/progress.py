"""A tool call's progress as MCP progress notifications (issue 48), for a client that sent a progress token.

MCP's `notifications/progress` carry one number that must rise with each notification, a total and a message. A
request is several tasks, each with its own steps, so the number is the request's share done: finished tasks plus
each running task's share (its start, then its fraction of its steps), over the tasks planned (`total` 1.0); it
reaches 1.0 as the last task ends. The message says which task and where (`#0 text-to-image: started`, `step 10
of 25 · about 4 s left`, `done`). A report that would not raise the number (a new phase, a download, whose
bytes are no share of the task's steps) is not sent.

The tools are synchronous and run on a worker thread of the SDK's event loop; the request's events arrive on the
request's own threads. `run_reporting` runs the tool on a thread of its own and sends the notifications from the
worker thread, the one thread that may call into the event loop (`anyio.from_thread.run`).
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..taskprogress import describe

log = logging.getLogger(__name__)

T = TypeVar("T")
Note = tuple[float, float, str]  # progress, total, message
EventSink = Callable[[str, dict[str, Any]], None]

# the running tool call's event listener (None: nobody asked for progress)
LISTENER: contextvars.ContextVar[EventSink | None] = contextvars.ContextVar("mcp_progress", default=None)


# A task's own share is split: its start, its steps, its end. So its start and its end each raise the number
# (every task reports both, a captioner without steps too), and the last task's end takes it to 1.0.
START_SHARE, END_SHARE = 0.02, 0.02


class ToolProgress:
    """The request's events -> notes whose progress rises with each one."""

    def __init__(self) -> None:
        self.planned = 1  # run_model's one task has no plan event
        self.done: set[Any] = set()
        self.running: dict[Any, float] = {}
        self.sent = 0.0

    def note(self, name: str, event: dict[str, Any]) -> Note | None:
        tid = event.get("id")
        if name in ("plan", "replan"):
            self.planned = max(self.planned, len(event.get("tasks") or ()))
            return None
        if name == "task_started":
            self.running[tid] = max(self.running.get(tid, 0.0), START_SHARE)
            said = "started"
        elif name in ("task_finished", "task_failed"):
            self.running.pop(tid, None)
            self.done.add(tid)
            said = "done" if name == "task_finished" else "skipped" if event.get("skipped") else "failed"
        elif name == "task_progress" and event.get("phase") == "running":
            fraction = event.get("fraction")
            if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
                return None
            share = START_SHARE + (1 - START_SHARE - END_SHARE) * min(max(float(fraction), 0.0), 1.0)
            self.running[tid] = max(self.running.get(tid, 0.0), share)
            said = describe(event)
        else:  # a phase, a download: no share of the task's steps
            return None
        share = min((len(self.done) + sum(self.running.values())) / self.planned, 1.0)
        if share <= self.sent:
            return None
        self.sent = share
        return round(share, 4), 1.0, f"#{tid} {event.get('task', '')}: {said}"


def events() -> EventSink | None:
    """The running call's listener, for `HuggingGPT.run(on_event=...)` (None outside a reporting call)."""
    return LISTENER.get()


def run_reporting(work: Callable[[], T], report: Callable[[float, float, str], Awaitable[None]]) -> T:
    """`work()` on a thread of its own, its progress sent through `report` (an async function of the SDK's loop)
    from this thread, an SDK worker thread; returns what `work` returns, or raises what it raised."""
    import anyio.from_thread

    notes: queue.Queue[Note | None] = queue.Queue()
    progress = ToolProgress()
    lock = threading.Lock()

    def listen(name: str, event: dict[str, Any]) -> None:
        with lock:  # events come from the request's threads
            note = progress.note(name, event)
        if note is not None:
            notes.put(note)

    outcome: dict[str, Any] = {}

    def run() -> None:
        LISTENER.set(listen)
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc
        finally:
            notes.put(None)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="mcp-tool", daemon=True)
    thread.start()
    while (note := notes.get()) is not None:
        try:
            anyio.from_thread.run(report, *note)
        except Exception:  # noqa: BLE001 - a client gone or a closed session: the call's own answer says so
            log.debug("a progress notification was not sent", exc_info=True)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
