"""Plan quality on TaskBench (HuggingFace tools domain): our plans in its format, and its metrics.

The metrics follow TaskBench's `task_eval.py` in resource-dependency mode: node names are pooled as
(sample, tool) set items over all samples, tool names outside the 23 are dropped from node items, edges
are rebuilt from `<node-j>` references in the arguments (self references skipped), and each score is one
micro-F1 = 2TP / (2TP + FP + FN). A plan that cannot be read counts as an empty plan, never dropped.

The parameter metrics are TaskBench's too: t-F1 pools "tool-type" items and v-F1 "tool-type-value" items,
where a literal argument's type is read from its file extension (image, audio, video, else text) and a
`<node-j>` argument's type is the output type of node j's tool and its value is that tool's name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .plan import REF_RE, Plan

NODE_REF = re.compile(r"<node-(\d+)>")
FILE_KINDS = {"image": (".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp"),
              "audio": (".wav", ".mp3", ".flac", ".ogg", ".m4a"), "video": (".mp4", ".avi", ".mov")}


@dataclass(frozen=True)
class ToolSet:
    """The 23 TaskBench tools and how their names map to our task types."""

    to_ours: dict[str, str | None]  # TaskBench tool name -> our task type (None: no counterpart)
    outputs: dict[str, list[str]]  # TaskBench tool name -> output types

    @classmethod
    def load(cls, mapping_path: Path) -> ToolSet:
        data = json.loads(Path(mapping_path).read_text())
        io = data["taskbench_io_types"]
        return cls(dict(data["taskbench_to_hugginggpt"]), {k: list(v.get("output-type", [])) for k, v in io.items()})

    @property
    def names(self) -> set[str]:
        return set(self.to_ours)

    def ours(self, tool: str) -> str:
        """Our task type for a tool; one without a counterpart keeps a slug of its name (the planner sees it)."""
        return self.to_ours.get(tool) or tool.strip().lower().replace("_", "-").replace(" ", "-")

    def theirs(self, task_type: str) -> str:
        back = {v: k for k, v in self.to_ours.items() if v}
        if task_type in back:
            return back[task_type]
        for name in self.to_ours:  # "image-editing" -> "Image Editing"
            if self.ours(name) == task_type:
                return name
        return task_type


def to_taskbench(plan: Plan | None, tools: ToolSet) -> list[dict[str, Any]]:
    """Our plan -> TaskBench `task_nodes` (`<GENERATED>-k` becomes `<node-j>`, j = position of task k)."""
    if plan is None:
        return []
    position = {t.id: j for j, t in enumerate(plan.tasks)}
    nodes = []
    for task in plan.tasks:
        arguments = []
        for value in task.args.values():
            arguments.append(REF_RE.sub(lambda m: f"<node-{position[int(m.group(1))]}>"
                                        if int(m.group(1)) in position else "<missing>", value))
        nodes.append({"task": tools.theirs(task.task), "arguments": arguments})
    return nodes


def gold_as_our_plan(task_nodes: list[dict[str, Any]], tools: ToolSet) -> list[dict[str, Any]]:
    """A TaskBench gold plan written as our planner would (for replay tests): ids = positions."""
    out = []
    for i, node in enumerate(task_nodes):
        args: dict[str, str] = {}
        deps: list[int] = []
        for argument in node.get("arguments", []):
            value = argument if isinstance(argument, str) else json.dumps(argument)
            refs = [int(j) for j in NODE_REF.findall(value)]
            for j in refs:  # each node once, however often the arguments name it
                if j != i and j not in deps:
                    deps.append(j)
            kind = _kind_of(value, refs, task_nodes, tools)
            value = NODE_REF.sub(lambda m: f"<GENERATED>-{m.group(1)}", value)
            args[kind] = f"{args[kind]} {value}" if kind in args else value
        name = str(node.get("task", ""))
        out.append({"task": tools.ours(name) if name in tools.to_ours else name, "id": i, "dep": deps or [-1],
                    "args": args})
    return out


def _kind_of(value: str, refs: list[int], nodes: list[dict[str, Any]], tools: ToolSet) -> str:
    if refs and 0 <= refs[0] < len(nodes):
        produced = tools.outputs.get(str(nodes[refs[0]].get("task")), [])
        for kind in ("image", "audio", "video"):
            if kind in produced:
                return "image" if kind == "video" else kind
        return "text"
    lower = value.lower().strip()
    for kind, suffixes in FILE_KINDS.items():
        if lower.endswith(suffixes):
            return "image" if kind == "video" else kind
    return "text"


def node_names(nodes: Iterable[dict[str, Any]]) -> set[str]:
    return {str(n.get("task", "")).replace("_", " ") for n in nodes}


def edges_from_args(nodes: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """TaskBench's resource-mode links: `<node-j>` in node i's arguments -> (name j, name i); no self links."""
    names = [str(n.get("task", "")) for n in nodes]
    edges = set()
    for i, node in enumerate(nodes):
        for argument in node.get("arguments", []):
            for j in (int(x) for x in NODE_REF.findall(argument if isinstance(argument, str) else json.dumps(argument))):
                if j != i and 0 <= j < len(names):
                    edges.add((names[j].replace("_", " "), names[i]))
    return edges


# TaskBench's `get_content_type`: an extension anywhere in the value names its type.
CONTENT_TYPES = (("image", ("jpg", "png", "jpeg", "gif", "bmp", "tiff", "svg", "ico")),
                 ("audio", ("mp3", "wav", "wma", "ogg", "aac", "flac", "aiff", "au")),
                 ("video", ("mp4", "avi", "mov", "flv", "wmv", "mkv", "webm", "m4v", "mpg", "mpeg")))


def content_type(value: str) -> str:
    value = value.strip("'")
    for kind, extensions in CONTENT_TYPES:
        if any("." + ext in value for ext in extensions):
            return kind
    return "text"


def parameters(nodes: list[dict[str, Any]], outputs: dict[str, list[str]]) -> tuple[set[str], set[str]]:
    """The t-F1 and v-F1 items of one plan: {"tool-type"} and {"tool-type-value"} (self references skipped)."""
    names = [str(n.get("task", "")).replace("_", " ") for n in nodes]
    typed, valued = set(), set()
    for i, node in enumerate(nodes):
        for argument in node.get("arguments", []):
            if isinstance(argument, dict):
                argument = next(iter(argument.values()), "")
            if isinstance(argument, list):
                argument = " ".join(str(a) for a in argument)
            argument = str(argument)
            ref = NODE_REF.search(argument)
            if ref:
                j = int(ref.group(1))
                if j == i or not 0 <= j < len(names):
                    continue
                kind = (outputs.get(names[j]) or ["none"])[0] if names[j] in outputs else "other"
                value = names[j]
            else:
                kind, value = content_type(argument), argument
            typed.add(f"{names[i]}-{kind}")
            valued.add(f"{names[i]}-{kind}-{value}")
    return typed, valued


@dataclass
class Tally:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    def add(self, gold: set, predicted: set) -> None:
        self.tp += len(gold & predicted)
        self.fp += len(predicted - gold)
        self.fn += len(gold - predicted)

    @property
    def f1(self) -> float:
        denominator = 2 * self.tp + self.fp + self.fn
        return 1.0 if denominator == 0 else 2 * self.tp / denominator


@dataclass
class Scores:
    nodes: Tally = field(default_factory=Tally)
    edges: Tally = field(default_factory=Tally)
    types: Tally = field(default_factory=Tally)  # t-F1
    values: Tally = field(default_factory=Tally)  # v-F1
    samples: int = 0
    parsed: int = 0
    valid: int = 0

    @property
    def valid_rate(self) -> float:
        return self.valid / self.samples if self.samples else 0.0


    @property
    def parse_rate(self) -> float:
        return self.parsed / self.samples if self.samples else 0.0


def score(gold: list[dict[str, Any]], predicted: dict[str, list[dict[str, Any]]], valid: dict[str, bool],
          tools: ToolSet, parsed: dict[str, bool] | None = None,
          gold_nodes_of: dict[str, list[dict[str, Any]]] | None = None) -> Scores:
    """gold: sidecar rows (`id`, `gold_nodes`, `gold_links_from_args`); predicted: id -> TaskBench nodes.
    gold_nodes_of: id -> the sample's gold `task_nodes`, for t-F1 and v-F1 (left at zero without it)."""
    scores = Scores()
    known = tools.names
    for row in gold:
        nodes = predicted.get(row["id"], [])  # missing = empty plan, counted
        scores.samples += 1
        scores.valid += bool(valid.get(row["id"]))
        scores.parsed += bool((parsed or valid).get(row["id"]))
        if gold_nodes_of is not None:
            gold_types, gold_values = parameters(gold_nodes_of.get(row["id"], []), tools.outputs)
            types, values = parameters(nodes, tools.outputs)
            scores.types.add(gold_types, types)
            scores.values.add(gold_values, values)
        gold_nodes = {n for n in row["gold_nodes"] if n in known}
        scores.nodes.add(gold_nodes, {n for n in node_names(nodes) if n in known})
        scores.edges.add({tuple(e) for e in row["gold_links_from_args"]}, edges_from_args(nodes))
    return scores
