"""Text embedders the catalog store can use: anything with `name`, `dim` and `embed(texts)`.

The store does not care which model makes its vectors; it records the embedder's `name` and `dim` and
re-embeds when they change. `HashEmbedder` needs no model (hashed words and word pairs: deterministic,
fast, good enough for tests and for a catalog without the sentence model); `SemanticEmbedder` wraps any
object with an `embed(texts)` method, such as `hugginggpt.catalog.semantic.SemanticRanker`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Protocol

import numpy as np

from .cards import STOP


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim), each row of unit length."""
        ...


TOKEN_RE = re.compile(r"[a-z0-9]+")


def _normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    norms[norms == 0] = 1.0  # pragma: no mutate: any divisor but 0 leaves a zero row zero
    return (vectors / norms).astype(np.float32)


class HashEmbedder:
    """Bag of words and word pairs hashed into `dim` signed buckets. No model, same vector on every machine."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.name = f"hash-bow-{dim}"

    def _bucket(self, token: str) -> tuple[int, float]:
        h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
        return h % self.dim, 1.0 if (h >> 63) & 1 else -1.0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # pragma: no mutate: in float64 only the last float32 bit moves
        for i, text in enumerate(texts):
            toks = [t for t in TOKEN_RE.findall(text.lower()) if t not in STOP]
            for tok in toks + [a + "_" + b for a, b in pairwise(toks)]:
                j, sign = self._bucket(tok)
                out[i, j] += sign
        return _normalize(out)


class SemanticEmbedder:
    """Adapts a sentence-embedding function (e.g. `SemanticRanker(...).embed`) to the store's interface."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray], name: str, dim: int | None = None):
        self._embed = embed
        self.name = name
        self._dim = dim

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return _normalize(np.asarray(self._embed(list(texts)), dtype=np.float32))

    @classmethod
    def from_ranker(cls, ranker, cards: Sequence = ()) -> SemanticEmbedder:
        """From a SemanticRanker: named after its model folder and precision, so a changed model (or an int8 graph
        after a float32 one) re-embeds the store. Cards are read up to the model's own length (as the ranker reads
        them), and the vectors the ranker already has for `cards` are reused, not computed again."""
        from .embedding import DOCUMENT_TOKENS

        ranker.load()  # first: the graph that really makes the vectors (int8 falls back to fp32 on failure)
        known = {}
        for card in cards:
            vector = ranker.card_vector(card)
            if vector is not None:
                known[card.text()] = vector

        def embed(texts: list[str]) -> np.ndarray:
            missing = list(dict.fromkeys(t for t in texts if t not in known))
            fresh = dict(zip(missing, ranker.embed(missing, max_tokens=DOCUMENT_TOKENS), strict=True)) if missing \
                else {}
            return np.stack([known[t] if t in known else fresh[t] for t in texts])

        precision = ranker.precision
        return cls(embed, name=f"st:{ranker.model_path.name}" + ("" if precision == "fp32" else f":{precision}"))


def default_embedder(semantic: bool = True, cache_dir=None, precision: str = "int8") -> Embedder:
    """The sentence model when `semantic` and it is installed, else the hashed bag of words."""
    if semantic:
        from .semantic import SemanticRanker, default_model_path

        path = default_model_path()
        if path is not None and path.exists():
            return SemanticEmbedder.from_ranker(SemanticRanker(path, cache_dir, precision=precision))
    return HashEmbedder()
