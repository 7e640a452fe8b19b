"""Stage 1 output: the LLM's text becomes a validated task graph.

Real LLMs wrap JSON in prose and fences, use single quotes, leave trailing commas, forget a bracket,
or write `<GENERATED-0>`. We repair what has one clear reading and report the rest per task, so
one bad task never sinks the whole request.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any

from .textsafe import clean_text

TEXT_TASKS_FOR_LLM = ("summarization", "translation", "conversational", "text-generation", "text2text-generation")
CONTROLS = ("canny", "hed", "mlsd", "normal", "openpose")
CONTROL_TEXT_TO_IMAGE = ("canny", "depth", "hed", "mlsd", "normal", "openpose", "seg")

TASK_TYPES: tuple[str, ...] = (
    # text
    "token-classification", "text2text-generation", "summarization", "translation", "question-answering",
    "conversational", "text-generation", "sentence-similarity", "tabular-classification", "text-classification",
    # vision
    "object-detection", "image-classification", "image-to-image", "image-to-text", "text-to-image",
    "text-to-video", "visual-question-answering", "document-question-answering", "image-segmentation",
    "depth-estimation",
    # audio
    "text-to-speech", "automatic-speech-recognition", "audio-to-audio", "audio-classification",
    # ControlNet
    *(f"{c}-control" for c in CONTROLS),
    *(f"{c}-text-to-image" for c in CONTROL_TEXT_TO_IMAGE),
)

TASK_ALIASES = {
    "image-captioning": "image-to-text", "captioning": "image-to-text", "image-caption": "image-to-text",
    "speech-recognition": "automatic-speech-recognition", "asr": "automatic-speech-recognition",
    "speech-to-text": "automatic-speech-recognition", "tts": "text-to-speech", "speech-synthesis": "text-to-speech",
    "ner": "token-classification", "named-entity-recognition": "token-classification",
    "image-generation": "text-to-image", "vqa": "visual-question-answering", "sentiment-analysis":
    "text-classification", "depth": "depth-estimation", "segmentation": "image-segmentation", "chat":
    "conversational", "video-generation": "text-to-video", "qa": "question-answering", "detection":
    "object-detection", "docqa": "document-question-answering", "speech-enhancement": "audio-to-audio",
}
ARG_KEYS = ("text", "image", "audio")
ARG_ALIASES = {
    "img": "image", "image_url": "image", "img_url": "image", "picture": "image", "photo": "image",
    "audio_url": "audio", "speech": "audio", "sound": "audio", "prompt": "text", "input": "text",
    "question": "text", "sentence": "text", "query": "text",
}
# What each task makes, and the arguments it cannot run without: the types checked between a task's inputs and
# what its dependencies make (a caption is text, so it cannot be an "image" argument).
_VISION_IN = ("object-detection", "image-classification", "image-to-image", "image-to-text",
              "visual-question-answering", "document-question-answering", "image-segmentation", "depth-estimation",
              "tabular-classification", *(f"{c}-control" for c in CONTROLS),
              *(f"{c}-text-to-image" for c in CONTROL_TEXT_TO_IMAGE))
_AUDIO_IN = ("automatic-speech-recognition", "audio-to-audio", "audio-classification")
MAKES: dict[str, frozenset[str]] = {
    **{t: frozenset({"text"}) for t in TASK_TYPES},
    **{t: frozenset({"image"}) for t in ("image-to-image", "text-to-image", "image-segmentation", "depth-estimation",
                                          *(f"{c}-control" for c in CONTROLS),
                                          *(f"{c}-text-to-image" for c in CONTROL_TEXT_TO_IMAGE))},
    "object-detection": frozenset({"image", "text"}),  # the picture with its boxes drawn, and the labels
    "text-to-video": frozenset({"video"}),
    "text-to-speech": frozenset({"audio"}), "audio-to-audio": frozenset({"audio"}),
}
NEEDS: dict[str, str] = {
    **{t: "image" for t in _VISION_IN}, **{t: "audio" for t in _AUDIO_IN},
    **{t: "text" for t in ("token-classification", "text2text-generation", "summarization", "translation",
                           "question-answering", "conversational", "text-generation", "sentence-similarity",
                           "text-classification", "text-to-image", "text-to-video", "text-to-speech")},
}
GENERATED_RE = re.compile(r"<\s*generated\s*(?:>\s*)?-\s*(\d+)(?:\s*>)?", re.IGNORECASE)
REF_RE = re.compile(r"<GENERATED>-(\d+)")


@dataclass
class Task:
    id: int
    task: str
    dep: list[int]
    args: dict[str, str]
    error: str | None = None  # set when the plan itself makes this task impossible

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "id": self.id, "dep": list(self.dep), "args": dict(self.args)}

    def copy(self) -> Task:
        """An independent copy (its lists and dicts new; the values are strings and ints): what deepcopy gives,
        at a fraction of its cost on the per-task path."""
        return replace(self, dep=list(self.dep), args=dict(self.args))

    def refs(self) -> list[int]:
        out: list[int] = []
        for value in self.args.values():
            for m in REF_RE.finditer(value):
                n = int(m.group(1))
                if n not in out:
                    out.append(n)
        return out


@dataclass
class Plan:
    tasks: list[Task]
    notes: list[str] = field(default_factory=list)  # repairs made and problems found, for logs and answers

    def to_list(self) -> list[dict[str, Any]]:
        return [t.to_dict() for t in self.tasks]

    def by_id(self) -> dict[int, Task]:
        return {t.id: t for t in self.tasks}


# The arguments each task takes, in the order a plan writes them: what the local plan grammar requires of it.
TAKES: dict[str, tuple[str, ...]] = {
    **{t: ("text",) for t in TASK_TYPES},
    **{t: ("image",) for t in _VISION_IN},
    **{t: ("audio",) for t in _AUDIO_IN},
    "visual-question-answering": ("image", "text"), "document-question-answering": ("image", "text"),
    **{f"{c}-text-to-image": ("text", "image") for c in CONTROL_TEXT_TO_IMAGE},
}


def plan_json_schema(strict: bool = True, max_tasks: int | None = None) -> dict[str, Any]:
    """The plan as a JSON schema of our task vocabulary and argument kinds, for constrained decoding.

    strict: OpenAI's rules (an object at the root, every property required, no extra keys; absent arguments
    are null), which OpenAI, Azure and vLLM take. Not strict, for a local grammar (llama.cpp, Ollama): one
    branch per set of arguments (TAKES), so a task writes exactly the arguments it takes, each a string, and the
    list holds at most `max_tasks` tasks. A small model under the strict schema fills all three arguments, often
    with a reference to its own task; under this one a caption gets its image, a question its image and text, and
    the grammar itself ends a list that would run away.
    """
    def task_schema(names: list[str], args: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object",
                "properties": {"task": {"type": "string", "enum": names}, "id": {"type": "integer"},
                               "dep": {"type": "array", "items": {"type": "integer"}}, "args": args},
                "required": ["task", "id", "dep", "args"], "additionalProperties": False}

    if strict:
        arg: dict[str, Any] = {"type": ["string", "null"]}
        items = task_schema(list(TASK_TYPES), {"type": "object", "properties": {k: arg for k in ARG_KEYS},
                                               "required": list(ARG_KEYS), "additionalProperties": False})
    else:
        groups: dict[tuple[str, ...], list[str]] = {}
        for name in TASK_TYPES:
            groups.setdefault(TAKES[name], []).append(name)
        items = {"anyOf": [task_schema(names, {"type": "object", "properties": {k: {"type": "string"} for k in takes},
                                               "required": list(takes), "additionalProperties": False})
                           for takes, names in groups.items()]}
    tasks: dict[str, Any] = {"type": "array", "items": items}
    if not strict and max_tasks:
        tasks["maxItems"] = max_tasks
    return {"type": "object", "properties": {"tasks": tasks}, "required": ["tasks"], "additionalProperties": False}


class PlanParseError(ValueError):
    """No task list could be read from the text (the caller falls back to a conversational answer)."""


# ---------------------------------------------------------------------------------------------
# text -> JSON


def _strip_fences(text: str) -> str:
    fence = re.search(r"(?i)```(?:json|javascript|js)?\s*\n?(.*?)```", text, re.DOTALL)
    if fence and any(ch in fence.group(1) for ch in "[{"):
        return fence.group(1)
    return text


def _balanced_span(text: str, start: int) -> str:
    """From an opening bracket, the span up to its match; closes brackets an LLM forgot."""
    stack: list[str] = []  # the closing brackets awaited, innermost last (never empty here: text[start] opens one)
    quote: str | None = None  # pragma: no mutate: "" reads as None (no string being read)
    escaped = False  # pragma: no mutate: only its truth is read (None would do as well)
    pairs = {"[": "]", "{": "}"}
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote and not escaped:
                quote = None  # pragma: no mutate: "" reads as None (no string being read)
            escaped = ch == "\\" and not escaped
            continue
        if ch in "\"'":
            # An apostrophe right after a letter or digit ("it's", "the dogs' bowl" in an unquoted value) is not
            # a quote: JSON syntax opens one only after a bracket, a comma, a colon or a space (i > start:
            # text[start] is the bracket).
            if ch == "'" and text[i - 1].isalnum():
                continue
            quote = ch
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch == stack[-1]:  # the bracket awaited (a stray closing bracket is ignored)
            stack.pop()
            if not stack:
                return text[start : i + 1]
    if quote:
        return text[start:] + quote + "".join(reversed(stack))
    return text[start:] + "".join(reversed(stack))


def _loads_tolerant(s: str) -> Any:
    """Strict JSON first; then json-repair (single quotes, trailing commas, Python literals, missing brackets)."""
    try:
        return json.loads(s)
    except (ValueError, RecursionError):
        pass
    import json_repair

    try:
        value = json_repair.loads(s)
    except (ValueError, RecursionError, TypeError):
        value = []  # pragma: no mutate: None is refused alike (and json-repair does not raise on text)
    if not isinstance(value, (list, dict)) or not _has_content(value):
        raise PlanParseError("not JSON")  # json-repair turns any text into something; "[{" is not a plan
    return value


def _has_content(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value)
    if isinstance(value, list):
        return any(_has_content(v) for v in value)
    return True


def extract_json(text: str) -> Any:
    """The first JSON list (or object/objects) in an LLM reply, repaired if needed."""
    if not isinstance(text, str):
        raise PlanParseError("planner output is not text")
    body = _strip_fences(text.strip())
    body = GENERATED_RE.sub(lambda m: f"<GENERATED>-{m.group(1)}", body)
    starts = [i for i in (body.find("["), body.find("{")) if i >= 0]
    if not starts:
        raise PlanParseError("no JSON in the planner's reply")
    first = min(starts)
    span = _balanced_span(body, first)
    try:
        value = _loads_tolerant(span)
    except PlanParseError:
        if body[first] == "[":
            raise
        value = None
    if body[first] == "{":
        # Several bare objects one after another: collect them all.
        objects = []
        pos = first
        while pos >= 0:
            piece = _balanced_span(body, pos)
            try:
                objects.append(_loads_tolerant(piece))
            except PlanParseError:
                break
            pos = body.find("{", pos + len(piece))
        if len(objects) > 1:
            return objects
        if value is None:
            raise PlanParseError("no JSON in the planner's reply")
    return value


# ---------------------------------------------------------------------------------------------
# JSON -> validated tasks


def normalize_task_type(name: Any) -> str | None:
    if not isinstance(name, str):
        return None
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key in TASK_TYPES:
        return key
    return TASK_ALIASES.get(key)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = GENERATED_RE.search(value) or re.fullmatch(r"\s*(-?\d+)\s*", value)
        if m:
            return int(m.group(1))
    return None


def _normalize_args(raw: Any, notes: list[str], tid: Any) -> dict[str, str]:
    args: dict[str, str] = {}
    if not isinstance(raw, dict):
        if isinstance(raw, str) and raw.strip():
            notes.append(f"task {tid}: args was a string; used it as the text argument")
            return {"text": raw}
        return args
    for key, value in raw.items():
        k = str(key).strip().lower()
        k = ARG_ALIASES.get(k, k)
        if k not in ARG_KEYS:
            notes.append(f"task {tid}: dropped argument {key!r} (only text, image, audio are allowed)")
            continue
        if k in args:
            continue
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif value is None:
            continue
        elif not isinstance(value, str):
            value = json.dumps(value) if isinstance(value, dict) else str(value)
        args[k] = GENERATED_RE.sub(lambda m: f"<GENERATED>-{m.group(1)}", clean_text(value))
    return args


def tasks_from_json(data: Any, finished: frozenset[int] = frozenset()) -> Plan:
    """Validate and repair; every change is recorded in Plan.notes.

    finished: ids of tasks that already ran (a replan may use their outputs through `<GENERATED>-k`).
    """
    notes: list[str] = []
    if isinstance(data, dict):
        for key in ("tasks", "plan", "task_list"):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            data = [data]
            notes.append("the planner returned one object; treated it as a one-task list")
    if not isinstance(data, list):
        raise PlanParseError("the plan is not a list of tasks")
    tasks: list[Task] = []
    used: set[int] = set()
    for index, item in enumerate(data):
        if not isinstance(item, dict):
            notes.append(f"item {index}: not an object, ignored")
            continue
        tid = _as_int(item.get("id"))
        if tid is None or tid < 0 or tid in used:
            new = index
            while new in used:
                new += 1
            if item.get("id") is not None:
                notes.append(f"item {index}: id {item.get('id')!r} missing or duplicated, renumbered to {new}")
            tid = new
        used.add(tid)
        raw_type = item.get("task")
        task_type = normalize_task_type(raw_type)
        args = _normalize_args(item.get("args"), notes, tid)  # absent: None, read as no arguments
        raw_dep = item.get("dep")  # absent: None, read as no dependency
        if not isinstance(raw_dep, list):
            raw_dep = [raw_dep]
        dep = [d for d in (_as_int(x) for x in raw_dep) if d is not None and d >= 0]
        task = Task(id=tid, task=task_type or str(raw_type), dep=dep, args=args)  # fix_dep sets the final dep
        if task_type is None:
            task.error = f"unknown task type {raw_type!r}; supported types are listed in the planner prompt"
            notes.append(f"task {tid}: {task.error}")
        elif task_type != raw_type:
            notes.append(f"task {tid}: task type {raw_type!r} read as {task_type!r}")
        tasks.append(task)
    plan = Plan(tasks=tasks, notes=notes)
    plan = unfold(plan)
    plan = fix_dep(plan, finished)
    check_graph(plan)
    return plan


def kind_problems(plan: Plan) -> list[str]:
    """Tasks that lack the input they run on, or whose `<GENERATED>-k` image or audio argument is something task
    k does not make, each as a line for a repair round to show the planner. Advisory: such a task still runs as
    written when no better plan comes back (a model may cope with it)."""
    by_id = plan.by_id()
    problems = []
    for task in plan.tasks:
        if task.error:
            continue
        need = NEEDS.get(task.task)
        if need and not task.args.get(need):
            problems.append(f"task {task.id} ({task.task}) needs a{'n' if need[0] in 'aeiou' else ''} {need} "
                            "argument")
            continue
        for key in ("image", "audio"):
            for ref in sorted({int(n) for n in REF_RE.findall(task.args.get(key, ""))}):
                source = by_id.get(ref)
                if source is not None and key not in MAKES.get(source.task, {key}):
                    problems.append(f"task {task.id} ({task.task}): its {key} argument is <GENERATED>-{ref}, but "
                                    f"task {ref} ({source.task}) makes {' or '.join(sorted(MAKES[source.task]))}, "
                                    f"not an {key}")
    return problems


def parse_plan(text: str, finished: frozenset[int] = frozenset()) -> Plan:
    """LLM text -> Plan. Raises PlanParseError when there is no task list to read."""
    return tasks_from_json(extract_json(text), finished)


def unfold(plan: Plan) -> Plan:
    """One task per `<GENERATED>` ref where an argument lists several (as JARVIS does).

    Unlike JARVIS, the copies get fresh ids so results never overwrite each other.
    """
    if not plan.tasks:
        return plan
    next_id = max(t.id for t in plan.tasks) + 1
    out: list[Task] = []
    for task in plan.tasks:
        split_key = None
        for key, value in task.args.items():
            items = [v.strip() for v in value.split(",")]
            if "<GENERATED>" in value and len(items) > 1 and all(REF_RE.fullmatch(v) for v in items):
                split_key = key
                break
        if split_key is None:
            out.append(task)
            continue
        items = [v.strip() for v in task.args[split_key].split(",")]
        for n, item in enumerate(items):
            clone = copy.deepcopy(task)
            clone.args[split_key] = item
            if n > 0:
                clone.id = next_id
                next_id += 1
            out.append(clone)
        plan.notes.append(
            f"task {task.id}: unfolded into tasks {[task.id] + list(range(next_id - len(items) + 1, next_id))}"
        )
    plan.tasks = out
    return plan


def fix_dep(plan: Plan, finished: frozenset[int] = frozenset()) -> Plan:
    """Rebuild `dep` from the `<GENERATED>-N` refs (JARVIS's rule), keeping valid explicit deps too."""
    ids = {t.id for t in plan.tasks}
    for task in plan.tasks:
        refs = task.refs()
        for ref in refs:
            if ref in finished and ref not in ids:
                continue  # the output of a task that already ran
            if ref == task.id:
                task.error = task.error or "an argument refers to the task's own output"
            elif ref not in ids:
                earlier = [d for d in task.dep if d in ids and d != task.id]
                if len(earlier) == 1:
                    for key, value in task.args.items():
                        task.args[key] = value.replace(f"<GENERATED>-{ref}", f"<GENERATED>-{earlier[0]}")
                    plan.notes.append(f"task {task.id}: reference to missing task {ref} read as {earlier[0]}")
                else:
                    task.error = task.error or f"an argument refers to task {ref}, which is not in the plan"
        deps = [r for r in task.refs() if r in ids and r != task.id]
        task.dep = deps or [-1]
    return plan


def check_graph(plan: Plan) -> None:
    """Mark tasks on a dependency cycle as failed; forward references without a cycle are fine."""
    by_id = plan.by_id()
    done: set[int] = set()  # every task reachable from these was visited
    on_cycle: set[int] = set()

    def visit(tid: int, path: list[int]) -> None:  # path: the tasks being visited, from the first to tid
        for d in by_id[tid].dep:
            if d in path:
                on_cycle.update(path[path.index(d) :])
            elif d in by_id and d not in done:
                visit(d, path + [d])
        done.add(tid)

    for tid in by_id:
        if tid not in done:
            visit(tid, [tid])
    for tid in sorted(on_cycle):
        by_id[tid].error = by_id[tid].error or f"dependency cycle through tasks {sorted(on_cycle)}"
    if on_cycle:
        plan.notes.append(f"dependency cycle through tasks {sorted(on_cycle)}; those tasks will not run")
