"""Few-shot planning demos picked per request: the pool's examples most like the request, by meaning.

Why: a small model copies the nearest example far more than it follows a rule. Shown the three examples
closest to the request (a transcription chain for an audio request, a two-image comparison for two images),
it picks the right task types and links them; shown a fixed handful, it bends every request towards them.

The pool is a JSON list of `{"request", "plan"}` written for this project (`demos/plan_pool.json`), embedded
once with the catalog's sentence embedder (all-MiniLM-L6-v2 where installed, hashed words otherwise). The
picked demos are ordered from the least to the most similar, so the closest example sits right before the
request, and they are rendered as chat turns after the fixed system prompt: the server's KV cache keeps
the system prompt, and only the demos and the request are evaluated per request.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError
from .plan import tasks_from_json


@dataclass(frozen=True)
class Demo:
    request: str
    plan: tuple[dict[str, Any], ...]

    def reply(self) -> str:
        """The plan as the planner is asked to write it: `{"tasks": [...]}`, one line."""
        return json.dumps({"tasks": list(self.plan)}, ensure_ascii=False)


class DemoPool:
    """The demos and their embeddings (computed on first use, once, under a lock)."""

    def __init__(self, demos: list[Demo], embedder=None):
        self.demos = demos
        self._embedder = embedder
        self._vectors: np.ndarray | None = None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path, embedder=None) -> DemoPool:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"planner_demo_pool: no such file {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid UTF-8 JSON ({exc})") from None
        demos = []
        for n, item in enumerate(data if isinstance(data, list) else [None]):
            if not (isinstance(item, dict) and isinstance(item.get("request"), str) and isinstance(item.get("plan"), list)):
                raise ConfigError(f"{path}: item {n} must be {{\"request\": text, \"plan\": [tasks]}}")
            plan = tasks_from_json(item["plan"])
            broken = [f"task {t.id}: {t.error}" for t in plan.tasks if t.error]
            if broken:  # a demo that teaches a broken plan would be copied: refused at startup
                raise ConfigError(f"{path}: item {n} ({item['request'][:40]!r}) has a plan that cannot run: "
                                  + "; ".join(broken))
            demos.append(Demo(item["request"], tuple(item["plan"])))
        if not demos:
            raise ConfigError(f"{path}: the demo pool is empty")
        return cls(demos, embedder)

    def _embed(self, texts: list[str]) -> np.ndarray:
        if self._embedder is None:
            from .catalog.embedders import default_embedder

            self._embedder = default_embedder()
        elif callable(self._embedder) and not hasattr(self._embedder, "embed"):
            self._embedder = self._embedder()  # a factory: the sentence model is loaded on first use only
        return np.asarray(self._embedder.embed(texts), dtype=np.float32)

    def vectors(self) -> np.ndarray:
        with self._lock:
            if self._vectors is None:
                self._vectors = self._embed([d.request for d in self.demos])
            return self._vectors

    def pick(self, request: str, k: int) -> list[Demo]:
        """The k demos most similar to `request`, least similar first (the closest sits next to the request)."""
        if k <= 0:
            return []
        pool = self.vectors()
        query = self._embed([request])[0]
        scores = pool @ query
        best = np.argsort(-scores, kind="stable")[: min(k, len(self.demos))]
        return [self.demos[i] for i in reversed(best)]

