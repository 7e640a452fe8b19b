"""The model catalog: which models can do a task, and how they are ranked for a request.

`cards` holds the curated catalog and the keyword ranker (always available); `embedding` and `semantic` layer
sentence embeddings on top when their model is installed. `store` keeps the Hub's models (filled by `sync`
through `hub_api`) with their vectors, `scoring` weighs meaning, popularity, size, latency, availability and
`health` (every model run, kept across restarts).
"""

from .cards import (
    Catalog,
    KeywordRanker,
    ModelCard,
    PopularityRanker,
    Ranker,
    RankQuery,
    card_from_row,
    dump_rows,
    language_fit,
    languages_in,
    popularity,
    words,
)

__all__ = ["Catalog", "KeywordRanker", "ModelCard", "PopularityRanker", "Ranker", "RankQuery", "card_from_row",
           "dump_rows", "language_fit", "languages_in", "popularity", "words"]
