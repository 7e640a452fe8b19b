"""Prompt assembly for the three LLM stages: system prompt (tprompt), few-shot demos, user prompt.

Demos are parsed as JSON first and slots filled in each message afterwards, so a value with quotes
or newlines can never break the JSON (JARVIS edited the raw JSON text instead).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .demopick import DemoPool
from .errors import ConfigError
from .plan import TASK_TYPES

DEFAULT_TPROMPT = {
    "parse_task": (
        "#1 Task Planning Stage: You turn a user request into a list of AI tasks, written as a JSON list: "
        '[{"task": task, "id": task_id, "dep": dependency_task_ids, "args": {"text": text or <GENERATED>-dep_id, '
        '"image": image_url or <GENERATED>-dep_id, "audio": audio_url or <GENERATED>-dep_id}}]. '
        '"<GENERATED>-dep_id" stands for the text, image or audio produced by task dep_id (check that this task '
        'really produces that kind of resource), and dep_id must appear in "dep". "dep" lists the ids of the '
        'earlier tasks whose outputs this task needs, or [-1] when it needs none. "args" may only contain '
        '"text", "image" and "audio". "task" must be one of: ' + ", ".join(f'"{t}"' for t in TASK_TYPES) + ". "
        "Use as few tasks as solve the request, mind the order of tasks and the types of their inputs and "
        "outputs, and answer with the JSON list only. If the request needs no AI task, answer []."
    ),
    "choose_model": (
        "#2 Model Selection Stage: Given the user request and one parsed task, pick the model most likely to "
        "solve it from the candidate list. Weigh each model's description and tags most; prefer models with a "
        "local inference endpoint, which are faster and more reliable."
    ),
    "response_results": (
        "#4 Response Generation Stage: From the task execution log, answer the user's request directly, then "
        "describe the workflow: the tasks, the models used and what each produced."
    ),
}
DEFAULT_PROMPT = {
    "parse_task": (
        "The chat log [ {{context}} ] may mention resources I refer to. Now my request is { {{input}} }. "
        "Mind the input and output types of the tasks and the dependencies between them."
    ),
    "choose_model": (
        "Please choose the most suitable model from {{metas}} for the task {{task}}. Answer in strict JSON: "
        '{"id": "id", "reason": "your detailed reason for the choice"}.'
    ),
    "response_results": (
        "Yes. First answer my request directly, based on the inference results; some results may be wrong, so "
        "weigh them carefully. Then describe your workflow, with the models used and their results, in a "
        "friendly tone, leaving out what is not relevant. Give the complete path or URL of every file in the "
        "results. If the results contain nothing useful, tell me you could not do it."
    ),
}

# Context windows of common models, in tokens; unknown models get a conservative default.
CONTEXT_WINDOWS = {
    "text-davinci-003": 4096, "gpt-3.5-turbo": 4096, "gpt-3.5-turbo-16k": 16384, "gpt-4": 8192,
    "gpt-4-32k": 32768, "gpt-4-turbo": 128000, "gpt-4o": 128000, "gpt-4o-mini": 128000, "gpt-4.1": 1000000,
    "gpt-4.1-mini": 1000000,
}
DEFAULT_CONTEXT_WINDOW = 8192
RESERVED_FOR_REPLY = 800


def count_tokens(text: str) -> int:
    """A fast, tokenizer-free estimate (about 4 characters a token for English and JSON)."""
    return len(text) // 4 + 1


def context_window(model: str, override: int | None = None) -> int:
    if override:
        return int(override)
    if model in CONTEXT_WINDOWS:
        return CONTEXT_WINDOWS[model]
    for name, size in sorted(CONTEXT_WINDOWS.items(), key=lambda kv: -len(kv[0])):
        if model.startswith(name):
            return size
    return DEFAULT_CONTEXT_WINDOW


SLOT = re.compile(r"\{\{(\w+)\}\}")


def fill(template: str, slots: dict[str, Any]) -> str:
    """`{{name}}` in `template` replaced by its slot (text as it is, other values as JSON), in one pass: a
    slot's name inside a value put in (a user's text saying `{{metas}}`, a past turn quoting `{{input}}`) is text,
    never filled again; a name with no slot is left as written."""

    def value_of(match: re.Match[str]) -> str:
        if match.group(1) not in slots:
            return match.group(0)
        value = slots[match.group(1)]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)

    return SLOT.sub(value_of, template)


@dataclass(frozen=True)
class PromptSet:
    """The three stages' prompts, read once at startup from the config's files."""

    tprompt: dict[str, str]
    prompt: dict[str, str]
    demos: dict[str, list[dict[str, str]]]
    pool: DemoPool | None = None  # planning demos picked per request (after the fixed ones), see demopick.py
    pool_picks: int = 0

    @classmethod
    def from_config(cls, config, embedder=None) -> PromptSet:
        demos = {}
        for stage, path in config.demos.items():
            demos[stage] = load_demos(Path(path), config.path)
        picks = config.planner_demos
        pool_path = config.planner_demo_pool
        if embedder is None:
            def embedder():  # the catalog's sentence model, with its ONNX graph cached where the catalog keeps it
                from .catalog.embedders import default_embedder

                return default_embedder(config.semantic_ranking, config.cache_dir, config.embedding_precision)
        return cls(
            tprompt={**DEFAULT_TPROMPT, **{k: v for k, v in config.tprompt.items() if v}},
            prompt={**DEFAULT_PROMPT, **{k: v for k, v in config.prompt.items() if v}},
            demos=demos,
            pool=DemoPool.load(pool_path, embedder) if picks and pool_path else None,
            pool_picks=picks,
        )

    @classmethod
    def from_jarvis(cls, config_file: Path) -> PromptSet:
        """JARVIS's own prompts and demos, read from a JARVIS config file, to benchmark them beside ours.

        JARVIS runs from `hugginggpt/server` and names its demos relative to it, so a demo path is looked up
        from the config's parent folder first, then from the config's own folder. Only planning is required.
        """
        import yaml

        config_file = Path(config_file)
        if not config_file.is_file():
            raise ConfigError(f"{config_file}: no such JARVIS config file (e.g. JARVIS/hugginggpt/server/configs/"
                              "config.default.yaml)")
        try:
            data = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{config_file}: not valid YAML ({exc})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{config_file}: not UTF-8 text (save it as UTF-8)") from None
        needs = (f"{config_file}: a JARVIS config needs tprompt, prompt and demos_or_presteps entries for "
                 "parse_task")
        if not isinstance(data, dict):
            raise ConfigError(needs)
        sections = {k: data.get(k) or {} for k in ("tprompt", "prompt", "demos_or_presteps")}
        if not all(isinstance(v, dict) and v.get("parse_task") for v in sections.values()):
            raise ConfigError(needs)
        for section, entries in sections.items():
            for stage, value in entries.items():
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"{config_file}: {section}.{stage} must be text, got {str(value)[:60]!r}")
            sections[section] = {stage: value for stage, value in entries.items() if value}  # unset: ours
        demos = {}
        for stage, name in sections["demos_or_presteps"].items():
            found = [p for p in (config_file.parent.parent / name, config_file.parent / name) if p.is_file()]
            if found:
                demos[stage] = load_demos(found[0], config_file)
            elif stage == "parse_task":
                load_demos(config_file.parent.parent / name, config_file)  # raises with the path it looked for
        return cls(tprompt={**DEFAULT_TPROMPT, **sections["tprompt"]}, prompt={**DEFAULT_PROMPT, **sections["prompt"]},
                   demos=demos)

    def _demos(self, stage: str, slots: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": m["role"], "content": fill(m["content"], slots)} for m in self.demos.get(stage, [])]

    def parse_task(
        self, context: list[dict[str, str]], user_input: str, model: str, max_context: int | None = None
    ) -> list[dict[str, str]]:
        """Planner messages; the oldest history turns are dropped until the prompt fits the window.

        Order: the fixed system prompt and demos (the same for every request, so a local server's prompt cache
        keeps them), then the demos picked for this request, then the request."""
        base = [{"role": "system", "content": self.tprompt["parse_task"]}] + self._demos("parse_task", {})
        if self.pool is not None:
            for demo in self.pool.pick(user_input, self.pool_picks):
                base += [{"role": "user", "content": fill(self.prompt["parse_task"], {"context": [],
                                                                                     "input": demo.request})},
                         {"role": "assistant", "content": demo.reply()}]
        budget = context_window(model, max_context) - RESERVED_FOR_REPLY
        start = 0
        while True:
            history = [{"role": m["role"], "content": m["content"]} for m in context[start:]]
            user = fill(self.prompt["parse_task"], {"context": history, "input": user_input})
            messages = base + [{"role": "user", "content": user}]
            if count_tokens("".join(m["content"] for m in messages)) <= budget or start >= len(context):
                return messages
            start += 2 if start + 2 <= len(context) else 1

    def choose_model(self, user_input: str, task: dict[str, Any], metas: list[dict[str, Any]]) -> list[dict[str, str]]:
        slots = {"input": user_input, "task": task, "metas": metas}
        return (
            [{"role": "system", "content": self.tprompt["choose_model"]}]
            + self._demos("choose_model", slots)
            + [{"role": "user", "content": fill(self.prompt["choose_model"], slots)}]
        )

    def response_results(self, user_input: str, processes: list[dict[str, Any]]) -> list[dict[str, str]]:
        slots = {"input": user_input, "processes": processes}
        return (
            [{"role": "system", "content": self.tprompt["response_results"]}]
            + self._demos("response_results", slots)
            + [{"role": "user", "content": fill(self.prompt["response_results"], slots)}]
        )


def load_demos(path: Path, config_path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise ConfigError(f"{config_path}: demos file not found: {path} (see `demos_or_presteps`)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (save it as UTF-8)") from None
    if not isinstance(data, list) or not all(
        isinstance(m, dict) and m.get("role") in ("user", "assistant", "system") and isinstance(m.get("content"), str)
        for m in data
    ):
        raise ConfigError(f"{path}: must be a JSON list of {{\"role\", \"content\"}} messages")
    return data
