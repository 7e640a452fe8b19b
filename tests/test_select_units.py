"""Edge cases of hugginggpt/select.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from hugginggpt import cancel
from hugginggpt.backends import ModelStatus
from hugginggpt.catalog import Catalog, KeywordRanker, ModelCard, RankQuery
from hugginggpt.catalog.scoring import Factors
from hugginggpt.catalog.store import CatalogStore
from hugginggpt.errors import LLMError
from hugginggpt.plan import Task
from hugginggpt.select import (
    LLM_MODEL_ID,
    Availability,
    Question,
    Selection,
    Selector,
    control_task_fixup,
    is_reference,
    parse_choice,
)

# ---------------------------------------------------------------------------------------------- helpers


class Backend:
    """Status answers from a set of served ids; every question recorded."""

    def __init__(self, name="local", serves=None, broken=()):
        self.name = name
        self.serves = serves  # None: everything
        self.broken = set(broken)
        self.asked: list[str] = []
        self.tokens: list = []

    def is_available(self, model_id: str) -> bool:
        self.asked.append(model_id)
        self.tokens.append(cancel.CURRENT.get())
        if model_id in self.broken:
            raise RuntimeError("status check broke")
        return self.serves is None or model_id in self.serves


class Scores:
    """A ranker with fixed scores per model id (the cards' order otherwise kept)."""

    def __init__(self, scores: dict[str, float]):
        self.scores = scores
        self.queries: list[RankQuery] = []

    def rank(self, query, cards):
        self.queries.append(query)
        return sorted(((c, self.scores.get(c.id, 0.0)) for c in cards), key=lambda cs: -cs[1])


class Prompts:
    def choose_model(self, user_input, task, metas):
        return [{"role": "user", "content": json.dumps({"input": user_input, "task": task, "metas": metas})}]


class LLM:
    def __init__(self, reply="", error=None):
        self.reply, self.error = reply, error
        self.calls: list[tuple[list, float]] = []

    def chat(self, messages, logit_bias_weight=0.0, max_tokens=None):
        self.calls.append((messages, logit_bias_weight))
        self.max_tokens = max_tokens
        if self.error is not None:
            raise self.error
        return self.reply


def cards(*ids, task="image-classification"):
    return [ModelCard(id=i, task=task, description=f"model {i}") for i in ids]


def selector(card_list=None, scores=None, backends=None, **kw) -> Selector:
    card_list = card_list if card_list is not None else cards("org/a", "org/b", "org/c")
    kw.setdefault("inference_mode", "local")
    kw.setdefault("num_candidates", 3)
    kw.setdefault("max_description_length", 100)
    return Selector(catalog=Catalog(card_list), ranker=Scores(scores or {}) if scores is not None else KeywordRanker(),
                    availability=Availability(backends or {"local": Backend()}), prompts=Prompts(), **kw)


def task(name="image-classification", tid=0, **args) -> Task:
    return Task(task=name, id=tid, dep=[-1], args=args)


# ---------------------------------------------------------------------------------------------- plain helpers


@pytest.mark.parametrize("value", ["<GENERATED>-1", "http://x/a.png", "https://x/a.png", "data:image/png;base64,AA",
                                   "/examples/a.jpg", "  /examples/a.jpg  ", "/a" + "b" * 300 + " c",
                                   "/" + "b" * 199 + " c"])  # only the first 200 characters are read for a space
def test_a_resource_is_a_reference(value):
    assert is_reference(value)


@pytest.mark.parametrize("value", ["a photo of a cat", "/examples/my photo.jpg", "ftp://x", "cat.png", "",
                                   "https://x/a b.png", "GENERATED-1",
                                   "/" + "b" * 198 + " c"])
def test_words_are_not_a_reference(value):
    assert not is_reference(value)


def test_without_llm_says_why_the_ranking_decided():
    sel = Selection(1, "t", "org/a", "local", "top-ranked candidate",
                    question=Question([("org/a", "local")], [], 0.00412))
    final = sel.without_llm("the task's inputs were ready")
    assert final.question is None and final.model_id == "org/a"
    assert final.reason == ("top-ranked for this request (0.004 ahead of the next candidate, below "
                            "choose_model_margin; the task's inputs were ready)")
    assert sel.question is not None  # the original is left as it was
    assert Selection(1, "t", "m", "local", "r").without_llm("why").reason == "top-ranked for this request (why)"
    llm_mode = Selection(1, "t", "m", "local", "r", question=Question([], [], None))
    assert llm_mode.without_llm("why").reason == "top-ranked for this request (why)"


def test_choose_is_jarvis_record():
    assert Selection(1, "t", "org/a", "local", "because").choose() == {"id": "org/a", "reason": "because"}
    assert Selection(1, "t", None, None, "", error="none").choose() == ""


def test_fallbacks_start_with_the_chosen_model():
    sel = Selection(1, "t", "org/b", "huggingface", "r",
                    available={"local": ["org/a", "org/b"], "huggingface": ["org/b", "org/c"], "other": ["x"]})
    assert sel.fallbacks() == [("org/b", "huggingface"), ("org/a", "local"), ("org/b", "local"),
                               ("org/c", "huggingface")]
    local = Selection(1, "t", "org/a", "local", "r", available={"local": ["org/a", "org/b"]})
    assert local.fallbacks() == [("org/a", "local"), ("org/b", "local")]
    by_llm = Selection(1, "t", LLM_MODEL_ID, "llm", "r")
    assert by_llm.fallbacks() == []
    assert Selection(1, "t", None, "local", "r", available={"huggingface": ["m"]}).fallbacks() == [("m", "huggingface")]


def test_control_tasks_without_text_are_their_annotators():
    for name, want in (("canny-text-to-image", "canny-control"), ("seg-text-to-image", "image-segmentation"),
                       ("depth-text-to-image", "depth-estimation"), ("openpose-text-to-image", "openpose-control")):
        t = task(name, image="/a.png")
        control_task_fixup(t)
        assert t.task == want
    for t in (task("canny-text-to-image", text="a cat", image="/a.png"), task("text-to-image", image="/a.png"),
              task("image-classification")):
        before = t.task
        control_task_fixup(t)
        assert t.task == before


# ---------------------------------------------------------------------------------------------- parse_choice


def test_parse_choice_reads_the_llms_json():
    cands = ["org/a", "org/b"]
    assert parse_choice('{"id": "org/b", "reason": "smaller"}', cands) == ("org/b", "smaller")
    assert parse_choice('[{"id": "org/a", "reason": "first"}, {"id": "org/b"}]', cands) == ("org/a", "first")
    assert parse_choice('{"model": "org/b"}', cands) == ("org/b", "chosen by the LLM")
    assert parse_choice('{"model_id": "org/a", "reason": ""}', cands) == ("org/a", "chosen by the LLM")
    assert parse_choice('Sure! ```json\n{"id": "org/a", "reason": "ok"}\n```', cands) == ("org/a", "ok")
    assert parse_choice('{"id": 7}', ["7"]) == ("7", "chosen by the LLM")


def test_parse_choice_reads_what_is_not_quite_json():
    cands = ["org/a", "org/b"]
    assert parse_choice("id: 'org/b', reason: 'it is best'", cands) == ("org/b", "it is best")
    assert parse_choice("I pick id = \"org/a\"", cands) == ("org/a", "chosen by the LLM")
    assert parse_choice("The best is org/b, clearly.", cands) == ("org/b", "chosen by the LLM")
    assert parse_choice('{"id": "org/zzz", "reason": "made up"}', cands) == (None, "made up")
    assert parse_choice("[]", cands) == (None, "chosen by the LLM")
    assert parse_choice('["org/a"]', cands) == ("org/a", "chosen by the LLM")  # not a dict: named in the text
    assert parse_choice("nothing", cands) == (None, "chosen by the LLM")


def test_parse_choice_takes_a_short_name_of_one_candidate():
    cands = ["Salesforce/blip-large", "nlpconnect/vit-gpt2"]
    assert parse_choice('{"id": "other/vit-gpt2", "reason": "r"}', cands) == ("nlpconnect/vit-gpt2", "r")
    assert parse_choice('{"id": "vit-gpt2"}', cands)[0] == "nlpconnect/vit-gpt2"
    assert parse_choice('{"id": "gpt2"}', cands)[0] is None
    # a candidate named in the text comes before one matched by its short name
    assert parse_choice('{"id": "x/vit-gpt2", "reason": "not Salesforce/blip-large"}', cands)[0] == \
        "Salesforce/blip-large"


# ---------------------------------------------------------------------------------------------- Availability


def test_availability_asks_each_backend_about_each_model_once():
    local, hosted = Backend("local", serves={"org/a"}), Backend("huggingface", serves={"org/a", "org/b"})
    av = Availability({"local": local, "huggingface": hosted}, ttl=30)
    assert av.check(["org/a", "org/b"], ["local", "huggingface", "nowhere"]) == {
        "local": ["org/a"], "huggingface": ["org/a", "org/b"], "nowhere": []}
    assert sorted(local.asked) == ["org/a", "org/b"] and sorted(hosted.asked) == ["org/a", "org/b"]
    assert av.check(["org/b", "org/a"], ["huggingface"]) == {"huggingface": ["org/b", "org/a"]}  # cached, in order
    assert len(hosted.asked) == 2
    assert av.backends == {"local": local, "huggingface": hosted} and av.ttl == 30


def test_a_broken_status_check_reads_not_available(caplog):
    backend = Backend(broken={"org/x"})
    av = Availability({"local": backend})
    with caplog.at_level(logging.WARNING, logger="hugginggpt.select"):
        assert av.check(["org/a", "org/x", "org/b"], ["local"]) == {"local": ["org/a", "org/b"]}
    assert [r.getMessage() for r in caplog.records] == ["status check of org/x on local failed"]


def test_a_status_answer_expires_after_the_ttl(monkeypatch):
    import hugginggpt.select as select_mod

    clock = [100.0]
    monkeypatch.setattr(select_mod.time, "monotonic", lambda: clock[0])
    backend = Backend()
    av = Availability({"local": backend}, ttl=10)
    av.check(["org/a"], ["local"])
    clock[0] = 109.9
    av.check(["org/a"], ["local"])
    assert backend.asked == ["org/a"]
    clock[0] = 110.0  # exactly ttl later: stale
    av.check(["org/a"], ["local"])
    assert backend.asked == ["org/a", "org/a"]
    assert av._check("local", "org/a") == ModelStatus(True) and backend.asked == ["org/a", "org/a"]  # fresh: from the cache


def test_a_status_check_is_not_cut_by_the_request_that_asked_first():
    backend = Backend()
    av = Availability({"local": backend})
    token = cancel.CancelToken()
    token.cancel()
    reset = cancel.CURRENT.set(token)
    try:
        assert av.check(["org/a"], ["local"]) == {"local": ["org/a"]}
    finally:
        cancel.CURRENT.reset(reset)
    assert backend.tokens == [None]


def full_status_cache(monkeypatch):
    """A cache of 3 entries, full: m1 and m2 asked at 100 s, m3 at 105 s (ttl 10 s); the clock is the test's."""
    import hugginggpt.select as select_mod

    clock = [100.0]
    monkeypatch.setattr(select_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(select_mod, "MAX_STATUS_ENTRIES", 3)
    backend = Backend()
    av = Availability({"local": backend}, ttl=10)
    av.check(["m1", "m2"], ["local"])
    clock[0] = 105.0
    av.check(["m3"], ["local"])
    return clock, backend, av


def test_the_status_cache_is_bounded(monkeypatch):
    clock, _, av = full_status_cache(monkeypatch)
    clock[0] = 111.0  # m1 and m2 expired, m3 not
    av.check(["m4"], ["local"])  # full: the expired ones go
    assert set(av._cache) == {("local", "m3"), ("local", "m4")}
    av.check(["m5"], ["local"])
    assert len(av._cache) == 3
    av.check(["m6"], ["local"])  # full of fresh answers: all go
    assert set(av._cache) == {("local", "m6")}


def test_a_full_status_cache_drops_the_answers_expiring_right_now(monkeypatch):
    clock, backend, av = full_status_cache(monkeypatch)
    clock[0] = 110.0  # m1 and m2 expire now: they go, and the fresh m3 stays
    av.check(["m4"], ["local"])
    av.check(["m3"], ["local"])
    assert backend.asked.count("m3") == 1


def test_a_status_answer_is_cached_for_a_fraction_of_a_second(monkeypatch):
    import hugginggpt.select as select_mod

    clock = [100.0]
    monkeypatch.setattr(select_mod.time, "monotonic", lambda: clock[0])
    backend = Backend()
    av = Availability({"local": backend}, ttl=0.5)
    av.check(["org/a"], ["local"])
    clock[0] = 100.4
    av.check(["org/a"], ["local"])
    assert backend.asked == ["org/a"]
    clock[0] = 100.5
    av.check(["org/a"], ["local"])
    assert backend.asked == ["org/a", "org/a"]


def test_without_a_ttl_nothing_is_cached():
    backend = Backend()
    av = Availability({"local": backend}, ttl=0)
    av.check(["org/a"], ["local"])
    av.check(["org/a"], ["local"])
    assert backend.asked == ["org/a", "org/a"] and av._cache == {}


# ---------------------------------------------------------------------------------------------- Selector basics


def test_permitted_models():
    s = selector(allowed=("org/*", "x/one"), denied=("org/secret*",))
    assert s.permitted("org/a") and s.permitted("x/one")
    assert not s.permitted("org/secret-model") and not s.permitted("x/two") and not s.permitted("ORG/a")
    assert selector().permitted("anything/at-all")
    assert not selector(denied=("*",)).permitted("org/a")


def test_backends_in_order():
    assert selector(inference_mode="local").backends_in_order() == ["local"]
    assert selector(inference_mode="huggingface").backends_in_order() == ["huggingface"]
    assert selector(inference_mode="hybrid").backends_in_order() == ["local", "huggingface"]


def test_the_query_is_the_request_after_its_new_words():
    s = selector(language="de", max_size_mb=500.0)
    t = task(text="Anna lives in Berlin", image="/examples/a.jpg", audio="<GENERATED>-1", video="v",
             extra="https://x/y.png", other="A CAT")
    q = s.query("Find the names. A cat too.", t)
    assert q == RankQuery(task="image-classification", text="Anna lives in Berlin Find the names. A cat too.",
                          language="de", max_size_mb=500.0)
    assert s.query("x", task(text="words")).text == "words x"


def test_which_tasks_need_ranking():
    s = selector()
    assert s.needs_ranking(task("image-classification"))
    for name in ("canny-text-to-image", "openpose-control", "summarization", "translation", "conversational",
                 "text-generation", "text2text-generation"):
        assert not s.needs_ranking(task(name)), name
    assert not s.needs_ranking(Task(task="image-classification", id=0, dep=[-1], args={}, error="bad plan"))


def test_prepare_embeds_the_ranked_tasks_queries_at_once(caplog):
    s = selector()
    seen = []
    s.ranker.prepare = seen.append
    s.prepare("draw and name", [task(text="a"), task("summarization", text="b"), task("token-classification")])
    assert [[q.task for q in batch] for batch in seen] == [["image-classification", "token-classification"]]

    def broken(queries):
        raise RuntimeError("boom")

    s.ranker.prepare = broken
    with caplog.at_level(logging.ERROR, logger="hugginggpt.select"):
        s.prepare("x", [task()])  # each select embeds its own query then
    assert [r.getMessage() for r in caplog.records] == ["embedding the request's ranking queries failed"]
    selector().prepare("x", [task()])  # a ranker without `prepare`: nothing to do


def test_candidates_from_the_catalog_best_first():
    s = selector(scores={"org/a": 0.1, "org/b": 0.9, "org/c": 0.5, "org/d": 0.7},
                 card_list=cards("org/a", "org/b", "org/c", "org/d"))
    found = s.candidates("x", task())
    assert [(c.card.id, c.score) for c in found] == [("org/b", 0.9), ("org/d", 0.7), ("org/c", 0.5), ("org/a", 0.1)]
    assert found[0].factors == Factors(meaning=0.9)
    assert [c.card.id for c in s.candidates("x", task(), exclude=["org/b"])] == ["org/d", "org/c", "org/a"]
    assert s.rank("x", task()) == [(c.card, c.score) for c in found]


def test_candidates_are_limited_to_twice_the_candidate_count_and_at_least_ten():
    many = cards(*[f"org/m{i:02d}" for i in range(30)])
    scores = {c.id: 1.0 - i / 100 for i, c in enumerate(many)}
    assert len(selector(many, scores, num_candidates=3).candidates("x", task())) == 10
    assert len(selector(many, scores, num_candidates=6).candidates("x", task())) == 12
    assert len(selector(many, scores, num_candidates=20).candidates("x", task())) == 30


def test_denied_models_are_searched_past():
    many = cards(*[f"bad/m{i:02d}" for i in range(35)], "good/one", "good/two")
    scores = {c.id: 1.0 - i / 100 for i, c in enumerate(many)}
    s = selector(many, scores, denied=("bad/*",))
    assert [c.card.id for c in s.candidates("x", task())] == ["good/one", "good/two"]
    calls = []
    real = s.catalog.ranked
    s.catalog.ranked = lambda q, r, limit: (calls.append(limit), real(q, r, limit))[1]
    s.candidates("x", task())
    assert calls == [10, 30, 70]  # 10, then 20 more past the 10 seen, then 40 more past the 30 seen


def test_the_permit_search_stops_when_the_catalog_has_no_more():
    many = cards(*[f"bad/m{i:02d}" for i in range(12)])
    s = selector(many, {c.id: 1.0 for c in many}, denied=("bad/*",))
    calls = []
    real = s.catalog.ranked
    s.catalog.ranked = lambda q, r, limit: (calls.append(limit), real(q, r, limit))[1]
    assert s.candidates("x", task()) == []
    assert calls == [10, 30]  # the second search found fewer rows than it asked for: no third


def test_the_permit_search_gives_up_after_eight_rounds():
    many = cards(*[f"bad/m{i:04d}" for i in range(3000)])
    s = selector(many, {c.id: 1.0 for c in many}, denied=("bad/*",))
    calls = []
    real = s.catalog.ranked
    s.catalog.ranked = lambda q, r, limit: (calls.append(limit), real(q, r, limit))[1]
    assert s.candidates("x", task()) == []
    assert len(calls) == 8


def test_the_permit_search_stops_once_it_has_enough():
    many = cards(*[f"org/m{i:02d}" for i in range(15)])
    s = selector(many, {c.id: 1.0 - i / 100 for i, c in enumerate(many)})
    calls = []
    real = s.catalog.ranked
    s.catalog.ranked = lambda q, r, limit: (calls.append(limit), real(q, r, limit))[1]
    assert [c.card.id for c in s.candidates("x", task())] == [f"org/m{i:02d}" for i in range(10)]
    assert calls == [10]  # exactly the 10 wanted: no second search


def test_the_permit_search_keeps_what_each_round_found():
    many = cards("good/one", *[f"bad/m{i:02d}" for i in range(12)], "good/two")
    s = selector(many, {c.id: 1.0 - i / 100 for i, c in enumerate(many)}, denied=("bad/*",))
    assert [c.card.id for c in s.candidates("x", task())] == ["good/one", "good/two"]


# ---------------------------------------------------------------------------------------------- with a store


@pytest.fixture
def store(tmp_path):
    s = CatalogStore(tmp_path / "c.sqlite", None)
    s.upsert([{"id": "org/cat-photo", "task": "image-classification", "description": "cat photo classifier",
               "downloads": 10},
              {"id": "org/dog", "task": "image-classification", "description": "dog classifier", "downloads": 5},
              {"id": "org/ner", "task": "token-classification", "description": "names in text", "downloads": 1}])
    yield s
    s.close()


def test_candidates_from_the_store(store):
    s = selector()
    s.use_store(store)
    assert s.store is store
    found = s.candidates("a cat photo", task())
    assert [c.card.id for c in found] == ["org/cat-photo", "org/dog"]
    assert found[0].reason  # the store says why
    assert [c.card.id for c in s.candidates("a cat photo", task(), exclude=["org/cat-photo"])] == ["org/dog"]
    assert s.tasks() == ["image-classification", "token-classification"]
    s.use_store(None)
    assert s.tasks() == ["image-classification"]


def test_a_store_search_gets_the_query_the_ranker_embedded(store):
    import numpy as np

    s = selector(language="de", max_size_mb=100.0)
    asked = []

    def query_vectors(queries):
        asked.append(queries)
        return [np.zeros(3)]

    s.ranker.query_vectors = query_vectors
    s.use_store(store)
    seen = []
    real = store.search

    def search(*args, **kw):
        seen.append((args, kw))
        return real(*args, **{k: v for k, v in kw.items() if k != "query_vector"})

    store.search = search
    s.candidates("a cat photo", task(text="tabby"))
    (args, kw), = seen
    assert args == ("image-classification", "tabby a cat photo")
    assert kw["limit"] == 10 and kw["language"] == "de" and kw["max_size_mb"] == 100.0 and kw["exclude"] == set()
    assert kw["query_vector"].tolist() == [0.0, 0.0, 0.0]
    assert asked[0][0].text == "tabby a cat photo"


def test_browsing_the_catalog(store):
    s = selector()
    s.use_store(store)
    found = s.search(None, "cat photo names", limit=2)
    assert [m["id"] for m in found] == ["org/cat-photo", "org/ner"]
    assert set(found[0]) == {"id", "task", "downloads", "likes", "score", "reason"}
    assert found[0]["task"] == "image-classification" and found[0]["downloads"] == 10 and found[0]["likes"] == 0
    assert found[0]["score"] == round(found[0]["score"], 4) and found[0]["score"] > found[1]["score"]
    assert [m["id"] for m in s.search("token-classification", "x", limit=5)] == ["org/ner"]
    assert len(s.search(None, "classifier", limit=1)) == 1


# ---------------------------------------------------------------------------------------------- _select


def test_controlnet_tasks_run_locally():
    local = Backend("local", serves={"lllyasviel/sd-controlnet-canny", "canny-control"})
    s = selector(backends={"local": local}, inference_mode="hybrid")
    sel = s.by_ranking("x", task("canny-text-to-image", 3, text="a cat", image="/a.png"))
    assert (sel.task_id, sel.task, sel.model_id, sel.hosted_on, sel.available, sel.error) == (
        3, "canny-text-to-image", "lllyasviel/sd-controlnet-canny", "local",
        {"local": ["lllyasviel/sd-controlnet-canny"]}, None)
    assert sel.reason == "ControlNet is the best model for this task."
    assert s.by_ranking("x", task("canny-control", image="/a.png")).model_id == "canny-control"
    missing = s.by_ranking("x", task("hed-text-to-image", text="a", image="/a.png"))
    assert missing.model_id is None and missing.available == {"local": []} and missing.reason == ""
    assert missing.error == ("the local models server cannot serve lllyasviel/sd-controlnet-hed (its /status says so: "
                             "the weights are missing or the deployment level does not include it)")


def test_controlnet_needs_the_local_server_and_permission():
    hosted = selector(inference_mode="huggingface")
    sel = hosted.by_ranking("x", task("canny-text-to-image", text="a", image="/a.png"))
    assert sel.model_id is None and sel.hosted_on is None and sel.reason == ""
    assert sel.error == "ControlNet tasks need the local models server (inference_mode local or hybrid)"
    denied = selector(denied=("lllyasviel/*",))
    sel = denied.by_ranking("x", task("canny-text-to-image", text="a", image="/a.png"))
    assert sel.error == "lllyasviel/sd-controlnet-canny is not permitted here (allowed_models / denied_models)"
    assert (sel.model_id, sel.hosted_on, sel.reason) == (None, None, "")


def test_text_tasks_are_the_llms():
    sel = selector().by_ranking("x", task("summarization", 2, text="long"))
    assert (sel.task_id, sel.model_id, sel.hosted_on, sel.reason) == (
        2, LLM_MODEL_ID, "llm", "The LLM performs well on this text task itself.")


def test_no_candidates():
    sel = selector().by_ranking("x", task("object-detection", 4))
    assert (sel.task_id, sel.task, sel.model_id, sel.hosted_on, sel.reason) == (4, "object-detection", None, None, "")
    assert sel.error == "no model in the catalog does object-detection"
    sel = selector(denied=("org/*",)).by_ranking("x", task())
    assert sel.error == ("no model in the catalog does image-classification among those allowed_models / "
                         "denied_models permit")
    assert "permit" in selector(allowed=("nobody/*",)).by_ranking("x", task()).error


def test_no_available_candidates_says_where_it_looked():
    none = Backend("local", serves=set())
    sel = selector(backends={"local": none, "huggingface": Backend("huggingface", serves=set())},
                   inference_mode="hybrid").by_ranking("x", task())
    assert sel.model_id is None and sel.available == {"local": [], "huggingface": []} and sel.reason == ""
    assert sel.error == ("no available model for image-classification on the local models server or hosted "
                         "inference")
    sel = selector(backends={"huggingface": Backend("huggingface", serves=set())},
                   inference_mode="huggingface").by_ranking("x", task())
    assert sel.error == "no available model for image-classification on hosted inference"


def test_only_one_available_model():
    sel = selector(backends={"local": Backend(serves={"org/b"})}).by_ranking("x", task(tid=5))
    assert (sel.task_id, sel.model_id, sel.hosted_on, sel.reason, sel.available, sel.question) == (
        5, "org/b", "local", "Only one model available.", {"local": ["org/b"]}, None)


def test_kept_candidates_are_local_first_up_to_the_count():
    local = Backend("local", serves={"org/c"})
    hosted = Backend("huggingface", serves={"org/a", "org/b", "org/c"})
    s = selector(scores={"org/a": 0.9, "org/b": 0.5, "org/c": 0.1}, backends={"local": local, "huggingface": hosted},
                 inference_mode="hybrid", num_candidates=2, choose="llm")
    sel = s.by_ranking("x", task())
    assert sel.question.kept == [("org/c", "local"), ("org/a", "huggingface")]
    assert sel.available == {"local": ["org/c"], "huggingface": ["org/a"]}
    assert (sel.model_id, sel.hosted_on) == ("org/c", "local")


def test_a_clear_lead_is_chosen_without_the_llm():
    s = selector(scores={"org/a": 0.9, "org/b": 0.5, "org/c": 0.1}, margin=0.4)
    sel = s.by_ranking("x", task())
    assert sel.question is None and sel.model_id == "org/a" and sel.hosted_on == "local"
    assert sel.reason == "top-ranked for this request (0.40 ahead of the next candidate); chosen without asking the LLM"
    assert sel.available == {"local": ["org/a", "org/b", "org/c"]}
    s.margin = 0.41
    assert s.by_ranking("x", task()).question.lead == pytest.approx(0.4)
    s.choose = "ranking"
    assert s.by_ranking("x", task()).question is None


def test_the_reason_names_the_stores_deciding_factors(store):
    s = selector(margin=0.0)
    s.use_store(store)
    sel = s.by_ranking("a cat photo", task())
    assert sel.model_id == "org/cat-photo"
    assert sel.reason.startswith("top-ranked for this request (") and ": meaning +" in sel.reason


def test_a_close_call_asks_the_llm_with_the_candidates_cards():
    s = selector(scores={"org/a": 0.5, "org/b": 0.495, "org/c": 0.1}, max_description_length=5)
    sel = s.by_ranking("x", task())
    assert sel.model_id == "org/a" and sel.reason == "top-ranked candidate" and sel.hosted_on == "local"
    q = sel.question
    assert q.kept == [("org/a", "local"), ("org/b", "local"), ("org/c", "local")] and q.lead == pytest.approx(0.005)
    assert q.metas[0] == {"id": "org/a", "inference endpoint": "local", "likes": 0, "description": "model",
                          "tags": [], "language": []}
    llm_mode = selector(scores={"org/a": 0.9, "org/b": 0.1}, choose="llm")
    assert llm_mode.by_ranking("x", task()).question.lead is None


# ---------------------------------------------------------------------------------------------- the LLM's choice


def close_call(**kw):
    return selector(scores={"org/a": 0.5, "org/b": 0.495}, card_list=cards("org/a", "org/b"), **kw)


def test_the_llms_valid_choice_is_taken():
    s = close_call()
    llm = LLM('{"id": "org/b", "reason": "better fit"}')
    sel = s.select("draw", task(text="t"), llm, logit_bias=0.2)
    assert (sel.model_id, sel.hosted_on, sel.reason, sel.question) == ("org/b", "local", "better fit", None)
    assert sel.seconds > 0
    (messages, bias), = llm.calls
    assert bias == 0.2
    sent = json.loads(messages[0]["content"])
    assert sent["input"] == "draw" and sent["task"] == task(text="t").to_dict()
    assert [m["id"] for m in sent["metas"]] == ["org/a", "org/b"]


def test_the_llms_choice_keeps_its_backend():
    s = selector(scores={"org/a": 0.5, "org/b": 0.495}, card_list=cards("org/a", "org/b"), inference_mode="hybrid",
                 backends={"local": Backend(serves={"org/a"}), "huggingface": Backend("huggingface")})
    sel = s.select("x", task(), LLM('{"id": "org/b"}'))
    assert (sel.model_id, sel.hosted_on) == ("org/b", "huggingface")


def test_an_unusable_llm_answer_keeps_the_ranking_pick():
    sel = close_call().select("x", task(), LLM('{"id": "made/up"}'))
    assert sel.model_id == "org/a" and sel.question is None
    assert sel.reason == "top-ranked candidate (the LLM's choice was not one of the candidates)"
    sel = close_call().select("x", task(), LLM(error=LLMError("rate limited")))
    assert sel.model_id == "org/a"
    assert sel.reason == "top-ranked candidate (the LLM could not choose: rate limited)"


def test_other_llm_failures_are_not_swallowed():
    with pytest.raises(RuntimeError):
        close_call().select("x", task(), LLM(error=RuntimeError("bug")))


def test_ask_llm_without_a_question_is_the_pick():
    pick = Selection(0, "t", "org/a", "local", "r")
    llm = LLM("{}")
    assert selector().ask_llm(pick, "x", task(), llm) is pick and llm.calls == []


def test_a_decided_selection_does_not_ask():
    llm = LLM("{}")
    sel = selector(scores={"org/a": 0.9, "org/b": 0.1}).select("x", task(), llm)
    assert sel.model_id == "org/a" and llm.calls == []
    sel = selector().select("x", task("summarization"), llm)
    assert sel.model_id == LLM_MODEL_ID and llm.calls == []


def test_by_ranking_times_the_choice(monkeypatch):
    import hugginggpt.select as select_mod

    ticks = iter([10.0, 12.5])
    monkeypatch.setattr(select_mod.time, "perf_counter", lambda: next(ticks))
    assert selector().by_ranking("x", task("summarization")).seconds == 2.5
    ticks = iter([1.0, 1.5, 2.0, 4.0])  # select: start, by_ranking start/end, end
    monkeypatch.setattr(select_mod.time, "perf_counter", lambda: next(ticks))
    assert selector().select("x", task("summarization"), LLM()).seconds == 3.0


def test_a_selector_keeps_its_settings():
    s = selector(language="fr", max_size_mb=10.0, choose="llm", margin=0.2, allowed=("a/*",), denied=("b/*",))
    assert (s.language, s.max_size_mb, s.choose, s.margin, s.allowed, s.denied, s.store) == (
        "fr", 10.0, "llm", 0.2, ("a/*",), ("b/*",), None)
    assert (s.inference_mode, s.num_candidates, s.max_description_length) == ("local", 3, 100)
    default = Selector(catalog=Catalog([]), ranker=KeywordRanker(), availability=Availability({}), prompts=None,
                       inference_mode="local", num_candidates=1, max_description_length=1)
    assert (default.choose, default.margin, default.language, default.max_size_mb, default.allowed,
            default.denied) == ("auto", 0.01, None, None, (), ())


def test_status_checks_run_in_parallel():
    gate = threading.Barrier(2, timeout=5)

    class Slow(Backend):
        def is_available(self, model_id):
            gate.wait()  # both checks must be in flight at once
            return True

    av = Availability({"local": Slow()})
    start = time.monotonic()
    assert av.check(["org/a", "org/b"], ["local"]) == {"local": ["org/a", "org/b"]}
    assert time.monotonic() - start < 5


def test_at_most_sixteen_status_checks_run_at_once():
    busy = threading.Condition()
    running, most, release = [0], [0], threading.Event()

    class Held(Backend):
        def is_available(self, model_id):
            with busy:
                running[0] += 1
                most[0] = max(most[0], running[0])
                busy.notify_all()
            release.wait(5)
            with busy:
                running[0] -= 1
            return True

    av = Availability({"local": Held()})
    ids = [f"org/m{i:02d}" for i in range(20)]
    answers = []
    asking = threading.Thread(target=lambda: answers.append(av.check(ids, ["local"])), daemon=True)
    asking.start()
    try:
        with busy:
            assert busy.wait_for(lambda: running[0] >= 16, timeout=5)  # sixteen in flight at once
            assert not busy.wait_for(lambda: running[0] > 16, timeout=0.3)  # and never more
    finally:
        release.set()
        asking.join(5)
    assert most[0] == 16 and answers == [{"local": ids}]


# ---------------------------------------------------------------------------------------------- choose.py


def request_state(timeout=30.0, content="draw a fox"):
    from hugginggpt.request import ChatRequest, RequestState

    events: list[tuple[str, dict]] = []
    state = RequestState(ChatRequest(messages=[{"role": "user", "content": content}], request_id="req1"),
                         None, lambda name, payload: events.append((name, payload)), timeout=timeout)  # type: ignore[arg-type]
    return state, events


def pick(t: Task, model="org/a", lead=0.001, reason="top-ranked candidate") -> Selection:
    return Selection(t.id, t.task, model, "local", reason, available={"local": [model, "org/b"]},
                     question=Question([(model, "local"), ("org/b", "local")], [], lead))


class FakeSelector:
    """What choose.py uses of a Selector; the LLM's answer is `llm_pick` (or `llm_error`), after `llm_wait`."""

    def __init__(self, choose="auto", ranked=None, llm_pick="org/b", llm_wait=None, llm_error=None, rank_error=None):
        self.choose = choose
        self.ranked = ranked  # task -> Selection
        self.llm_pick, self.llm_wait, self.llm_error, self.rank_error = llm_pick, llm_wait, llm_error, rank_error
        self.prepared: list = []
        self.asked: list = []
        self.ranked_for: list = []

    def prepare(self, user_input, tasks):
        self.prepared.append((user_input, [t.id for t in tasks]))

    def by_ranking(self, user_input, t, failed):
        self.ranked_for.append((user_input, t, failed))
        if self.rank_error is not None:
            raise self.rank_error
        return self.ranked(t) if self.ranked else pick(t)

    def ask_llm(self, sel, user_input, t, llm, logit_bias):
        from dataclasses import replace

        self.asked.append((sel.model_id, user_input, t.id, logit_bias))
        if self.llm_wait is not None:
            self.llm_wait.wait(5)
        if self.llm_error is not None:
            raise self.llm_error
        return replace(sel, model_id=self.llm_pick, reason="the LLM's pick", question=None)


class Inline:
    """An Executor that runs each call at once, on the caller's thread."""

    def submit(self, fn, *args):
        fn(*args)


def test_a_choice_is_settled_once_and_announced_once():
    from hugginggpt.choose import Choice

    state, events = request_state()
    t = task("image-classification", 3)
    choice = Choice()
    first = Selection(3, t.task, "org/a", "local", "r", available={"local": ["org/a"]}, seconds=0.123456)
    assert choice.settle(state, t, first) is True
    assert choice.result() is first and choice.ranked.is_set()
    assert choice.settle(state, t, Selection(3, t.task, "org/b", "local", "later")) is False
    assert choice.fail(RuntimeError("late")) is False
    assert choice.result() is first
    (name, payload), = events
    assert name == "model_selected"
    assert {k: payload[k] for k in ("id", "task", "model", "hosted_on", "reason", "error", "candidates",
                                    "seconds")} == {"id": 3, "task": "image-classification", "model": "org/a",
                                                    "hosted_on": "local", "reason": "r", "error": None,
                                                    "candidates": {"local": ["org/a"]}, "seconds": 0.1235}


def test_a_failed_choice_hands_its_error_to_the_task():
    from hugginggpt.choose import Choice

    state, events = request_state()
    choice = Choice()
    assert choice.fail(ValueError("ranking broke")) is True
    assert choice.ranked.is_set() and isinstance(choice.exception(), ValueError)
    assert choice.fail(ValueError("again")) is False
    assert choice.settle(state, task(), pick(task())) is False and events == []
    assert state.selections.setdefault(0, choice) is choice
    sel = state.selection_of(task())
    assert sel.model_id is None and sel.error == "model selection failed: ranking broke"


def test_an_offered_pick_is_taken_by_a_ready_task():
    from hugginggpt.choose import Choice, ready_to_start

    state, events = request_state()
    t = task()
    choice = state.selections[0] = Choice()
    offered = pick(t, lead=0.0042)
    choice.offer(offered)
    assert choice.provisional is offered and choice.ranked.is_set() and not choice.done()
    ready_to_start(state, t)
    final = choice.result()
    assert final.model_id == "org/a" and final.question is None
    assert final.reason == ("top-ranked for this request (0.004 ahead of the next candidate, below choose_model_margin; "
                            "the LLM was asked, but the task's inputs were ready before its answer)")
    assert [p["model"] for _, p in events] == ["org/a"]


def test_a_ready_task_leaves_a_settled_choice_alone():
    from hugginggpt.choose import Choice

    state, events = request_state()
    t = task()
    choice = Choice()
    choice.offer(pick(t))
    settled = Selection(0, t.task, "org/b", "local", "the LLM's pick")
    choice.settle(state, t, settled)
    choice.take_ranking(state, t, 1.0)
    assert choice.result() is settled and len(events) == 1


def test_a_ready_task_waits_only_for_the_ranking():
    from hugginggpt.choose import Choice

    state, events = request_state()
    t = task()
    choice = Choice()
    start = time.monotonic()
    choice.take_ranking(state, t, 0.05)  # not ranked yet: it gives up after the timeout, deciding nothing
    assert 0.04 <= time.monotonic() - start < 2 and not choice.done()
    choice.ranked.set()  # ranked with no pick offered (the ranking decided alone): nothing to take
    choice.take_ranking(state, t, 1.0)
    assert not choice.done() and events == []


def test_ready_to_start_only_acts_on_a_choice():
    from concurrent.futures import Future

    from hugginggpt.choose import Choice, ready_to_start

    state, _ = request_state()
    t = task()
    plain = Future()
    state.selections[0] = plain
    ready_to_start(state, t)  # a plain future: nothing to take
    assert not plain.done()
    own = Choice()
    own.offer(pick(t, model="org/own"))
    ready_to_start(state, t, own)  # the choice made for this very task, not the one in state.selections
    assert own.result().model_id == "org/own" and not plain.done()


def test_a_ready_task_past_the_deadline_does_not_wait():
    from hugginggpt.choose import Choice, selection_at_start

    state, _ = request_state(timeout=0.0)
    t = task()
    choice = state.selections[0] = Choice()
    start = time.monotonic()
    sel = selection_at_start(state, t)
    assert time.monotonic() - start < 1.0
    assert sel.model_id is None and sel.error == "no model was chosen before the request's deadline (request_timeout)"
    assert not choice.done()


def test_selection_at_start_takes_the_offered_pick():
    from hugginggpt.choose import Choice, selection_at_start

    state, _ = request_state()
    t = task()
    choice = Choice()
    choice.offer(pick(t, model="org/c"))
    assert selection_at_start(state, t, choice).model_id == "org/c"


def test_inputs_ready():
    from hugginggpt.choose import inputs_ready

    state, _ = request_state()
    assert inputs_ready(state, Task(task="t", id=0, dep=[-1], args={}))
    assert inputs_ready(state, Task(task="t", id=0, dep=[], args={}))
    t = Task(task="t", id=2, dep=[0, 1], args={})
    state.results[0] = {}
    assert not inputs_ready(state, t)
    state.results[1] = {}
    assert inputs_ready(state, t)


def test_start_selection_chooses_each_new_task_once():
    from hugginggpt.choose import Choice, start_selection

    state, events = request_state()
    state.failed_models.add("org/broken")
    tasks = [task(tid=0), Task(task="image-classification", id=1, dep=[-1], args={}, error="bad"), task(tid=2)]
    earlier = state.selections[2] = Choice()  # chosen while the plan streamed
    sel = FakeSelector(choose="ranking", ranked=lambda t: Selection(t.id, t.task, "org/a", "local", "ranked"))
    seen = []
    start_selection(state, sel, tasks, Inline(), observe_seconds=seen.append)
    assert sel.prepared == [("draw a fox", [0])]
    assert [t.id for _, t, _ in sel.ranked_for] == [0]
    assert sel.ranked_for[0][2] == frozenset({"org/broken"})
    assert sel.ranked_for[0][1] is not tasks[0]  # chosen on a copy
    assert state.selections[0].result().model_id == "org/a" and state.selections[2] is earlier
    assert 1 not in state.selections
    assert len(seen) == 1 and seen[0] >= 0 and state.selections[0].result().seconds == seen[0]
    assert [p["id"] for _, p in events] == [0]


def test_a_choice_is_visible_only_once_it_is_being_made():
    from hugginggpt.choose import start_selection

    state, _ = request_state()

    class Refusing:
        def submit(self, *a):
            raise RuntimeError("shutting down")

    with pytest.raises(RuntimeError):
        start_selection(state, FakeSelector(), [task()], Refusing())
    assert state.selections == {}


def test_auto_with_inputs_ready_runs_the_ranking_pick_without_asking():
    from hugginggpt.choose import start_selection

    state, _ = request_state()
    sel = FakeSelector(choose="auto")
    start_selection(state, sel, [task()], Inline())
    got = state.selections[0].result()
    assert sel.asked == [] and got.model_id == "org/a"
    assert got.reason.endswith("(0.001 ahead of the next candidate, below choose_model_margin; the task's inputs "
                               "were ready, so it ran without waiting for the LLM)")


def test_auto_with_inputs_pending_asks_the_llm_and_offers_the_ranking_meanwhile():
    from hugginggpt.choose import start_selection

    state, _ = request_state()
    answer = threading.Event()
    sel = FakeSelector(choose="auto", llm_wait=answer)
    t = Task(task="image-classification", id=1, dep=[0], args={})
    pool = threading.Thread
    runs = []

    class Threaded:
        def submit(self, fn, *args):
            runs.append(pool(target=fn, args=args, daemon=True))
            runs[-1].start()

    start_selection(state, sel, [t], Threaded(), logit_bias=0.3)
    choice = state.selections[1]
    assert choice.ranked.wait(5) and choice.provisional.model_id == "org/a" and not choice.done()
    answer.set()
    runs[0].join(5)
    assert choice.result().model_id == "org/b"  # the LLM answered before the inputs were ready
    assert sel.asked == [("org/a", "draw a fox", 1, 0.3)]


def test_llm_mode_and_decisions_only_wait_for_the_llm():
    from hugginggpt.choose import start_selection

    state, _ = request_state()
    sel = FakeSelector(choose="llm")
    start_selection(state, sel, [task()], Inline())  # inputs ready, but `llm` waits
    assert state.selections[0].result().model_id == "org/b" and sel.asked
    state, _ = request_state()
    state.executes = False  # decisions only: nothing runs, the answer is the choice
    sel = FakeSelector(choose="auto")
    start_selection(state, sel, [task()], Inline())
    assert state.selections[0].result().model_id == "org/b"


def test_an_llm_answer_after_the_task_started_changes_nothing(caplog):
    from hugginggpt.choose import Choice, _choose

    state, events = request_state()
    choice = Choice()
    choice.settle(state, task(), Selection(0, "image-classification", "org/a", "local", "ranked"))
    sel = FakeSelector(choose="llm")
    with caplog.at_level(logging.INFO, logger="hugginggpt.choose"):
        _choose(state, sel, task(), 0.0, frozenset(), None, choice)
    assert choice.result().model_id == "org/a" and len(events) == 1
    assert "[req1] task 0: the LLM chose org/b after the task had started on the top-ranked model" in caplog.text


def test_a_failed_choice_reaches_the_waiting_task_or_the_log(caplog):
    from hugginggpt.choose import Choice, _choose

    state, _ = request_state()
    choice = Choice()
    _choose(state, FakeSelector(rank_error=RuntimeError("index broken")), task(), 0.0, frozenset(), None, choice)
    assert str(choice.exception()) == "index broken"
    late = Choice()
    late.settle(state, task(), Selection(0, "image-classification", "org/a", "local", "ranked"))
    with caplog.at_level(logging.ERROR, logger="hugginggpt.choose"):
        _choose(state, FakeSelector(choose="llm", llm_error=RuntimeError("llm down")), task(), 0.0, frozenset(),
                None, late)
    assert "[req1] task 0: choosing its model failed after it started on the top-ranked model" in caplog.text
    assert late.result().model_id == "org/a"


def test_decisions_only_answer():
    from hugginggpt.choose import Choice, decisions
    from hugginggpt.plan import Plan

    state, _ = request_state(content="caption and classify")
    t0, t1 = task("image-to-text", 0, image="/a.png"), task("image-classification", 1)
    t2 = Task(task="object-detection", id=2, dep=[-1], args={}, error="no such resource")
    for t, sel in ((t0, Selection(0, "image-to-text", "org/cap", "local", "best", available={"local": ["org/cap"]})),
                   (t1, Selection(1, "image-classification", None, None, "", error="nothing serves it"))):
        state.selections[t.id] = Choice()
        state.selections[t.id].set_result(sel)
    plan = Plan([t0, t1, t2])
    out = decisions(state, plan)
    d = out["decisions"]
    assert d["input"] == "caption and classify" and d["planned_tasks"] == plan.to_list()
    assert d["model_selections"] == {
        "0": {"task": "image-to-text", "selected_model": "org/cap", "hosted_on": "local", "reason": "best",
              "status": "selected_not_executed", "available_candidates": {"local": ["org/cap"]}},
        "1": {"task": "image-classification", "selected_model": None, "hosted_on": None,
              "reason": "nothing serves it", "status": "unavailable", "available_candidates": {}},
        "2": {"task": "object-detection", "selected_model": None, "hosted_on": None, "reason": "no such resource",
              "status": "unavailable", "available_candidates": {}},
    }
    assert d["summary"] == {"total_tasks": 3, "tasks_with_selections": 1, "tasks_unavailable": 2}
    assert out["raw_results"]["0"] == {"task": t0.to_dict(), "inference result": {},
                                       "choose model result": {"id": "org/cap", "reason": "best"}}
    assert out["raw_results"]["1"] == {"task": t1.to_dict(), "inference result": {
        "error": {"message": "nothing serves it"}}, "choose model result": ""}
    assert out["raw_results"]["2"]["inference result"] == {"error": {"message": "no such resource"}}


def test_decisions_wait_a_little_even_past_the_deadline():
    from concurrent.futures import Future

    from hugginggpt.choose import decisions
    from hugginggpt.plan import Plan

    state, _ = request_state(timeout=0.0)
    t = task()
    fut = state.selections[0] = Future()
    threading.Timer(0.02, lambda: fut.set_result(Selection(0, t.task, "org/a", "local", "r"))).start()
    out = decisions(state, Plan([t]))
    assert out["decisions"]["model_selections"]["0"]["selected_model"] == "org/a"  # 0.1 s of grace


def test_the_status_cache_holds_at_most_ten_thousand_answers():
    av = Availability({"local": Backend()}, ttl=30)
    far = time.monotonic() + 3600
    av._cache = {("local", f"m{i}"): (True, far) for i in range(9_999)}
    av.check(["new1"], ["local"])
    assert len(av._cache) == 10_000  # not full yet when it was added
    av.check(["new2"], ["local"])
    assert set(av._cache) == {("local", "new2")}


def test_status_checks_run_on_the_status_threads():
    names = []

    class Named(Backend):
        def is_available(self, model_id):
            names.append(threading.current_thread().name)
            return True

    Availability({"local": Named()}).check(["org/a"], ["local"])
    assert names and names[0].startswith("status")
    assert Availability({}).ttl == 30.0


def test_a_ready_task_waits_for_a_ranking_still_running():
    from hugginggpt.choose import Choice, ready_to_start

    state, _ = request_state()
    t = task()
    choice = state.selections[0] = Choice()
    threading.Timer(0.05, lambda: choice.offer(pick(t, model="org/late"))).start()
    ready_to_start(state, t)
    assert choice.done() and choice.result().model_id == "org/late"


def test_decisions_give_a_choice_never_made_a_short_grace():
    from concurrent.futures import Future

    from hugginggpt.choose import decisions
    from hugginggpt.plan import Plan

    state, _ = request_state(timeout=0.0)
    state.selections[0] = Future()  # never settled
    start = time.monotonic()
    out = decisions(state, Plan([task()]))
    assert 0.09 <= time.monotonic() - start < 0.9
    assert out["decisions"]["model_selections"]["0"]["status"] == "unavailable"
    assert out["decisions"]["model_selections"]["0"]["reason"] == (
        "no model was chosen before the request's deadline (request_timeout)")


def test_parse_choice_reads_the_json_keys_not_just_the_text():
    cands = ["org/a", "org/b"]
    # the reason comes first: read as text, the reason would run to the end of the reply
    assert parse_choice('{"reason": "small and fast", "id": "org/b"}', cands) == ("org/b", "small and fast")
    assert parse_choice('{"reason": "r", "model": "org/b"}', cands) == ("org/b", "r")
    assert parse_choice('{"reason": "r", "model_id": "org/a"}', cands) == ("org/a", "r")
    assert parse_choice('{"reason": "use id = \'blip\'"}', ["x/blip"]) == ("x/blip", "use id = 'blip'")


def test_parse_choice_reads_a_short_id_from_text():
    assert parse_choice("id: 'blip', reason: 'small'", ["x/blip"]) == ("x/blip", "small")
    assert parse_choice("id: 'org/a', reason: 'line one\nline two'", ["org/a"]) == ("org/a", "line one\nline two")


def test_fallbacks_put_a_local_choice_first():
    sel = Selection(1, "t", "org/b", "local", "r", available={"local": ["org/a", "org/b"]})
    assert sel.fallbacks() == [("org/b", "local"), ("org/a", "local")]


def test_rank_and_select_leave_out_excluded_models():
    s = selector(scores={"org/a": 0.9, "org/b": 0.5, "org/c": 0.1})
    assert [c.id for c, _ in s.rank("x", task(), exclude=["org/a"])] == ["org/b", "org/c"]
    llm = LLM("{}")
    assert s.select("x", task(), llm, exclude=frozenset({"org/a"})).model_id == "org/b"


def test_the_llm_is_asked_without_a_logit_bias_by_default():
    llm = LLM('{"id": "org/b"}')
    close_call().select("x", task(), llm)
    assert llm.calls[0][1] == 0.0
    s = close_call()
    llm = LLM('{"id": "org/b"}')
    s.ask_llm(s.by_ranking("x", task()), "x", task(), llm)
    assert llm.calls[0][1] == 0.0


def test_why_none_says_a_shared_reason_once_and_a_setting_always():
    from hugginggpt.select import why_none

    hub = "the Hub could not be reached to look up the providers of {}: ConnectionError"
    ids = ["org/a", "org/b", "org/c", "org/d", "org/e"]
    said = why_none(ids[:3], {m: hub.format(m) for m in ids[:3]})
    assert said == hub.format("org/a, org/b and org/c")  # the Hub's failure once, not once per model
    assert why_none(ids, {m: hub.format(m) for m in ids}) == hub.format("org/a, org/b, org/c and 2 more")
    assert why_none(ids, {m: "no token" for m in ids}) == "no token"
    why = {m: f"no Inference Provider serves {m} now" for m in ids[:4]}
    why["org/e"] = "org/e is served only by fal-ai, which huggingface.providers (together) leaves out"
    said = why_none(ids, why)
    # the setting's reason is shown though its model ranks fifth, and no model's name is said twice
    assert said == ("no Inference Provider serves org/a now; no Inference Provider serves org/b now; no Inference "
                    "Provider serves org/c now; org/e is served only by fal-ai, which huggingface.providers "
                    "(together) leaves out (and 1 more)")
    assert "org/e: org/e" not in said
    assert why_none(["org/a", "org/b"], {"org/a": "too big", "org/b": "gone"}) == "org/a: too big; org/b: gone"
    assert why_none(["org/x"], {}) == ""
