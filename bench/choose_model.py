"""How often each `choose_model` setting picks the expected model, on the ranking cases of tests/test_ranking.py.

The semantic ranker (all-MiniLM-L6-v2) ranks the catalog for each case. `ranking` takes the top model;
`auto` takes it when it leads the next by at least the margin and asks the LLM otherwise; `llm` always asks.
The margin is tuned on the even-numbered cases (the smallest margin at which every case decided without the
LLM is right) and reported on the odd-numbered, held-out ones. With --config the LLM of that config really
chooses for `llm` and for the cases `auto` defers; without it those choices are reported as not measured.

    python bench/choose_model.py [--config configs/config.local.yaml] [--store]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hugginggpt.catalog import Catalog, RankQuery  # noqa: E402
from hugginggpt.catalog.semantic import SemanticRanker  # noqa: E402
from tests.test_ranking import CASES  # noqa: E402

CANDIDATES = 5
CHOICE_TOKENS = 200  # a choice is a short JSON object; a base model left alone talks until its context is full


def rank_cases(ranker, catalog, store=None) -> list[dict]:
    """store: rank through the catalog store, as the server does once it is warm (the factors and weights of
    catalog/scoring.py over the curated rows), instead of the semantic ranker over the catalog in memory."""
    rows = []
    for task, text, expected in CASES:
        query = RankQuery(task=task, text=text)
        if store is not None:
            ranked = [(c.card, c.score) for c in store.search(task, text, limit=CANDIDATES,
                                                                query_vector=ranker.query_vectors([query])[0])]
        else:
            ranked = catalog.ranked(query, ranker, CANDIDATES)  # as select.py asks
        rows.append({"task": task, "text": text, "expected": expected, "ids": [c.id for c, _ in ranked],
                     "lead": ranked[0][1] - ranked[1][1] if len(ranked) > 1 else 1.0})
    return rows


def tune_margin(rows: list[dict]) -> float:
    """The smallest lead above which the top-ranked model was always right (on these rows)."""
    wrong = [r["lead"] for r in rows if r["ids"][0] not in r["expected"]]
    return max(wrong, default=0.0) + 1e-6


def llm_choice(config_path: str | None):
    if not config_path:
        return None
    from hugginggpt.config import load_config
    from hugginggpt.llm import LLMClient
    from hugginggpt.prompts import PromptSet
    from hugginggpt.select import parse_choice

    config = load_config(config_path)
    llm, prompts = LLMClient(config.llm), PromptSet.from_config(config)
    catalog = Catalog.load(config.catalog_path)

    def choose(row: dict) -> str | None:
        metas = [catalog.get(i).meta(config.max_description_length, "local") for i in row["ids"]]
        reply = llm.chat(prompts.choose_model(row["text"], {"task": row["task"], "id": 0, "dep": [-1],
                                                            "args": {"text": row["text"]}}, metas),
                         max_tokens=CHOICE_TOKENS)
        return parse_choice(reply, row["ids"])[0]

    return choose


def main(config_path: str | None, through_store: bool = False) -> None:
    from hugginggpt.config import Config

    catalog = Catalog.load(ROOT / "data" / "p0_models.jsonl")
    ranker = SemanticRanker.create(ROOT / ".cache", catalog=catalog.cards)
    store = None
    if through_store:
        import tempfile

        from hugginggpt.catalog.embedders import SemanticEmbedder
        from hugginggpt.catalog.store import CatalogStore

        ranker.warm(catalog.cards)
        store = CatalogStore.open(Path(tempfile.mkdtemp(prefix="choose-store-")) / "catalog.sqlite",
                                  SemanticEmbedder.from_ranker(ranker, catalog.cards), curated=catalog.path)
        print("ranking through the catalog store (as the server does once warm)")
    rows = rank_cases(ranker, catalog, store)
    tune, held = rows[0::2], rows[1::2]
    margin = tune_margin(tune)
    choose = llm_choice(config_path)
    picks = {id(r): choose(r) for r in held} if choose else {}  # one LLM call per held-out case, reused
    print(f"{len(rows)} cases; margin tuned on {len(tune)} even cases: {margin:.3f}; reported on {len(held)} held-out")
    print("| setting | LLM calls | right (held-out) |")
    print("|---|---|---|")
    top_right = sum(r["ids"][0] in r["expected"] for r in held)
    print(f"| ranking | 0/{len(held)} | {top_right}/{len(held)} |")
    shipped = Config.__dataclass_fields__["choose_model_margin"].default
    settings = [(f"auto (tuned margin {margin:.3f})", margin), (f"auto (shipped margin {shipped})", shipped)]
    settings += [(f"auto (margin {m})", m) for m in (0.02, 0.05) if m != shipped]
    for label, m in settings:
        decided = [r for r in held if r["lead"] >= m]
        deferred = [r for r in held if r["lead"] < m]
        right = sum(r["ids"][0] in r["expected"] for r in decided)
        if choose:
            text = f"{right + sum(picks[id(r)] in r['expected'] for r in deferred)}/{len(held)}"
        else:
            text = f"{right}/{len(decided)} decided by the ranking; {len(deferred)} need the LLM (not measured)"
        print(f"| {label} | {len(deferred)}/{len(held)} | {text} |")
    if choose:
        right = sum(picks[id(r)] in r["expected"] for r in held)
        invalid = sum(picks[id(r)] is None for r in held)
        first = sum(picks[id(r)] == r["ids"][0] for r in held)
        print(f"| llm | {len(held)}/{len(held)} | {right}/{len(held)} |")
        print(f"(llm: {invalid} replies named no candidate, {first} picked the first-listed, top-ranked one)")
    else:
        print(f"| llm | {len(held)}/{len(held)} | not measured: pass --config with an LLM that can choose |")
    print(f"(all {len(rows)} cases: ranking top-1 {sum(r['ids'][0] in r['expected'] for r in rows)}/{len(rows)}; "
          f"at the shipped margin {shipped} `auto` asks the LLM in {sum(r['lead'] < shipped for r in rows)}, "
          f"and the top-ranked model is wrong in {sum(r['ids'][0] not in r['expected'] for r in rows if r['lead'] < shipped)}"
          f" of those; it is wrong in {sum(r['ids'][0] not in r['expected'] for r in rows if r['lead'] >= shipped)} "
          "of the cases it decides alone)")
    print("leads of the wrong top-ranked picks:", ", ".join(f"{r['lead']:.4f}" for r in rows if r["ids"][0] not in r["expected"]),
          "| smallest leads of right ones:", ", ".join(f"{x:.4f}" for x in sorted(r["lead"] for r in rows
                                                                              if r["ids"][0] in r["expected"])[:3]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="let this config's LLM choose where a setting asks the LLM")
    parser.add_argument("--store", action="store_true", help="rank through the catalog store, as the server does")
    args = parser.parse_args()
    main(args.config, args.store)
