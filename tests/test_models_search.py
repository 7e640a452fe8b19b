"""GET /models/search on the orchestrator, over HTTP: what the planner can choose from, best first."""

from __future__ import annotations

import pytest
import requests

from tests.conftest import start_server, stop_server, write_config

TOKEN = "search-token-123"


@pytest.fixture(scope="module")
def search_server(tmp_path_factory, llm_server, models_server, public_dir):
    folder = tmp_path_factory.mktemp("search")
    _, models_url = models_server
    store = folder / "catalog.sqlite"
    config = write_config(folder, llm_server.base_url, models_url, public_dir, semantic_ranking=False,
                          catalog_store=str(store), api_tokens=[TOKEN])
    running = start_server(config, folder)
    running.store_path = store
    yield running
    stop_server(running)


def get(server, query: str, token: str | None = TOKEN) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{server.url}/models/search?{query}", headers=headers, timeout=30)


def test_search_lists_cards_best_first(search_server):
    r = get(search_server, "task=translation&q=translate+English+into+German&limit=3")
    assert r.status_code == 200, r.text
    cards = r.json()
    assert len(cards) == 3 and "Helsinki-NLP/opus-mt-en-de" in [c["id"] for c in cards]
    assert {"id", "task", "downloads", "likes", "score"} <= set(cards[0])
    assert all(c["task"] == "translation" for c in cards)
    assert [c["score"] for c in cards] == sorted((c["score"] for c in cards), reverse=True)


def test_search_without_a_task_looks_everywhere(search_server):
    cards = get(search_server, "q=transcribe+German+speech&limit=5").json()
    assert len(cards) == 5 and "automatic-speech-recognition" in {c["task"] for c in cards}


@pytest.mark.parametrize("query, message", [
    ("task=translation&limit=0", "`limit` must be a whole number"),
    ("task=translation&limit=many", "`limit` must be a whole number"),
    ("task=translation&limit=1000", "`limit` must be a whole number"),
    ("task=no-such-task", "unknown task"),
])
def test_bad_parameters_get_a_json_400(search_server, query, message):
    r = get(search_server, query)
    assert r.status_code == 400
    assert message in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"


def test_search_needs_the_token_when_the_server_has_tokens(search_server):
    r = get(search_server, "task=translation", token=None)
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
    assert get(search_server, "task=translation", token="wrong").status_code == 403
