"""The model catalog (data/p0_models.jsonl): which models can do a task, ranked for a request.

Ranking is pluggable: keyword overlap plus popularity always works; a semantic ranker (sentence
embeddings) is layered on top when its model is installed (see semantic.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError


@dataclass(frozen=True)
class ModelCard:
    id: str
    task: str
    likes: int = 0
    downloads: int = 0
    tags: tuple[str, ...] = ()
    language: tuple[str, ...] = ()
    description: str = ""
    size_mb: float | None = None

    def text(self) -> str:
        """What a ranker reads: id, task, tags, languages and the description."""
        name = self.id.split("/")[-1].replace("-", " ").replace("_", " ")
        return f"{name}. {self.task}. {self.description} Tags: {', '.join(self.tags)}. Languages: {', '.join(self.language)}."

    def meta(self, max_description: int, hosted_on: str | None = None) -> dict[str, Any]:
        """The candidate info shown to the LLM at selection time (JARVIS's fields)."""
        return {
            "id": self.id,
            "inference endpoint": hosted_on,
            "likes": self.likes,
            "description": self.description[:max_description],
            "tags": list(self.tags),
            "language": list(self.language),
        }


@dataclass(frozen=True)
class RankQuery:
    task: str
    text: str  # the task's arguments and the user's request
    language: str | None = None
    max_size_mb: float | None = None


class Ranker(Protocol):
    def rank(self, query: RankQuery, cards: list[ModelCard]) -> list[tuple[ModelCard, float]]: ...


WORD_RE = re.compile(r"[a-z0-9]+")
STOP = set("a an the of in on to for and or with from by is are be this that it my me i you please can".split())
LANGUAGE_WORDS = {
    "english": "en", "german": "de", "french": "fr", "spanish": "es", "chinese": "zh", "japanese": "ja",
    "italian": "it", "portuguese": "pt", "russian": "ru", "arabic": "ar", "dutch": "nl", "korean": "ko",
    "hindi": "hi", "multilingual": "multilingual",
}


def words(text: str) -> set[str]:
    return {w for w in WORD_RE.findall(text.lower()) if w not in STOP}


def popularity(card: ModelCard) -> float:
    """0..1, logarithmic in likes and downloads."""
    return min(1.0, (math.log10(1 + card.likes) / 4 + math.log10(1 + card.downloads) / 8) / 2)


_LANGUAGE_RE = re.compile(r"\b(" + "|".join(LANGUAGE_WORDS) + r")\b")


def languages_in(text: str) -> set[str]:
    """The languages a request names ("... into German"): one pass over the text, whatever its length."""
    return {LANGUAGE_WORDS[word] for word in _LANGUAGE_RE.findall(text.lower())}


def language_fit(card: ModelCard, wanted: set[str]) -> float:
    if not wanted or not card.language:
        return 0.0
    if wanted & set(card.language):
        return 1.0
    if "multilingual" in card.language:
        return 0.5
    return -1.0


class KeywordRanker:
    """Word overlap with the card text, plus language fit and popularity. No model needed."""

    def rank(self, query: RankQuery, cards: list[ModelCard]) -> list[tuple[ModelCard, float]]:
        q = words(query.text)
        wanted = languages_in(query.text) | ({query.language} if query.language else set())
        scored = []
        for card in cards:
            overlap = len(q & words(card.text())) / (1 + len(q))
            score = overlap + 0.3 * language_fit(card, wanted) + 0.4 * popularity(card)
            scored.append((card, score))
        return sorted(scored, key=lambda cs: -cs[1])


class PopularityRanker:
    def rank(self, query: RankQuery, cards: list[ModelCard]) -> list[tuple[ModelCard, float]]:
        return sorted(((c, float(c.likes)) for c in cards), key=lambda cs: -cs[1])


@dataclass
class Catalog:
    cards: list[ModelCard]
    path: Path | None = None
    _by_task: dict[str, list[ModelCard]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for card in self.cards:
            self._by_task.setdefault(card.task, []).append(card)
        for lst in self._by_task.values():
            lst.sort(key=lambda c: -c.likes)

    @classmethod
    def load(cls, path: Path) -> Catalog:
        if not path.is_file():
            raise ConfigError(f"model catalog not found: {path} (set `catalog` in the config)")
        cards = []
        for n, line in enumerate(path.read_bytes().decode().splitlines(), 1):  # UTF-8, whatever the locale
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                cards.append(card_from_row(row))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise ConfigError(f"{path}:{n}: bad catalog row ({exc.__class__.__name__}: {exc})") from None
        return cls(cards=cards, path=path)

    def tasks(self) -> list[str]:
        return sorted(self._by_task)

    def for_task(self, task: str) -> list[ModelCard]:
        return list(self._by_task.get(task, []))

    def get(self, model_id: str) -> ModelCard | None:
        return next((c for c in self.cards if c.id == model_id), None)

    def candidates(self, query: RankQuery, ranker: Ranker, limit: int) -> list[ModelCard]:
        return [c for c, _ in self.ranked(query, ranker, limit)]

    def ranked(self, query: RankQuery, ranker: Ranker, limit: int) -> list[tuple[ModelCard, float]]:
        """Candidates for the task, best first, with the ranker's scores."""
        cards = self.for_task(query.task)
        if query.max_size_mb:
            cards = [c for c in cards if c.size_mb is None or c.size_mb <= query.max_size_mb]
        return ranker.rank(query, cards)[:limit]


def card_from_row(row: dict[str, Any]) -> ModelCard:
    def seq(v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        return tuple(str(x) for x in v)

    meta = row.get("meta") or {}
    return ModelCard(
        id=str(row["id"]),
        task=str(row["task"]),
        likes=int(row.get("likes") or 0),
        downloads=int(row.get("downloads") or 0),
        tags=seq(row.get("tags", meta.get("tags"))),
        language=seq(row.get("language", meta.get("language"))),
        description=str(row.get("description") or ""),
        size_mb=float(row["size_mb"]) if row.get("size_mb") is not None else None,
    )


def dump_rows(cards: Iterable[ModelCard]) -> str:
    return "\n".join(
        json.dumps({"id": c.id, "task": c.task, "likes": c.likes, "downloads": c.downloads, "tags": list(c.tags),
                    "language": list(c.language), "description": c.description}) for c in cards
    )
