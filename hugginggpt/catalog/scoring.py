"""How a candidate's score is made: meaning + popularity + size fit + expected latency + availability - health.

Every factor is a plain number in a fixed range, computed from what the store knows; `score` weighs them
with `Weights` (config keys `catalog_weights.*`); `explain` names the factors that put the winner ahead of
the runner-up, for the selection reason shown to the user.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

# availability: where a model can run now, best first (the Selector knows "loaded"; the store knows the rest)
AVAILABILITY = {"loaded": 1.0, "local": 0.7, "hosted": 0.5, "unknown": 0.3, "none": 0.0}
LATENCY_REFERENCE_SECONDS = 5.0  # a model answering in this many seconds scores 0.5
SIZE_REFERENCE_MB = 2000.0  # without a budget, a model of this size scores 0.5 on size


@dataclass(frozen=True)
class Weights:
    """Config `catalog_weights`; defaults measured on tests/test_ranking.py's CASES (see bench/README.md)."""

    meaning: float = 1.0
    popularity: float = 0.08
    language: float = 0.15
    size: float = 0.03
    latency: float = 0.03
    availability: float = 0.05
    health: float = 0.5
    health_half_life_hours: float = 6.0  # a failure's weight halves every this many hours

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Weights:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown weight(s) {', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}")
        return cls(**{k: float(v) for k, v in data.items()})


@dataclass(frozen=True)
class Factors:
    meaning: float = 0.0  # cosine similarity of request and card, -1..1 (keyword overlap without vectors)
    popularity: float = 0.0  # 0..1, log of likes and downloads
    language: float = 0.0  # -1 (wrong language) .. 1 (the wanted one); 0 unknown
    size: float = 0.5  # 0..1: 1 tiny, 0 at the budget; 0.5 unknown
    latency: float = 0.5  # 0..1: 1 instant; measured when the model has run, else guessed from size
    availability: float = AVAILABILITY["unknown"]  # see AVAILABILITY
    health: float = 0.0  # 0..1 penalty: 1 = failed just now (and again), decays with time

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in asdict(self).items()}


def score(f: Factors, w: Weights) -> float:
    return (w.meaning * f.meaning + w.popularity * f.popularity + w.language * f.language + w.size * f.size
            + w.latency * f.latency + w.availability * f.availability - w.health * f.health)


FACTORS = tuple(f.name for f in fields(Factors))


def contributions(f: Factors, w: Weights) -> dict[str, float]:
    """What each factor adds to the score (health takes away). Plain attribute reads: this runs for every
    candidate of every selection, and `asdict` deep-copies."""
    return {k: (-1.0 if k == "health" else 1.0) * getattr(w, k) * getattr(f, k) for k in FACTORS}


def explain(best: Factors, runner_up: Factors | None, w: Weights) -> str:
    """The factors that put `best` ahead of `runner_up`, largest first, e.g. 'meaning +0.21, health +0.50'."""
    if runner_up is None:
        return "the only candidate"
    a, b = contributions(best, w), contributions(runner_up, w)
    diffs = sorted(((k, a[k] - b[k]) for k in a), key=lambda kv: -kv[1])
    deciding = [f"{k} {d:+.2f}" for k, d in diffs if d > 0.005][:3]
    return ", ".join(deciding) if deciding else "a near tie"


def popularity(likes: np.ndarray | float, downloads: np.ndarray | float) -> np.ndarray | float:
    """0..1, logarithmic in likes and downloads (the same formula as catalog.cards.popularity)."""
    return np.minimum(1.0, (np.log10(1 + np.asarray(likes, dtype=np.float64)) / 4
                            + np.log10(1 + np.asarray(downloads, dtype=np.float64)) / 8) / 2)


def size_fit(size_mb: np.ndarray | float | None, budget_mb: float | None) -> np.ndarray | float:
    """1 for a tiny model, falling to 0 at the budget (or 0.5 at SIZE_REFERENCE_MB without one); 0.5 unknown."""
    s = np.asarray(size_mb, dtype=np.float64)  # None (unknown) is NaN
    if budget_mb:
        fit = np.clip(1.0 - s / budget_mb, 0.0, 1.0)
    else:
        fit = 1.0 / (1.0 + s / SIZE_REFERENCE_MB)
    return np.where(np.isnan(s), 0.5, fit)


def latency_fit(ewma_seconds: float | None, size_mb: float | None) -> float:
    """Measured latency when known, else a guess from the size (bigger models answer slower)."""
    if ewma_seconds is not None:
        return 1.0 / (1.0 + ewma_seconds / LATENCY_REFERENCE_SECONDS)
    if size_mb is None or math.isnan(size_mb):
        return 0.5
    return 1.0 / (1.0 + size_mb / SIZE_REFERENCE_MB)
