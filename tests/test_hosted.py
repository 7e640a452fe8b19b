"""Hosted inference through the real InferenceClient against a fake hosted API; hybrid routing,
fallback, status caching, outages and a missing token."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import requests
import soundfile as sf
from PIL import Image

from hugginggpt.backends import TaskInputs
from hugginggpt.backends.hosted import HostedInference
from hugginggpt.errors import BackendError
from hugginggpt.resources import resolve
from tests.conftest import start_server, stop_server, write_config
from tests.fakes.hosted_server import FakeHosted
from tests.fakes.llm_server import ThreadedServer

HOSTED_MODELS = {
    "cardiffnlp/twitter-roberta-base-sentiment-latest": "text-classification",
    "dslim/bert-large-NER": "token-classification",
    "black-forest-labs/FLUX.1-schnell": "text-to-image",
    "microsoft/resnet-50": "image-classification",
    "hustvl/yolos-tiny": "object-detection",
    "microsoft/git-base-coco": "image-to-text",
    "Salesforce/blip-image-captioning-large": "image-to-text",
    "openai/whisper-large-v3": "automatic-speech-recognition",
    "facebook/mms-tts-eng": "text-to-speech",
}


@pytest.fixture(scope="module")
def hosted_server():
    fake = FakeHosted(models=dict(HOSTED_MODELS))
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def hosted(hosted_server):
    fake, url = hosted_server
    fake.models = dict(HOSTED_MODELS)
    fake.broken.clear()
    fake.calls.clear()
    fake.status_calls.clear()
    fake.auth.clear()
    fake.down = False
    return fake, url


@pytest.mark.parametrize("model, task, field, check", [
    ("cardiffnlp/twitter-roberta-base-sentiment-latest", "text-classification", "text",
     lambda r, p: r["predicted"][0]["label"] == "POSITIVE"),
    ("dslim/bert-large-NER", "token-classification", "text", lambda r, p: r["predicted"][0]["word"] == "Anna"),
    ("black-forest-labs/FLUX.1-schnell", "text-to-image", "text",
     lambda r, p: Image.open(p / r["generated image"].lstrip("/")).size == (32, 24)),
    ("microsoft/resnet-50", "image-classification", "image", lambda r, p: r["predicted"][0]["label"] == "image 80x60"),
    ("hustvl/yolos-tiny", "object-detection", "image",
     lambda r, p: r["predicted"][0]["label"] == "dog" and Image.open(p / r["generated image"].lstrip("/")).size == (80, 60)),
    ("microsoft/git-base-coco", "image-to-text", "image", lambda r, p: r["generated text"] == "hosted caption of 80x60"),
    ("openai/whisper-large-v3", "automatic-speech-recognition", "audio", lambda r, p: r["text"].startswith("hosted transcript")),
    ("facebook/mms-tts-eng", "text-to-speech", "text",
     lambda r, p: sf.info(str(p / r["generated audio"].lstrip("/"))).samplerate == 16000),
])
def test_each_family_maps_like_local_results(hosted, public_dir, model, task, field, check):
    _, url = hosted
    backend = HostedInference("hf_test", public_dir, base_url=url)
    values = {"text": "Anna lives in Berlin",
              "image": resolve("/examples/red.png", public_dir, 10**6, 5),
              "audio": resolve("/examples/hello.wav", public_dir, 10**6, 5)}
    result = backend.infer(model, TaskInputs(task=task, **{field: values[field]}))
    assert check(result, public_dir), result
    json.dumps(result)  # plain JSON


def test_token_is_sent_and_never_leaks(hosted, public_dir):
    fake, url = hosted
    fake.broken.add("microsoft/resnet-50")
    backend = HostedInference("hf_secret_token", public_dir, base_url=url)
    with pytest.raises(BackendError) as info:
        backend.infer("microsoft/resnet-50", TaskInputs("image-classification",
                                                        image=resolve("/examples/red.png", public_dir, 10**6, 5)))
    assert fake.auth[-1] == "Bearer hf_secret_token"
    assert "hf_secret_token" not in str(info.value)


def test_missing_token_explains_itself(hosted, public_dir):
    _, url = hosted
    backend = HostedInference(None, public_dir, base_url=url)
    assert backend.is_available("microsoft/resnet-50") is False
    with pytest.raises(BackendError, match="HUGGINGFACE_ACCESS_TOKEN"):
        backend.infer("microsoft/resnet-50", TaskInputs("image-classification"))


def hybrid_config(tmp_path: Path, llm, models_url: str, public: Path, hosted_url: str, **extra) -> Path:
    return write_config(tmp_path, llm.base_url, models_url, public, inference_mode="hybrid",
                        huggingface={"token": "hf_test", "base_url": hosted_url}, semantic_ranking=False, **extra)


@pytest.fixture
def hybrid_server(tmp_path, llm, models, models_server, public_dir, hosted):
    _, models_url = models_server
    config = hybrid_config(tmp_path, llm, models_url, public_dir, hosted[1], choose_model="llm")
    srv = start_server(config, tmp_path)
    yield srv
    stop_server(srv)


def ask(text: str, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


CAPTION = json.dumps([{"task": "image-to-text", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}}])


def test_hybrid_prefers_local_and_shows_hosted_on(hybrid_server, llm, models, hosted):
    llm.on("parse_task", CAPTION)
    decisions = hybrid_server.post("/hugginggpt", ask("caption", return_decisions=True)).json()["decisions"]
    sel = decisions["model_selections"]["0"]
    assert sel["hosted_on"] == "local" and sel["selected_model"] in models.models
    assert "microsoft/git-base-coco" in sel["available_candidates"]["huggingface"]
    # the LLM saw local candidates first, each with its endpoint
    metas = llm.stage_requests("choose_model")[-1]["body"]["messages"][-1]["content"]
    assert metas.index('"local"') < metas.index('"huggingface"')


def test_hosted_only_task_runs_hosted(hybrid_server, llm, models, hosted):
    fake, _ = hosted
    llm.on("parse_task", json.dumps([{"task": "text-classification", "id": 0, "dep": [-1],
                                      "args": {"text": "what a great day"}}]))
    result = hybrid_server.post("/results", ask("sentiment")).json()["0"]
    assert result["choose model result"]["id"] == "cardiffnlp/twitter-roberta-base-sentiment-latest"
    assert result["inference result"]["predicted"][0]["label"] == "POSITIVE"
    assert fake.calls[-1]["model"] == "cardiffnlp/twitter-roberta-base-sentiment-latest"


def test_local_failure_falls_back_to_the_next_candidate(hybrid_server, llm, models, hosted):
    models.broken.update({"Salesforce/blip-image-captioning-large", "nlpconnect/vit-gpt2-image-captioning"})
    llm.on("parse_task", CAPTION)
    result = hybrid_server.post("/results", ask("caption")).json()["0"]
    inf = result["inference result"]
    assert inf["generated text"] == "hosted caption of 80x60"
    assert [t["hosted_on"] for t in inf["fallback"]["tried"]] == ["local", "local"]
    assert all("crashed" in t["error"] for t in inf["fallback"]["tried"])


def test_hosted_outage_still_completes_with_an_explanation(hybrid_server, llm, models, hosted):
    fake, _ = hosted
    fake.down = True
    llm.on("parse_task", json.dumps([{"task": "text-classification", "id": 0, "dep": [-1], "args": {"text": "hi"}},
                                     {"task": "token-classification", "id": 1, "dep": [-1], "args": {"text": "Anna"}}]))
    resp = hybrid_server.post("/hugginggpt", ask("sentiment and entities"))
    assert resp.status_code == 200
    message = resp.json()["message"]
    assert "no available model for text-classification" in message  # the hosted side was down
    assert "PER" in message  # the local task still ran


def test_lite_mode_needs_no_models_server(tmp_path, llm, hosted, public_dir):
    fake, url = hosted
    config = write_config(tmp_path, llm.base_url, "http://127.0.0.1:9", public_dir, inference_mode="huggingface",
                          huggingface={"token": "hf_test", "base_url": url}, semantic_ranking=False)
    srv = start_server(config, tmp_path)
    try:
        assert requests.get(srv.url + "/health", timeout=5).json()["models_server"] == "unused"
        llm.on("parse_task", CAPTION)
        result = srv.post("/results", ask("caption")).json()["0"]
        assert result["inference result"]["generated text"] == "hosted caption of 80x60"
        llm.on("parse_task", json.dumps([{"task": "canny-control", "id": 0, "dep": [-1],
                                          "args": {"image": "/examples/red.png"}}]))
        result = srv.post("/results", ask("edges")).json()["0"]
        assert "ControlNet tasks need the local models server" in result["inference result"]["error"]["message"]
    finally:
        stop_server(srv)


def burst_status_calls(tmp_path, llm, models, models_server, public_dir, hosted, cache_seconds: float) -> int:
    fake, url = hosted
    _, models_url = models_server
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = hybrid_config(tmp_path, llm, models_url, public_dir, url, status_cache_seconds=cache_seconds)
    srv = start_server(config, tmp_path)
    try:
        models.status_calls.clear()
        fake.status_calls.clear()
        llm.on("parse_task", CAPTION)
        threads = [threading.Thread(target=srv.post, args=("/results", ask("caption"))) for _ in range(20)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        return len(models.status_calls) + len(fake.status_calls)
    finally:
        stop_server(srv)


def test_status_checks_are_cached_across_a_burst(tmp_path, llm, models, models_server, public_dir, hosted):
    without = burst_status_calls(tmp_path / "a", llm, models, models_server, public_dir, hosted, 0)
    with_cache = burst_status_calls(tmp_path / "b", llm, models, models_server, public_dir, hosted, 60)
    print(f"\nstatus calls for a burst of 20 requests: {without} without cache, {with_cache} with cache")
    candidates = 8  # image-to-text models in the catalog, each asked of both backends
    assert without == 20 * candidates * 2
    assert with_cache <= 20 * 2 * 2  # concurrent first misses at most; normally candidates * 2
    assert with_cache < without / 4


def test_segmentation_overlay_tints_only_inside_each_mask():
    from hugginggpt.backends.normalize import overlay_masks

    base = Image.new("RGB", (10, 10), (0, 0, 0))
    mask = Image.new("L", (5, 5), 0)
    mask.paste(255, (0, 0, 2, 5))  # left 2/5 of the mask; resized to the image
    out = overlay_masks(base, [mask])
    assert out.size == (10, 10) and out.getpixel((1, 5)) != (0, 0, 0) and out.getpixel((8, 5)) == (0, 0, 0)
    assert base.getpixel((1, 5)) == (0, 0, 0)  # the input is untouched
