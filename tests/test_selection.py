"""Model selection end to end over HTTP: ranking order, the candidate limit, the LLM's choice, the status cache."""

from __future__ import annotations

import json
import time

import pytest
import requests

from hugginggpt.select import Availability
from tests.conftest import catalog_of, start_server, stop_server, write_config

# Four text-to-image models: the most popular is the least fitting for a photo request.
CARDS = [
    {"id": "pop/anime-diffusion", "task": "text-to-image", "likes": 90000, "downloads": 9000000,
     "description": "Anime style illustrations and cartoon characters", "tags": ["anime"], "language": ["en"]},
    {"id": "mid/watercolor-diffusion", "task": "text-to-image", "likes": 3000, "downloads": 40000,
     "description": "Soft watercolor paintings of landscapes", "tags": ["painting"], "language": ["en"]},
    {"id": "mid/sketch-diffusion", "task": "text-to-image", "likes": 2000, "downloads": 30000,
     "description": "Pencil sketches and line drawings", "tags": ["sketch"], "language": ["en"]},
    {"id": "niche/photoreal-diffusion", "task": "text-to-image", "likes": 3, "downloads": 50,
     "description": "Photorealistic photographs of people, portrait photography of an old fisherman style",
     "tags": ["photorealistic", "photograph", "portrait"], "language": ["en"]},
]
REQUEST = "a photorealistic portrait photograph of an old fisherman"


@pytest.fixture
def catalog_server(tmp_path, llm, models, models_server, public_dir):
    catalog = catalog_of(tmp_path, models, CARDS)
    _, models_url = models_server
    servers = {}

    def start(candidates: int, choose: str = "llm", margin: float = 0.05):
        key = (candidates, choose, margin)
        if key not in servers:
            folder = tmp_path / f"n{candidates}-{choose}-{margin}"
            folder.mkdir()
            config = write_config(folder, llm.base_url, models_url, public_dir, semantic_ranking=False,
                                  catalog=str(catalog), num_candidate_models=candidates, choose_model=choose,
                                  choose_model_margin=margin)
            servers[key] = start_server(config, folder)
        return servers[key]

    yield start
    for srv in servers.values():
        stop_server(srv)


def decide(srv, llm) -> dict:
    llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": REQUEST}}]))
    body = {"messages": [{"role": "user", "content": REQUEST}], "return_decisions": True}
    return srv.post("/hugginggpt", body).json()["decisions"]["model_selections"]["0"]


def test_the_ranker_orders_candidates_not_popularity(catalog_server, llm):
    """One candidate kept: the request's best match wins, although it has the fewest likes."""
    choice = decide(catalog_server(1), llm)
    assert choice["selected_model"] == "niche/photoreal-diffusion"
    assert choice["available_candidates"]["local"] == ["niche/photoreal-diffusion"]
    assert llm.stage_requests("choose_model") == []  # a single candidate needs no LLM call


def test_num_candidate_models_limits_what_the_llm_sees(catalog_server, llm):
    llm.on("choose_model", json.dumps({"id": "niche/photoreal-diffusion", "reason": "photo"}))
    choice = decide(catalog_server(2), llm)
    assert len(choice["available_candidates"]["local"]) == 2
    assert choice["available_candidates"]["local"][0] == "niche/photoreal-diffusion"
    prompt = llm.stage_requests("choose_model")[-1]["body"]["messages"][-1]["content"]
    shown = [c["id"] for c in CARDS if c["id"] in prompt]
    assert len(shown) == 2 and "niche/photoreal-diffusion" in shown


def test_an_invalid_llm_choice_falls_back_to_the_top_ranked(catalog_server, llm):
    llm.on("choose_model", json.dumps({"id": "someone/else-entirely", "reason": "made up"}))
    choice = decide(catalog_server(4), llm)
    assert len(choice["available_candidates"]["local"]) == 4
    assert choice["selected_model"] == "niche/photoreal-diffusion"
    assert "top-ranked" in choice["reason"]


def test_a_valid_llm_choice_is_taken(catalog_server, llm):
    llm.on("choose_model", json.dumps({"id": "mid/sketch-diffusion", "reason": "the user likes sketches"}))
    choice = decide(catalog_server(4), llm)
    assert choice["selected_model"] == "mid/sketch-diffusion" and choice["reason"] == "the user likes sketches"


def test_auto_asks_the_llm_only_when_the_ranking_is_close(catalog_server, llm):
    llm.on("choose_model", json.dumps({"id": "mid/sketch-diffusion", "reason": "the LLM's pick"}))
    clear = decide(catalog_server(4, "auto", 0.05), llm)  # the photo model leads by far for a photo request
    assert clear["selected_model"] == "niche/photoreal-diffusion" and "without asking the LLM" in clear["reason"]
    assert llm.stage_requests("choose_model") == []
    close = decide(catalog_server(4, "auto", 50.0), llm)  # nothing leads by 50: the LLM decides
    assert close["selected_model"] == "mid/sketch-diffusion" and len(llm.stage_requests("choose_model")) == 1


def test_ranking_never_asks_the_llm(catalog_server, llm):
    llm.on("choose_model", json.dumps({"id": "mid/sketch-diffusion", "reason": "the LLM's pick"}))
    choice = decide(catalog_server(4, "ranking", 50.0), llm)
    assert choice["selected_model"] == "niche/photoreal-diffusion" and llm.stage_requests("choose_model") == []


class CountingBackend:
    """A backend whose status answers are counted (plain data, no network)."""

    name = "local"

    def __init__(self):
        self.calls = 0

    def is_available(self, model_id: str) -> bool:
        self.calls += 1
        return True

    def infer(self, model_id, inputs):  # pragma: no cover - never run here
        raise AssertionError("not used")


def test_the_status_cache_expires():
    backend = CountingBackend()
    availability = Availability({"local": backend}, ttl=0.3)
    assert availability.check(["a/b"], ["local"]) == {"local": ["a/b"]}
    availability.check(["a/b"], ["local"])
    assert backend.calls == 1  # the second answer came from the cache
    time.sleep(0.35)
    availability.check(["a/b"], ["local"])
    assert backend.calls == 2  # after the ttl the backend is asked again
    uncached = Availability({"local": backend}, ttl=0)
    uncached.check(["a/b"], ["local"])
    uncached.check(["a/b"], ["local"])
    assert backend.calls == 4


def test_a_cached_answer_is_the_answer_the_backend_gave_for_that_model():
    """Fresh answers are read without asking again; a cached "not available" stays not available."""

    class Some(CountingBackend):
        def is_available(self, model_id: str) -> bool:
            self.calls += 1
            return model_id != "x/gone"

    backend = Some()
    availability = Availability({"local": backend}, ttl=30)
    ids = ["a/b", "x/gone", "c/d"]
    assert availability.check(ids, ["local"]) == {"local": ["a/b", "c/d"]}
    assert availability.check(ids + ["e/f"], ["local", "huggingface"]) == {"local": ["a/b", "c/d", "e/f"],
                                                                           "huggingface": []}
    assert backend.calls == 4  # only e/f was asked the second time


def test_allowed_and_denied_models_limit_what_clients_can_make_the_server_run(tmp_path, llm, models, models_server,
                                                                              public_dir):
    import json

    from tests.conftest import start_server, stop_server, write_config

    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                          choose_model="ranking", allowed_models=["dslim/*", "nlpconnect/*", "Salesforce/*"],
                          denied_models=["Salesforce/*"])
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", json.dumps([
            {"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
            {"task": "token-classification", "id": 1, "dep": [-1], "args": {"text": "Anna lives in Berlin"}},
            {"task": "text-to-image", "id": 2, "dep": [-1], "args": {"text": "a fox"}}]))
        results = srv.post("/results", {"messages": [{"role": "user", "content": "caption, tag, draw"}]}).json()
        search = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "x"}]})  # still serving
    finally:
        stop_server(srv)
    assert results["0"]["choose model result"]["id"] == "nlpconnect/vit-gpt2-image-captioning"  # Salesforce denied
    assert results["1"]["choose model result"]["id"].startswith("dslim/")
    assert "allowed_models / denied_models" in results["2"]["inference result"]["error"]["message"]
    assert not any(c["model"].startswith("Salesforce/") or c["model"].startswith("stabilityai/")
                   for c in models.calls)
    assert search.status_code == 200


def test_denied_models_are_filtered_before_the_catalog_stores_limit(tmp_path, llm, models, models_server, public_dir):
    """Twelve popular models of a task are denied; the one permitted model, ranked below all of them in the
    catalog store, is still chosen (the filter must come before the store's top-N, issue 20 round 2)."""
    denied = [{"id": f"popular/ner-{i}", "task": "token-classification", "likes": 50000 - i, "downloads": 9000000 - i,
               "description": "named entity recognition of persons and places", "language": ["en"]}
              for i in range(12)]
    quiet = {"id": "quiet/ner", "task": "token-classification", "likes": 1, "downloads": 10,
             "description": "named entity recognition of persons and places", "language": ["en"]}
    catalog = tmp_path / "catalog.jsonl"
    catalog.write_text("\n".join(json.dumps(c) for c in [*denied, quiet]) + "\n")
    models.models = {c["id"]: c["task"] for c in [*denied, quiet]}  # every one of them could run
    config = write_config(tmp_path, llm.base_url, models_server[1], public_dir, semantic_ranking=False,
                          catalog=str(catalog), choose_model="ranking", denied_models=["popular/*"])
    srv = start_server(config, tmp_path)
    try:
        llm.on("parse_task", json.dumps([{"task": "token-classification", "id": 0, "dep": [-1],
                                          "args": {"text": "Anna lives in Berlin"}}]))
        body = {"messages": [{"role": "user", "content": "find the names"}], "return_decisions": True}
        resp = srv.post("/hugginggpt", body)
        search = requests.get(srv.url + "/models/search?task=token-classification&limit=5", timeout=10)
    finally:
        stop_server(srv)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["decisions"]["model_selections"]["0"]
    assert choice["selected_model"] == "quiet/ner", choice
    assert choice["available_candidates"]["local"] == ["quiet/ner"]
    assert [m["id"] for m in search.json()] == ["quiet/ner"]  # browsing shows the same: no denied model
def test_an_llm_choice_by_the_models_short_name_is_read_as_that_candidate():
    from hugginggpt.select import parse_choice

    candidates = ["Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning"]
    assert parse_choice('{"id": "vit-gpt2-image-captioning", "reason": "small"}', candidates) == (
        "nlpconnect/vit-gpt2-image-captioning", "small")
    assert parse_choice('{"id": "gpt2-image-captioning"}', candidates)[0] is None  # a suffix of the name is not it
    assert parse_choice("no idea", candidates)[0] is None
