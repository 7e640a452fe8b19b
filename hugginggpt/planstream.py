"""Streaming planner: read the plan as the LLM writes it and start each task the moment it is complete.

LLMCompiler's idea for HuggingGPT's plans: a task object whose closing brace has arrived, whose type is known
and whose `<GENERATED>-k` references all point to tasks already read is final: the full parse later reads it
the same way. Such a task is handed on at once (model selection and execution start); anything less certain
(unknown type, a forward or self reference, a duplicate id, several references to split) waits for the
complete plan, which stays the authority.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .plan import TASK_TYPES, TEXT_TASKS_FOR_LLM, PlanParseError, Task, _loads_tolerant, tasks_from_json


class ObjectStream:
    """Yields each complete JSON object that sits directly inside the first top-level array of the text."""

    def __init__(self):
        self.buffer = ""  # pragma: no mutate: text before the task array is skipped, so a prefix like "XXXX" reads the same
        self.pos = 0  # the next character to read
        self.quote: int | None = None  # where the JSON string being read opened; None outside strings
        # None until the task array opens (text before it is skipped); then 1 inside it, 2 inside a task object, ...;
        # 0 once it has closed: arrays after it (in prose) hold no tasks.
        self.depth: int | None = None
        self.start: int | None = None  # where the task object being read begins

    def feed(self, piece: str) -> list[str]:
        self.buffer += piece
        found = []
        text = self.buffer
        while self.pos < len(text) and self.depth != 0:
            ch = text[self.pos]
            if self.quote is not None:  # inside a string: brackets and quotes in it do not count
                if ch == "\\":
                    self.pos += 1  # the escaped character is skipped, even one still to come
                elif ch == '"':
                    self.quote = None
            elif ch == '"':
                self.quote = self.pos
            elif self.depth is None:
                if ch == "[":
                    self.depth = 1  # the task list: `[...]` or `{"tasks": [...]}`
            elif ch in "[{":
                self.depth += 1
                if ch == "{" and self.depth == 2:
                    self.start = self.pos
            elif ch in "]}":
                if ch == "}" and self.depth == 2 and self.start is not None:  # not `[` closed by `}`
                    found.append(text[self.start : self.pos + 1])
                    self.start = None
                self.depth -= 1
            self.pos += 1
        return found


class EarlyTasks:
    """Turns streamed task objects into tasks that can start now, and remembers what it handed on."""

    def __init__(self, on_task: Callable[[Task], None], limit: int | None = None):
        """limit: at most this many tasks start early (a runaway plan waits for the full plan, which refuses it)."""
        self.stream = ObjectStream()
        self.on_task = on_task
        self.limit = limit
        self.started: dict[int, Task] = {}
        self.seen: set[int] = set()
        self.stopped = False  # after anything surprising, the rest waits for the full plan

    def feed(self, piece: str) -> None:
        for raw in self.stream.feed(piece):
            if self.stopped:
                return
            task = self._final_task(raw)
            if task is None or (self.limit is not None and len(self.started) >= self.limit):
                self.stopped = True
                return
            self.started[task.id] = task
            self.on_task(task)

    def _final_task(self, raw: str) -> Task | None:
        try:
            data: Any = _loads_tolerant(raw)
        except PlanParseError:
            return None
        if not isinstance(data, dict) or data.get("task") not in TASK_TYPES or not isinstance(data.get("id"), int):
            return None
        if data["task"] in TEXT_TASKS_FOR_LLM:
            return None  # a lone text task is answered as chat: wait to see the whole plan
        if data["id"] in self.seen or data["id"] < 0:
            return None
        self.seen.add(data["id"])
        try:
            plan = tasks_from_json([data], frozenset(self.started))
        except PlanParseError:
            return None
        if len(plan.tasks) != 1 or plan.notes:
            return None  # repaired, split or renumbered: let the full plan decide
        task = plan.tasks[0]
        refs = task.refs()
        if task.error:
            return None  # e.g. a reference to itself or to a task not read yet (`finished` is what started)
        if any(r not in self.started for r in refs):
            return None  # its input would not exist yet
        task.dep = refs or [-1]
        return task

    def agrees(self, task: Task) -> bool:
        """Whether the full plan's task is the one already started under that id."""
        early = self.started.get(task.id)
        return early is not None and json.dumps(early.to_dict(), sort_keys=True) == json.dumps(task.to_dict(),
                                                                                              sort_keys=True)
