"""The ranking the server uses once warm, built as the server builds it, for the benches that time it in process.

Not a bench itself: `bench/load.py` (ranking CPU per task) and `bench/call_costs.py` (a store search, a query
embedding) both need the shipped config's ranker, warmed, and a catalog store holding the curated catalog.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ShippedRanking:
    config: Any  # hugginggpt.config.Config of configs/config.default.yaml
    catalog: Any  # the curated catalog
    ranker: Any  # SemanticRanker (warm), or KeywordRanker with keyword=True
    store: Any  # CatalogStore in `folder`, the curated rows imported


def shipped_ranking(folder: Path, keyword: bool = False) -> ShippedRanking:
    from hugginggpt.catalog import Catalog, KeywordRanker
    from hugginggpt.catalog.embedders import SemanticEmbedder
    from hugginggpt.catalog.semantic import SemanticRanker
    from hugginggpt.catalog.store import CatalogStore
    from hugginggpt.config import load_config

    config = load_config(ROOT / "configs" / "config.default.yaml", env={"OPENAI_API_KEY": "x"}, need_llm=False)
    catalog = Catalog.load(config.catalog_path)
    ranker = KeywordRanker() if keyword else SemanticRanker.create(ROOT / ".cache", catalog=catalog.cards)
    if hasattr(ranker, "warm"):
        ranker.warm(catalog.cards)
        ranker.load()
    embedder = SemanticEmbedder.from_ranker(ranker, catalog.cards) if hasattr(ranker, "card_vector") else None
    store = CatalogStore.open(Path(folder) / "catalog.sqlite", embedder, curated=config.catalog_path)
    return ShippedRanking(config, catalog, ranker, store)
