"""The orchestrator's events as people read them: a plan table kept up to date, and each task's output as
text (labels and boxes as small tables, never raw JSON) plus the files it made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .orchestrators import GENERATED

COLUMNS = ["task", "id", "deps", "model", "status", "seconds"]
TEXT_KEYS = ("generated text", "text", "response", "answer")
SKIP_KEYS = {"error", "fallback", "start", "end", "generated image", "generated audio", "generated video"}


PHASE_WORDS = ("running ", "queued", "downloading", "loading")


def status_of(progress: dict[str, Any]) -> str:
    """A task's progress in the plan table's status column: `running 40%`, `downloading 12%`, `loading`."""
    phase = str(progress.get("phase", "running"))
    fraction = progress.get("fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and phase in ("running", "downloading"):
        return f"{phase} {round(fraction * 100)}%"
    return phase


@dataclass
class Row:
    id: int
    task: str
    deps: str
    model: str = ""
    status: str = "planned"
    seconds: float | None = None


@dataclass
class Progress:
    """One request's plan, as the events arrive."""

    rows: dict[int, Row] = field(default_factory=dict)

    def table(self) -> list[list[Any]]:
        return [[r.task, r.id, r.deps, r.model, r.status, "" if r.seconds is None else f"{r.seconds:.2f}"]
                for r in (self.rows[k] for k in sorted(self.rows))]

    def row(self, event: dict[str, Any]) -> Row:
        tid = int(event.get("id", -1))
        if tid not in self.rows:
            self.rows[tid] = Row(tid, str(event.get("task", "")), "")
        return self.rows[tid]

    def update(self, event: dict[str, Any]) -> None:
        name = event.get("event")
        if name in ("plan", "replan"):
            for t in event.get("tasks") or []:
                deps = ", ".join(str(d) for d in t.get("dep", []) if d != -1) or "-"
                old = self.rows.get(t["id"])
                if old is None or old.status in ("planned", "failed", "skipped"):
                    self.rows[t["id"]] = Row(t["id"], t["task"], deps)
        elif name == "model_selected":
            row = self.row(event)
            row.model = event.get("model") or f"none: {event.get('error') or 'no model available'}"
        elif name == "task_started":
            self.row(event).status = "running"
        elif name == "task_progress":
            row = self.row(event)
            if row.status in ("planned", "running") or row.status.startswith(PHASE_WORDS):  # not after its end
                row.status = status_of(event)
        elif name == "task_finished":
            row = self.row(event)
            row.status, row.seconds = "done", event.get("model_seconds", event.get("seconds"))
        elif name == "task_failed":
            row = self.row(event)
            row.status = "skipped" if event.get("skipped") else "failed"
            row.seconds = None if event.get("skipped") else event.get("seconds")


def files_of(result: Any) -> list[str]:
    """The public paths of the files a task made (`/images/ab12.png`), in result order."""
    if not isinstance(result, dict):
        return []
    found = []
    for value in result.values():
        if isinstance(value, str) and GENERATED.match(value) and value.split("/")[1] != "examples" \
                and value not in found:
            found.append(value)
    return found


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:200]


def _box(box: Any) -> str:
    if isinstance(box, dict) and {"xmin", "ymin", "xmax", "ymax"} <= set(box):
        return f"({box['xmin']}, {box['ymin']}) to ({box['xmax']}, {box['ymax']})"
    return _cell(box)


def table_of(items: list[Any]) -> str:
    """Labels, boxes, entities, answers: a Markdown table with the columns the items have, best first."""
    rows = [x for x in items if isinstance(x, dict)]
    if not rows:
        return ", ".join(_cell(x) for x in items)
    if all("score" in x for x in rows):
        rows = sorted(rows, key=lambda x: -float(x.get("score") or 0))
    preferred = ["label", "entity_group", "entity", "word", "answer", "box", "score"]
    columns = [c for c in preferred if any(c in x for x in rows)]
    columns += [c for c in dict.fromkeys(k for x in rows for k in x) if c not in columns and c not in ("start", "end",
                                                                                                     "index")]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for x in rows[:20]:
        cells = []
        for c in columns:
            v = x.get(c, "")
            cells.append(_box(v) if c == "box" else f"{v:.2f}" if isinstance(v, float) else _cell(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(result: Any) -> str:
    """A task's output as readable Markdown (files are shown apart, by the caller)."""
    if not isinstance(result, dict):
        return _cell(result)
    parts = []
    for key, value in result.items():
        if key in SKIP_KEYS or (isinstance(value, str) and GENERATED.match(value)):
            continue
        if key in TEXT_KEYS and isinstance(value, str):
            parts.append(value)
        elif key == "predicted" and isinstance(value, list):
            parts.append(table_of(value))
        elif key == "score" and isinstance(value, (int, float)):
            parts.append(f"similarity {value:.3f}")
        elif isinstance(value, list):
            parts.append(f"**{key}**\n\n{table_of(value)}")
        elif isinstance(value, dict):
            parts.append(f"**{key}**: " + ", ".join(f"{k} {_cell(v)}" for k, v in value.items()))
        else:
            parts.append(f"**{key}**: {_cell(value)}")
    return "\n\n".join(parts)


def task_title(event: dict[str, Any], model: str) -> str:
    title = f"#{event.get('id')} {event.get('task', '')}"
    return f"{title} · {model}" if model and not model.startswith("none") else title
