"""Hosted models through Hugging Face Inference Providers (issue 30): the lite config against a fake router and
Hub on loopback (tests/fakes/router_server.py), through the real InferenceClient and the real orchestrator.
HF_ENDPOINT and `huggingface.router_url` point at the fake, so nothing leaves loopback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from PIL import Image

from hugginggpt.backends import TaskInputs
from hugginggpt.backends.hosted import HostedInference
from hugginggpt.config import load_config
from hugginggpt.errors import BackendError, ConfigError
from hugginggpt.resources import resolve
from tests.conftest import sse, start_server, stop_server, write_config
from tests.fakes.llm_server import ThreadedServer
from tests.fakes.router_server import FakeRouter, Served
from tests.test_front_doors import metric

FLUX = "black-forest-labs/FLUX.1-schnell"
SDXL = "stabilityai/stable-diffusion-xl-base-1.0"
WHISPER = "openai/whisper-large-v3"
CAPTIONER = "microsoft/git-base-coco"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = "hf_provider_test_token"


def serve_models(fake: FakeRouter) -> None:
    fake.models.clear()
    # the Hub lists replicate first for FLUX; the user's settings put fal-ai first, and auto follows the user
    fake.serve(FLUX, "text-to-image", Served("replicate", "black-forest-labs/flux-schnell", "text-to-image"),
               Served("fal-ai", "fal-ai/flux/schnell", "text-to-image"))
    fake.serve(WHISPER, "automatic-speech-recognition",
               Served("replicate", "openai/whisper:8099696689d249cf8b122d833c36ac3f75505c666a395ca40ef26f68e7d3d16e",
                      "automatic-speech-recognition"),
               Served("fal-ai", "fal-ai/whisper", "automatic-speech-recognition", status="error"))
    fake.serve(CAPTIONER, "image-to-text", Served("hf-inference", CAPTIONER, "image-to-text"))
    fake.serve(LLAMA, "text-generation", Served("together", "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
                                                "conversational"))
    fake.preferences[TOKEN] = ["fal-ai", "hf-inference", "replicate", "together"]


@pytest.fixture(scope="module")
def router_server():
    fake = FakeRouter()
    serve_models(fake)
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def router(router_server):
    fake, url = router_server
    fake.reset()
    serve_models(fake)
    return fake, url


@pytest.fixture(scope="module")
def lite_server(tmp_path_factory, llm_server, router_server, public_dir):
    """The lite config (inference_mode: huggingface, providers: auto) with the fake router and Hub."""
    _, url = router_server
    folder = tmp_path_factory.mktemp("lite")
    config = write_config(folder, llm_server.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": TOKEN, "providers": "auto", "router_url": url},
                          semantic_ranking=False, choose_model="llm")
    srv = start_server(config, folder, env={"HF_ENDPOINT": url, "HF_HUB_DISABLE_TELEMETRY": "1"})
    yield srv
    stop_server(srv)
    assert TOKEN not in srv.logs()


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def plan(*tasks: tuple[str, dict]) -> str:
    return json.dumps([{"task": t, "id": i, "dep": [-1], "args": a} for i, (t, a) in enumerate(tasks)])


THREE = plan(("text-to-image", {"text": "a lighthouse at dusk"}), ("automatic-speech-recognition",
                                                                     {"audio": "/examples/hello.wav"}),
             ("image-to-text", {"image": "/examples/red.png"}))


def test_three_tasks_on_three_providers_end_to_end(lite_server, llm, router, public_dir):
    """Done when: image generation on one provider, speech recognition on another, captioning on hf-inference,
    each named in its task's record, in the stream's events and in /metrics."""
    fake, _ = router
    before = requests.get(lite_server.url + "/metrics", timeout=5).text  # the server is the module's: counts add up
    llm.on("parse_task", THREE)
    records = lite_server.post("/results", ask("draw a lighthouse, transcribe my clip, caption the red picture")).json()
    served = {r["task"]["task"]: r["choose model result"] for r in records.values()}
    assert served["text-to-image"] == {"id": FLUX, "reason": "Only one model available.", "hosted_on": "huggingface",
                                       "provider": "fal-ai"}  # the user's order, not the Hub's (replicate first)
    assert served["automatic-speech-recognition"]["provider"] == "replicate"  # fal-ai's mapping is not live
    assert served["image-to-text"]["provider"] == "hf-inference"
    results = {r["task"]["task"]: r["inference result"] for r in records.values()}
    image = Image.open(public_dir / results["text-to-image"]["generated image"].lstrip("/"))
    assert image.size == (48, 32) and image.getpixel((0, 0)) == (250, 120, 0)  # fal's picture, fetched from its CDN
    assert results["automatic-speech-recognition"]["text"].startswith("replicate transcript of ")
    assert results["image-to-text"]["generated text"] == "hf-inference caption of 80x60"
    assert {c["provider"] for c in fake.calls} == {"fal-ai", "replicate", "hf-inference"}
    assert {c["authorization"] for c in fake.calls} == {f"Bearer {TOKEN}"}
    assert TOKEN not in json.dumps(records)

    llm.on("parse_task", THREE)
    resp = requests.post(lite_server.url + "/hugginggpt", json=ask("the same, streamed", stream=True), stream=True,
                         timeout=30)
    finished = {e["task"]: e for n, e in sse(resp) if n == "task_finished"}
    assert {t: (e["hosted_on"], e["provider"]) for t, e in finished.items()} == {
        "text-to-image": ("huggingface", "fal-ai"), "automatic-speech-recognition": ("huggingface", "replicate"),
        "image-to-text": ("huggingface", "hf-inference")}

    metrics = requests.get(lite_server.url + "/metrics", timeout=5).text
    for provider in ("fal-ai", "replicate", "hf-inference"):
        calls = [metric(text, "hugginggpt_provider_calls_total", outcome="ok", provider=provider)
                 for text in (before, metrics)]
        assert calls[1] - calls[0] == 2, (provider, calls)


def test_a_provider_error_falls_back_to_the_next_provider_then_the_next_model(lite_server, llm, router):
    fake, _ = router
    llm.on("parse_task", plan(("text-to-image", {"text": "a red fox"})))
    fake.failures["fal-ai"] = 503
    record = lite_server.post("/results", ask("draw a fox")).json()["0"]
    assert record["choose model result"]["provider"] == "replicate"
    tried = record["inference result"]["fallback"]["tried"]
    assert [(t["model"], t["provider"]) for t in tried] == [(FLUX, "fal-ai")]
    assert "503" in tried[0]["error"] and "loading" in tried[0]["error"]
    assert record["inference result"]["generated image"].startswith("/images/")

    # both of FLUX's providers fail: the next model (served by hf-inference) runs
    fake.serve(SDXL, "text-to-image", Served("hf-inference", SDXL, "text-to-image"))
    fake.failures["replicate"] = 500
    llm.on("choose_model", json.dumps({"id": FLUX, "reason": "the best pictures"}))
    record = lite_server.post("/results", ask("draw a fox")).json()["0"]
    assert record["choose model result"]["id"] == SDXL and record["choose model result"]["provider"] == "hf-inference"
    assert [(t["model"], t["provider"]) for t in record["inference result"]["fallback"]["tried"]] == [
        (FLUX, "fal-ai"), (FLUX, "replicate")]
    assert [c["provider"] for c in fake.calls[-3:]] == ["fal-ai", "replicate", "hf-inference"]
    metrics = requests.get(lite_server.url + "/metrics", timeout=5).text
    assert 'hugginggpt_provider_calls_total{outcome="unavailable",provider="fal-ai"}' in metrics


@pytest.mark.parametrize("status, says, final", [
    (401, "refused the Hugging Face token (401 Unauthorized): check huggingface.token", True),
    (402, "no Inference Providers credits left (402 Payment Required from replicate)", True),
    (429, "replicate is rate-limiting this token (429 Too Many Requests)", False),
    (503, "replicate cannot serve openai/whisper-large-v3 right now (503 Service Unavailable: the model is loading", False),
])
def test_each_provider_error_is_one_clear_line(lite_server, llm, router, status, says, final):
    fake, _ = router
    fake.models[WHISPER]["served"][1].status = "live"  # a second provider, after replicate in the user's order
    fake.preferences[TOKEN] = ["replicate", "fal-ai"]
    fake.failures["replicate"] = status
    if not final:
        fake.failures["fal-ai"] = status
    llm.on("parse_task", plan(("automatic-speech-recognition", {"audio": "/examples/hello.wav"})))
    resp = lite_server.post("/results", ask("transcribe this"))
    assert resp.status_code == 200
    message = resp.json()["0"]["inference result"]["error"]["message"]
    assert says in message, message
    assert "\n" not in message and "Traceback" not in message and TOKEN not in resp.text
    assert "https://router.huggingface.co" not in message
    # a refused token or spent credits are the account's: the next provider is not asked; otherwise it is
    assert [c["provider"] for c in fake.calls] == (["replicate"] if final else ["replicate", "fal-ai"])


def test_a_providers_list_in_the_config_limits_and_orders_them(tmp_path, llm, router, public_dir):
    fake, url = router
    config = write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": TOKEN, "providers": ["replicate", "hf-inference"], "router_url": url},
                          semantic_ranking=False)
    srv = start_server(config, tmp_path, env={"HF_ENDPOINT": url})
    try:
        llm.on("parse_task", plan(("text-to-image", {"text": "a kite"})))
        record = srv.post("/results", ask("draw a kite")).json()["0"]
        assert record["choose model result"]["provider"] == "replicate"  # fal-ai, first in the user's order, is not allowed
        assert [c["provider"] for c in fake.calls] == ["replicate"]
    finally:
        stop_server(srv)


def test_config_providers_are_checked(tmp_path):
    def config(**huggingface) -> Path:
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps({"dev": True, "local": {"endpoint": "http://127.0.0.1:9/v1"},
                                    "huggingface": {"token": "hf_x", **huggingface}}))
        return path

    assert load_config(config()).huggingface_providers == ()  # auto
    assert load_config(config(providers="auto")).huggingface_providers == ()
    assert load_config(config(providers=["fal-ai", "hf-inference"])).huggingface_providers == ("fal-ai", "hf-inference")
    with pytest.raises(ConfigError, match=r"`huggingface.providers` names 'fal-ia', which is not an Inference "
                                          r"Provider; did you mean fal-ai\?"):
        load_config(config(providers=["fal-ia"]))
    with pytest.raises(ConfigError, match="`huggingface.providers` must be auto or a list"):
        load_config(config(providers=5))
    with pytest.raises(ConfigError, match="`huggingface.providers` cannot be used with `huggingface.base_url`"):
        load_config(config(providers=["fal-ai"], base_url="http://127.0.0.1:9"))
    with pytest.raises(ConfigError, match="`huggingface.router_url` must be an http"):
        load_config(config(router_url="router.example"))


def backend(url: str, public: Path, **kw) -> HostedInference:
    return HostedInference(TOKEN, public, router_url=url, hub_url=url, **kw)


def test_allowed_providers_decide_availability_and_order(router, public_dir):
    fake, url = router
    assert backend(url, public_dir, status_ttl=0).is_available(FLUX)
    assert not backend(url, public_dir, status_ttl=0, providers=("hf-inference",)).is_available(FLUX)
    only = backend(url, public_dir, status_ttl=0, providers=("replicate", "fal-ai"))
    assert [r.provider for r in only.routes(FLUX)] == ["replicate", "fal-ai"]  # the config's order
    result = only.infer(FLUX, TaskInputs("text-to-image", text="a boat"))
    assert result["provider"] == "replicate" and fake.calls[-1]["provider"] == "replicate"
    # the user's own order on the Hub (auto): asked with the token
    assert [r.provider for r in backend(url, public_dir, status_ttl=0).routes(FLUX)] == ["fal-ai", "replicate"]
    assert {c["token"] for c in fake.hub_calls if c["expand"] == ["inferenceProviderMapping"]} >= {TOKEN}
    with pytest.raises(BackendError, match=r"no Inference Provider among huggingface.providers \(together\) serves"):
        backend(url, public_dir, status_ttl=0, providers=("together",)).infer(
            FLUX, TaskInputs("text-to-image", text="a boat"))


def test_a_provider_silent_for_task_timeout_is_one_providers_failure(router, public_dir):
    """fal-ai hangs past task_timeout (1 s) well inside the request's deadline: replicate is asked next."""
    from hugginggpt.urlpolicy import deadline_scope

    fake, url = router
    fake.hangs["fal-ai"] = 3.0
    hosted = backend(url, public_dir, status_ttl=0, timeout=1.0, providers=("fal-ai", "replicate"))
    with deadline_scope(time.monotonic() + 60):  # the request's deadline, as execute.py sets it
        result = hosted.infer(FLUX, TaskInputs("text-to-image", text="a boat"))
    assert result["provider"] == "replicate"
    [failed] = result["fallback"]["tried"]
    assert failed["provider"] == "fal-ai" and "timed out (no answer for 1s)" in failed["error"]


def test_provider_availability_is_cached(router, public_dir):
    fake, url = router
    cached = backend(url, public_dir, status_ttl=60)
    for _ in range(5):
        assert cached.is_available(FLUX)
    assert [c["model"] for c in fake.hub_calls] == [FLUX]
    uncached = backend(url, public_dir, status_ttl=0)
    for _ in range(2):
        assert uncached.is_available(FLUX)
    assert [c["model"] for c in fake.hub_calls] == [FLUX] * 3


def test_a_chat_model_serves_text_generation_through_its_provider(router, public_dir):
    fake, url = router
    result = backend(url, public_dir, status_ttl=0).infer(LLAMA, TaskInputs("text-generation", text="hello there"))
    assert result == {"generated text": "together says: hello there", "provider": "together"}
    call = fake.calls[-1]
    assert call["path"] == "/together/v1/chat/completions" and call["provider_id"].endswith("Instruct-Turbo")


def test_speech_recognition_on_fal_ai(router, public_dir):
    fake, url = router
    fake.models[WHISPER]["served"][1].status = "live"
    audio = resolve("/examples/hello.wav", public_dir, 10**6, 5)
    result = backend(url, public_dir, status_ttl=0).infer(WHISPER, TaskInputs("automatic-speech-recognition",
                                                                               audio=audio))
    assert result["provider"] == "fal-ai" and result["text"] == f"fal-ai transcript of {len(audio.data)} bytes"
    assert fake.calls[-1]["json"] == ["audio_url"]


def test_provider_labels_in_metrics_are_bounded():
    from hugginggpt.metrics import Metrics

    metrics = Metrics()
    metrics.known_providers = frozenset({"fal-ai"})
    metrics.provider_call("fal-ai", "ok", 0.1)
    metrics.provider_call("made-up-provider", "whatever", 0.1)
    text = metrics.exposition().decode()
    assert 'hugginggpt_provider_calls_total{outcome="ok",provider="fal-ai"} 1.0' in text
    assert 'hugginggpt_provider_calls_total{outcome="error",provider="other"} 1.0' in text
    assert "made-up-provider" not in text and "whatever" not in text


def test_ranking_counts_a_model_as_hosted_only_when_an_allowed_provider_serves_it(tmp_path):
    from hugginggpt.catalog.embedders import HashEmbedder
    from hugginggpt.catalog.scoring import AVAILABILITY
    from hugginggpt.catalog.store import CatalogStore

    store = CatalogStore.open(tmp_path / "catalog.sqlite", HashEmbedder())
    try:
        store.upsert([{"id": "acme/fal-only", "task": "text-to-image", "downloads": 10, "providers": ["fal-ai"]},
                      {"id": "acme/hf-only", "task": "text-to-image", "downloads": 10, "providers": ["hf-inference"]}])
        store.compile_index()

        def availability() -> dict[str, float]:
            return {c.card.id: c.factors.availability for c in store.search("text-to-image", "a picture", limit=5)}

        assert availability() == {"acme/fal-only": AVAILABILITY["hosted"], "acme/hf-only": AVAILABILITY["hosted"]}
        store.allowed_providers = frozenset({"hf-inference"})  # huggingface.providers: [hf-inference]
        assert availability() == {"acme/fal-only": AVAILABILITY["unknown"], "acme/hf-only": AVAILABILITY["hosted"]}
    finally:
        store.close()
