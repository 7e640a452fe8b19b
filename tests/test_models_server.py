"""The local models server on tiny real models, over HTTP: every family, errors, locking, eviction."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import soundfile as sf
from PIL import Image

from tests import annotators
from tests.conftest import ROOT, free_port, make_public
from tests.tiny_models import build_all


def start_models_server(folder: Path, models_dir: Path, public: Path, deployment: str = "standard",
                        budget_gb: float | None = None, device: str = "cpu", token: str | None = None,
                        engine: str = "flask", replicas: int = 1, extra: tuple[str, ...] = (),
                        env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The real models_server.py on a free loopback port; returns once /running answers. `extra`: more config
    lines; `env`: its environment. The log is at `proc.log_path`."""
    port = free_port()
    lines = [f"root: {ROOT}", f"public_dir: {public}", f"local_models_dir: {models_dir}",
             f"local_deployment: {deployment}", f"device: {device}", "openai: {api_key: unused}",
             f"local_inference_endpoint: {{host: 127.0.0.1, port: {port}}}"]
    if budget_gb is not None:
        lines.append(f"memory_budget_gb: {budget_gb}")
    if token:
        lines.append(f"models_server_token: {token}")
    lines += extra
    config = folder / f"models-{port}.yaml"
    config.write_text("\n".join(lines) + "\n")
    log_path = folder / f"models-{port}.log"
    proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config", str(config), "--engine",
                             engine, "--replicas", str(replicas)], stdout=log_path.open("w"),
                            stderr=subprocess.STDOUT, cwd=folder, env=env)
    proc.log_path = log_path  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/running", headers=auth, timeout=1).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {engine} models server did not start:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The standard level on tiny models; hed / mlsd / openpose run controlnet_aux's own code (tests/annotators.py)
    where the library is installed."""
    folder = tmp_path_factory.mktemp("models-srv")
    models_dir = folder / "models"
    build_all(models_dir)
    public = make_public(folder / "public")
    standin = annotators.standin(folder / "standin")
    if standin is not None:
        annotators.build_checkpoints(models_dir, standin)
    proc, url = start_models_server(folder, models_dir, public,
                                    env=annotators.env_with(standin) if standin is not None else None)
    yield url, public, models_dir, folder
    proc.terminate()
    proc.wait(10)


def post(url: str, model: str, body: dict, timeout: float = 120) -> requests.Response:
    return requests.post(f"{url}/models/{model}", json=body, timeout=timeout)


def test_routes_and_status(tiny):
    url, *_ = tiny
    assert requests.get(url + "/running", timeout=5).json() == {"running": True}
    assert requests.get(url + "/status/dslim/bert-base-NER", timeout=5).json()["loaded"] is True
    assert requests.get(url + "/status/facebook/bart-large-cnn", timeout=5).json()["loaded"] is False  # no weights
    assert requests.get(url + "/status/nobody/nothing", timeout=5).json()["loaded"] is False
    rows = {r["id"]: r for r in requests.get(url + "/models", timeout=5).json()["models"]}
    assert rows["dslim/bert-base-NER"]["task"] == "token-classification"
    assert rows["dslim/bert-base-NER"]["device"] == "cpu"
    assert "stable-diffusion-v1-5/stable-diffusion-v1-5" not in rows  # full-level model at standard


def test_text_classification(tiny):
    out = post(tiny[0], "distilbert/distilbert-base-uncased-finetuned-sst-2-english", {"text": "a great movie"}).json()
    assert out[0]["label"] in ("POSITIVE", "NEGATIVE") and 0 <= out[0]["score"] <= 1


def test_token_classification(tiny):
    out = post(tiny[0], "dslim/bert-base-NER", {"text": "anna lives in berlin"})
    assert out.status_code == 200, out.text
    for ent in out.json():
        assert set(ent) >= {"entity_group", "score", "word", "start", "end"} and isinstance(ent["score"], float)


def test_question_answering_span_lies_in_the_context(tiny):
    context = "the cat sits on the mat in berlin"
    out = post(tiny[0], "deepset/roberta-base-squad2", {"text": "where is the cat ?", "context": context}).json()
    assert context[out["start"]:out["end"]] == out["answer"] and out["answer"]


def test_text_generation_and_summarization(tiny):
    gen = post(tiny[0], "openai-community/gpt2", {"text": "the cat", "max_new_tokens": 5}).json()
    assert gen["generated text"].startswith("the cat")
    summ = post(tiny[0], "sshleifer/distilbart-cnn-12-6", {"text": "the cat sits on the mat . the dog is red"}).json()
    assert isinstance(summ["generated text"], str)


@pytest.mark.parametrize("model, task", [("Helsinki-NLP/opus-mt-en-de", "translation"),
                                         ("google/flan-t5-base", "text2text-generation"),
                                         ("microsoft/DialoGPT-medium", "conversational")])
def test_every_text_task_type_answers_with_generated_text(tiny, model, task):
    url = tiny[0]
    rows = {r["id"]: r for r in requests.get(url + "/models", timeout=5).json()["models"]}
    assert rows[model]["task"] == task and rows[model]["servable"]
    out = post(url, model, {"text": "hello world . the cat is red", "max_new_tokens": 5})
    assert out.status_code == 200, out.text
    assert isinstance(out.json()["generated text"], str)


def test_sentence_similarity_on_real_minilm(tiny):
    url = tiny[0]
    same = post(url, "sentence-transformers/all-MiniLM-L6-v2",
                {"text": "A man is playing a guitar.", "text2": "Someone plays the guitar."}).json()["score"]
    other = post(url, "sentence-transformers/all-MiniLM-L6-v2",
                 {"text": "A man is playing a guitar.", "text2": "The stock market fell sharply today."}).json()["score"]
    assert same > 0.6 and other < 0.3 and same > other


def test_image_classification_from_path_and_data_uri(tiny):
    url, public, *_ = tiny
    a = post(url, "google/vit-base-patch16-224", {"img_url": "/examples/red.png"}).json()
    assert {x["label"] for x in a} <= {"tabby cat", "golden retriever", "rocket"}
    data = base64.b64encode((public / "examples" / "red.png").read_bytes()).decode()
    b = post(url, "google/vit-base-patch16-224", {"img_url": f"data:image/png;base64,{data}"}).json()
    assert a == b


def test_object_detection_boxes_lie_inside_the_image(tiny):
    out = post(tiny[0], "hustvl/yolos-tiny", {"img_url": "/examples/red.png", "threshold": 0.0})
    assert out.status_code == 200, out.text
    boxes = out.json()
    assert boxes and all(x["label"] in ("cat", "dog") for x in boxes)
    for x in boxes:
        b = x["box"]
        assert 0 <= b["xmin"] <= b["xmax"] <= 80 and 0 <= b["ymin"] <= b["ymax"] <= 60
    assert post(tiny[0], "hustvl/yolos-tiny", {"img_url": "/examples/red.png", "threshold": 3}).status_code == 400


def test_image_to_text_captions(tiny):
    out = post(tiny[0], "nlpconnect/vit-gpt2-image-captioning", {"img_url": "/examples/green.jpg"})
    assert out.status_code == 200, out.text
    assert isinstance(out.json()["generated text"], str)


def test_canny_control_writes_an_edge_image(tiny):
    url, public, *_ = tiny
    img = Image.new("RGB", (64, 64), "black")
    img.paste((255, 255, 255), (16, 16, 48, 48))
    img.save(public / "examples" / "square.png")
    out = post(url, "canny-control", {"img_url": "/examples/square.png"}).json()
    assert out["path"].startswith("/images/")
    edges = np.asarray(Image.open(public / out["path"].lstrip("/")).convert("L"))
    assert edges.shape == (64, 64) and edges[16, 32] > 0 and edges[32, 32] == 0 and edges[2, 2] == 0


def test_speech_recognition(tiny):
    url, public, *_ = tiny
    tone = (0.1 * np.sin(np.linspace(0, 200 * np.pi, 24000))).astype("float32")
    sf.write(public / "examples" / "tone.wav", tone, 24000)  # resampled to 16 kHz by the server
    out = post(url, "facebook/wav2vec2-base-960h", {"audio_url": "/examples/tone.wav"})
    assert out.status_code == 200, out.text
    assert isinstance(out.json()["text"], str)


def test_text_to_speech_writes_a_wav(tiny):
    url, public, *_ = tiny
    out = post(url, "facebook/mms-tts-eng", {"text": "hello world"}).json()
    assert out["path"].startswith("/audios/") and out["path"].endswith(".wav")
    data, rate = sf.read(public / out["path"].lstrip("/"))
    assert rate == 16000 and len(data) > 100


def test_image_segmentation_overlays_masks_on_the_input(tiny):
    url, public, *_ = tiny
    out = post(url, "nvidia/segformer-b0-finetuned-ade-512-512", {"img_url": "/examples/red.png"})
    assert out.status_code == 200, out.text
    data = out.json()
    assert data["predicted"] and {p["label"] for p in data["predicted"]} <= {"sky", "tree", "road"}
    with Image.open(public / data["path"].lstrip("/")) as img:
        assert img.size == (80, 60) and img.mode == "RGB"
        assert img.getpixel((40, 30)) != (200, 30, 30)  # tinted by a mask


def test_depth_estimation_writes_a_depth_map_of_the_input_size(tiny):
    url, public, *_ = tiny
    out = post(url, "Intel/dpt-large", {"img_url": "/examples/red.png"})
    assert out.status_code == 200, out.text
    with Image.open(public / out.json()["path"].lstrip("/")) as img:
        assert img.size == (80, 60)


def test_normal_control_turns_a_depth_estimate_into_a_normal_map(tiny):
    url, public, models_dir, _ = tiny
    assert requests.get(url + "/status/normal-control", timeout=5).json()["loaded"] is True  # runs dpt-hybrid-midas
    assert not (models_dir / "normal-control").exists()
    out = post(url, "normal-control", {"img_url": "/examples/red.png"})
    assert out.status_code == 200, out.text
    with Image.open(public / out.json()["path"].lstrip("/")) as img:
        assert img.size == (80, 60) and img.mode == "RGB"
        pixels = np.asarray(img)
    assert pixels[..., 2].min() >= 127  # every normal faces the viewer (z > 0)
    assert post(url, "normal-control", {}).status_code == 400


def test_controlnet_aux_annotators_say_why_they_cannot_run(tmp_path):
    """Where controlnet_aux does not import (its __init__ needs torchvision, which has no CPU build on this machine's
    registries): with their checkpoints on disk, /status still says no, and every route says why."""
    from hugginggpt.modelhost.registry import library_problem

    if library_problem("controlnet_aux") is None:
        pytest.skip("controlnet_aux imports here; this test is about a machine where it cannot")
    models_dir = tmp_path / "models"
    folder = models_dir / "lllyasviel" / "Annotators"
    folder.mkdir(parents=True)
    for name in annotators.FILES:
        (folder / name).write_bytes(b"checkpoint")
    proc, url = start_models_server(tmp_path, models_dir, make_public(tmp_path / "public"), deployment="minimal")
    try:
        rows = {r["id"]: r for r in requests.get(url + "/models", timeout=5).json()["models"]}
        for kind in ("hed", "mlsd", "openpose"):
            mid = f"{kind}-control"
            assert requests.get(f"{url}/status/{mid}", timeout=5).json()["loaded"] is False
            assert rows[mid]["servable"] is False and "pip install controlnet-aux" in rows[mid]["problem"]
            out = post(url, mid, {"img_url": "/examples/red.png"})
            assert out.status_code == 404 and "needs the controlnet_aux library" in out.json()["error"]["message"]
        assert rows["canny-control"]["servable"] and rows["canny-control"]["problem"] is None
    finally:
        proc.terminate()
        proc.wait(10)


def test_hed_mlsd_openpose_run_the_librarys_own_code_through_our_loader(tiny):
    """The production loader (`import controlnet_aux`, `<Detector>.from_pretrained(lllyasviel/Annotators)`) on
    controlnet_aux's own HED, MLSD and OpenPose code and random checkpoints of the real shapes."""
    if annotators.installed_package() is None:
        pytest.skip("controlnet_aux is not installed (requirements-dev.txt and the Makefile install it)")
    url, public, *_ = tiny
    rows = {r["id"]: r for r in requests.get(url + "/models", timeout=5).json()["models"]}
    maps = {}
    for kind in ("hed", "mlsd", "openpose"):
        mid = f"{kind}-control"
        assert rows[mid]["servable"] is True and rows[mid]["problem"] is None, rows[mid]
        out = post(url, mid, {"img_url": "/examples/red.png"})
        assert out.status_code == 200, out.text
        assert out.json()["path"].startswith("/images/")
        with Image.open(public / out.json()["path"].lstrip("/")) as img:
            # the library's own resizing: the short side to 512, both sides to a multiple of 64 (80x60 -> 704x512)
            assert img.size == (704, 512) and img.mode == "RGB"
            maps[kind] = np.asarray(img)
        assert requests.get(f"{url}/status/{mid}", timeout=5).json()["loaded"] is True
    # three different networks: HED's random weights see edges everywhere, M-LSD finds no line, OpenPose no body
    assert maps["hed"].mean() > 100 and maps["mlsd"].max() == 0 and maps["openpose"].max() == 0
    assert post(url, "hed-control", {"text": "no image"}).status_code == 400


# one request per task type of the standard level (which includes the minimal one)
TASK_REQUESTS = {
    "text-classification": {"text": "a great movie"},
    "token-classification": {"text": "anna lives in berlin"},
    "question-answering": {"text": "where is the cat ?", "context": "the cat sits on the mat"},
    "summarization": {"text": "the cat sits on the mat . the dog is red", "max_new_tokens": 5},
    "translation": {"text": "hello world", "max_new_tokens": 5},
    "text2text-generation": {"text": "hello world", "max_new_tokens": 5},
    "conversational": {"text": "hello", "max_new_tokens": 5},
    "text-generation": {"text": "the cat", "max_new_tokens": 5},
    "sentence-similarity": {"text": "a cat", "text2": "a dog"},
    "image-classification": {"img_url": "/examples/red.png"},
    "object-detection": {"img_url": "/examples/red.png"},
    "image-to-text": {"img_url": "/examples/red.png"},
    "image-segmentation": {"img_url": "/examples/red.png"},
    "depth-estimation": {"img_url": "/examples/red.png"},
    "visual-question-answering": {"img_url": "/examples/red.png", "text": "what is red"},
    "document-question-answering": {"img_url": "/examples/red.png", "text": "who",
                                    "word_boxes": [["anna", [0, 0, 100, 100]]]},
    "automatic-speech-recognition": {"audio_url": "/examples/hello.wav"},
    "audio-classification": {"audio_url": "/examples/hello.wav"},
    "text-to-speech": {"text": "hello"},
    **{f"{c}-control": {"img_url": "/examples/red.png"} for c in ("canny", "hed", "mlsd", "normal", "openpose")},
}


def test_the_models_server_serves_every_task_type_of_its_level(tiny):
    """All 24 task types of the standard level: /models lists a servable model for each, and one answers."""
    from hugginggpt.modelhost.registry import load_specs
    from hugginggpt.plan import TASK_TYPES

    if annotators.installed_package() is None:
        pytest.skip("controlnet_aux is not installed: hed / mlsd / openpose cannot be served")
    url, *_ = tiny
    level = {s.task for s in load_specs() if s.level in ("minimal", "standard")}
    assert level == set(TASK_REQUESTS) and len(level) == 24 and level <= set(TASK_TYPES)
    servable: dict[str, str] = {}
    for row in requests.get(url + "/models", timeout=5).json()["models"]:
        if row["servable"]:
            servable.setdefault(row["task"], row["id"])
    assert set(servable) == level, sorted(level - set(servable))
    for task, model in sorted(servable.items()):
        out = post(url, model, TASK_REQUESTS[task])
        assert out.status_code == 200, (task, model, out.text)


def test_registry_names_the_missing_files_of_an_annotator(tmp_path):
    from hugginggpt.modelhost.registry import Registry

    registry = Registry("minimal", tmp_path)
    normal = registry.get("normal-control")
    assert "Intel/dpt-hybrid-midas" in registry.problem(normal) and "hugginggpt.modelhost.download" in \
        registry.problem(normal)
    pose = registry.get("openpose-control")
    assert pose.weights_from == "lllyasviel/Annotators" and "body_pose_model.pth" in pose.files
    folder = tmp_path / "lllyasviel" / "Annotators"
    folder.mkdir(parents=True)
    (folder / "body_pose_model.pth").write_bytes(b"x")
    assert registry.weights_path(pose) is None  # the hand and face checkpoints are missing still
    for name in pose.files:
        (folder / name).write_bytes(b"x")
    assert registry.weights_path(pose) == folder


def test_normals_from_depth_follow_the_slope_and_leave_the_background_flat():
    from hugginggpt.modelhost.handlers import normals_from_depth

    depth = np.zeros((20, 40), dtype="float32")
    depth[:, :20] = np.linspace(0.0, 0.3, 20)[None, :]  # far (under 0.4 of the range): background, though sloped
    depth[:, 20:] = np.linspace(0.5, 1.0, 20)[None, :]  # a near surface rising to the right
    rgb = normals_from_depth(depth * 255)
    assert rgb.shape == (20, 40, 3) and rgb.dtype == np.uint8
    assert (rgb[2:-2, 2:15] == [127, 127, 255]).all()  # background faces the viewer
    slope = rgb[2:-2, 24:36].reshape(-1, 3)
    assert (slope[:, 0] > 127).all() and (slope[:, 1] == 127).all() and (slope[:, 2] < 255).all()
    falling = normals_from_depth(depth[:, ::-1] * 255)[2:-2, 4:16].reshape(-1, 3)
    assert (falling[:, 0] < 127).all()  # the other slope tilts the other way
    flat = normals_from_depth(np.full((8, 8), 3.0))
    assert (flat == [127, 127, 255]).all()  # no division by zero on a constant map


def test_visual_question_answering_answers_with_a_label(tiny):
    from tests.tiny_models import VQA_ANSWERS

    url, *_ = tiny
    out = post(url, "dandelin/vilt-b32-finetuned-vqa", {"img_url": "/examples/red.png", "text": "what is red"})
    assert out.status_code == 200, out.text
    answers = out.json()
    assert answers[0]["answer"] in VQA_ANSWERS and 0 <= answers[0]["score"] <= 1
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert post(url, "dandelin/vilt-b32-finetuned-vqa", {"img_url": "/examples/red.png"}).status_code == 400


def test_document_question_answering_reads_the_words_it_is_given(tiny):
    url, *_ = tiny
    words = [["anna", [0, 0, 100, 100]], ["lives", [110, 0, 200, 100]], ["in", [210, 0, 250, 100]],
             ["berlin", [260, 0, 400, 100]]]
    out = post(url, "impira/layoutlm-document-qa", {"img_url": "/examples/red.png", "text": "who lives in berlin",
                                                     "word_boxes": words})
    assert out.status_code == 200, out.text
    best = out.json()[0]
    assert best["answer"] and set(best["answer"].split()) <= {"anna", "lives", "in", "berlin"}
    # without OCR installed and without word boxes: a 400 that says what to install
    import importlib.util

    if importlib.util.find_spec("pytesseract") is None:
        no_ocr = post(url, "impira/layoutlm-document-qa", {"img_url": "/examples/red.png", "text": "who"})
        assert no_ocr.status_code == 400 and "tesseract" in no_ocr.json()["error"]["message"]
    bad = post(url, "impira/layoutlm-document-qa", {"img_url": "/examples/red.png", "text": "who", "word_boxes": [1]})
    assert bad.status_code == 400 and "word_boxes" in bad.json()["error"]["message"]


def test_audio_classification_ranks_the_labels(tiny):
    from tests.tiny_models import AUDIO_LABELS

    url, public, *_ = tiny
    out = post(url, "MIT/ast-finetuned-audioset-10-10-0.4593", {"audio_url": "/examples/hello.wav"})
    assert out.status_code == 200, out.text
    labels = out.json()
    assert {x["label"] for x in labels} == set(AUDIO_LABELS)
    assert abs(sum(x["score"] for x in labels) - 1) < 1e-3


def test_object_results_are_plain_json(tiny):
    out = post(tiny[0], "google/vit-base-patch16-224", {"img_url": "/examples/green.jpg"}).json()
    assert all(type(x["score"]) is float for x in out)


@pytest.mark.parametrize("model, body, status, words", [
    ("nobody/nothing", {"text": "x"}, 404, "unknown model"),
    ("facebook/bart-large-cnn", {"text": "x"}, 404, "weights for facebook/bart-large-cnn"),
    ("dslim/bert-base-NER", {}, 400, "`text` is required"),
    ("dslim/bert-base-NER", {"text": 5}, 400, "`text` is required"),
    ("google/vit-base-patch16-224", {"text": "x"}, 400, "`img_url` is required"),
    ("google/vit-base-patch16-224", {"img_url": "/examples/hello.wav"}, 400, "not a readable image"),
    ("google/vit-base-patch16-224", {"img_url": "../../etc/passwd"}, 400, "outside public/"),
    ("facebook/wav2vec2-base-960h", {"audio_url": "/examples/red.png"}, 400, "not a readable audio"),
    ("deepset/roberta-base-squad2", {"text": "who?"}, 400, "`context` is required"),
    # generation lengths are bounded: no client makes a model generate without end
    ("openai-community/gpt2", {"text": "x", "max_new_tokens": 10**9}, 400, "`max_new_tokens` must be a whole number"),
    ("openai-community/gpt2", {"text": "x", "max_new_tokens": "5"}, 400, "from 1 to 1024"),
    ("openai-community/gpt2", {"text": "x", "max_new_tokens": 0}, 400, "`max_new_tokens`"),
    ("google/flan-t5-base", {"text": "x", "max_new_tokens": 2.5}, 400, "`max_new_tokens` must be a whole number"),
    ("google/flan-t5-base", {"text": "x", "max_new_tokens": True}, 400, "`max_new_tokens` must be a whole number"),
])
def test_bad_requests_get_json_errors(tiny, model, body, status, words):
    resp = post(tiny[0], model, body)
    assert resp.status_code == status and words in resp.json()["error"]["message"]


def test_not_json_body(tiny):
    resp = requests.post(tiny[0] + "/models/dslim/bert-base-NER", data="{oops",
                         headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "JSON object" in resp.json()["error"]["message"]
    # without a token, a body that does not say it is JSON is refused first (issue 20: no simple cross-site POST)
    assert requests.post(tiny[0] + "/models/dslim/bert-base-NER", data="{oops", timeout=10).status_code == 415


def test_one_model_serialises_two_models_overlap(tmp_path):
    """Two users of one model take turns on its lock; two models are used side by side."""
    from hugginggpt.modelhost.pool import ModelPool
    from hugginggpt.modelhost.registry import Registry

    models_dir = tmp_path / "models"
    build_all(models_dir)
    registry = Registry("standard", models_dir)
    pool = ModelPool(registry, "cpu")
    ner, cls = registry.get("dslim/bert-base-NER"), registry.get("google/vit-base-patch16-224")
    spans: dict[str, list] = {"same": [], "diff": []}

    def hold(spec, key):
        with pool.use(spec):
            s = time.perf_counter()
            time.sleep(0.3)
            spans[key].append((s, time.perf_counter()))

    for spec in (ner, cls):  # load first, so only the holding is timed
        with pool.use(spec):
            pass
    threads = [threading.Thread(target=hold, args=(ner, "same")) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    (a0, a1), (b0, b1) = sorted(spans["same"])
    assert b0 >= a1  # serialised
    threads = [threading.Thread(target=hold, args=(spec, "diff")) for spec in (ner, cls)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    (a0, a1), (b0, b1) = sorted(spans["diff"])
    assert b0 < a1  # overlapped


def test_full_level_generation_on_tiny_diffusers_pipelines(tmp_path):
    """text-to-image, ControlNet, instruct-pix2pix and text-to-video: real diffusers loading and sampling."""
    from tests.tiny_models import FULL_BUILDERS

    models_dir = tmp_path / "models"
    for mid, builder in FULL_BUILDERS.items():
        builder(models_dir / mid)
    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, models_dir, public, deployment="full")
    try:
        assert requests.get(url + "/status/stable-diffusion-v1-5/stable-diffusion-v1-5", timeout=5).json()["loaded"]
        for steps in (10**6, 0, "2", None):  # bounded, so no client makes it denoise for hours
            bad = post(url, "stable-diffusion-v1-5/stable-diffusion-v1-5", {"text": "a red fox", "steps": steps})
            assert bad.status_code == 400 and "`steps` must be a whole number from 1 to 150" in bad.text, bad.text
        out = post(url, "stable-diffusion-v1-5/stable-diffusion-v1-5", {"text": "a red fox", "steps": 2})
        assert out.status_code == 200, out.text
        with Image.open(public / out.json()["path"].lstrip("/")) as img:
            assert img.size == (16, 16) and img.mode == "RGB"
        # ControlNet: the edge map steers the tiny SD; the picture has the control image's size
        edges = post(url, "canny-control", {"img_url": "/examples/red.png"}).json()["path"]
        cn = post(url, "lllyasviel/sd-controlnet-canny", {"text": "a red fox", "img_url": edges, "steps": 2})
        assert cn.status_code == 200, cn.text
        with Image.open(public / cn.json()["path"].lstrip("/")) as img:
            assert img.mode == "RGB" and img.size[0] > 0
        # instruct-pix2pix keeps the input's size
        edit = post(url, "timbrooks/instruct-pix2pix", {"text": "make it blue", "img_url": "/examples/red.png",
                                                         "steps": 2})
        assert edit.status_code == 200, edit.text
        with Image.open(public / edit.json()["path"].lstrip("/")) as img:
            assert img.size == (80, 60)
        # text-to-video writes an mp4 that opens with frames
        video = post(url, "damo-vilab/text-to-video-ms-1.7b", {"text": "a fox runs", "steps": 2})
        assert video.status_code == 200, video.text
        path = public / video.json()["path"].lstrip("/")
        assert path.suffix == ".mp4"
        import imageio.v3 as iio

        frames = iio.imread(path)
        assert frames.ndim == 4 and frames.shape[0] >= 1 and frames.shape[-1] == 3
        # voice conversion (SpeechT5 + HiFi-GAN) writes a wav that opens
        vc = post(url, "microsoft/speecht5_vc", {"audio_url": "/examples/hello.wav"})
        assert vc.status_code == 200, vc.text
        samples, rate = sf.read(public / vc.json()["path"].lstrip("/"))
        assert rate == 16000 and len(samples) > 0
        # a ControlNet whose weights are absent is reported, not crashed, and /status says so
        assert requests.get(url + "/status/lllyasviel/sd-controlnet-hed", timeout=5).json()["loaded"] is False
        missing = post(url, "lllyasviel/sd-controlnet-hed", {"text": "x", "img_url": "/examples/red.png"})
        assert missing.status_code == 404 and "weights" in missing.json()["error"]["message"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_eviction_under_a_tiny_budget(tmp_path):
    models_dir = tmp_path / "models"
    build_all(models_dir)
    public = make_public(tmp_path / "public")
    proc, url = start_models_server(tmp_path, models_dir, public, budget_gb=0.0001)  # ~100 kB: one tiny model
    try:
        post(url, "dslim/bert-base-NER", {"text": "anna"})
        post(url, "distilbert/distilbert-base-uncased-finetuned-sst-2-english", {"text": "good"})
        loaded = {r["id"] for r in requests.get(url + "/models", timeout=5).json()["models"] if r["loaded"]}
        assert loaded == {"distilbert/distilbert-base-uncased-finetuned-sst-2-english"}
        # the evicted model reloads on demand
        assert post(url, "dslim/bert-base-NER", {"text": "anna"}).status_code == 200
        loaded = {r["id"] for r in requests.get(url + "/models", timeout=5).json()["models"] if r["loaded"]}
        assert loaded == {"dslim/bert-base-NER"}
    finally:
        proc.terminate()
        proc.wait(10)


def test_outputs_survive_a_model_crash(tiny):
    """An inference exception is a 500 JSON error and the server keeps serving."""
    url = tiny[0]
    resp = post(url, "openai-community/gpt2", {"text": "the cat", "max_new_tokens": 1000})  # past its 128 positions
    assert resp.status_code in (200, 500)
    if resp.status_code == 500:
        assert "failed" in resp.json()["error"]["message"]
    assert requests.get(url + "/running", timeout=5).ok


def test_orchestrator_runs_a_two_step_plan_on_tiny_models(tiny, tmp_path, llm):
    """End to end: the scripted LLM plans classify-then-NER; the real models server runs both."""
    import json

    from tests.conftest import start_server, stop_server, write_config

    url, public, *_ = tiny
    config = write_config(tmp_path, llm.base_url, url, public, local_deployment="standard")
    llm.on("parse_task", json.dumps([
        {"task": "image-classification", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
        {"task": "token-classification", "id": 1, "dep": [0], "args": {"text": "<GENERATED>-0"}},
    ]))
    srv = start_server(config, tmp_path)
    try:
        results = srv.post("/results", {"messages": [{"role": "user", "content": "classify then tag"}]},
                           timeout=120).json()
        labels = {x["label"] for x in results["0"]["inference result"]["predicted"]}
        assert labels <= {"tabby cat", "golden retriever", "rocket"}
        assert results["0"]["choose model result"]["id"] == "google/vit-base-patch16-224"
        assert results["1"]["choose model result"]["id"] == "dslim/bert-base-NER"
        assert "error" not in results["1"]["inference result"], results["1"]
        # the NER task received the classification output as text
        assert "tabby cat" in results["1"]["task"]["args"]["text"] or "rocket" in results["1"]["task"]["args"]["text"] \
            or "golden" in results["1"]["task"]["args"]["text"]
    finally:
        stop_server(srv)


def test_models_server_needs_no_llm_keys(tmp_path):
    """The shipped Azure config has placeholder LLM keys; the models server must still start with it."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "models_server.py"), "--config",
                             str(ROOT / "configs" / "config.azure.yaml"), "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(proc.stdout.read())
            try:
                if requests.get(f"http://127.0.0.1:{port}/running", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.1)
        else:
            pytest.fail("models server did not start")
    finally:
        proc.terminate()
        proc.wait(10)


def test_download_helper_lists_the_deployment(tmp_path):
    def helper(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hugginggpt.modelhost.download", *args], capture_output=True,
                              text=True, cwd=ROOT, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})

    proc = helper("--deployment", "minimal", "--models-dir", str(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "all-MiniLM-L6-v2: ships inside a Python package" in proc.stdout  # nothing to download
    assert "canny-control" not in proc.stdout  # annotators have no weights
    assert "Intel/dpt-hybrid-midas: would fetch" in proc.stdout  # ...or run another model's (normal-control)
    assert ("lllyasviel/Annotators: would fetch ControlNetHED.pth, body_pose_model.pth, facenet.pth, "
            "hand_pose_model.pth, mlsd_large_512_fp32.pth into") in proc.stdout  # five files, not the repository
    assert "normal-control" not in proc.stdout
    full = helper("--deployment", "full", "--models-dir", str(tmp_path), "--dry-run").stdout
    assert "lllyasviel/sd-controlnet-openpose: would fetch" in full and "stable-diffusion-v1-5/stable-diffusion-v1-5" in full
    assert "size unknown" in full  # offline: said, not guessed
    # the config's folder and level are used; models already there show their size on disk
    (tmp_path / "dslim" / "bert-base-NER").mkdir(parents=True)
    (tmp_path / "dslim" / "bert-base-NER" / "model.safetensors").write_bytes(b"x" * 2048)
    config = tmp_path / "c.yaml"
    config.write_text(f"root: {ROOT}\nlocal_models_dir: {tmp_path}\nlocal_deployment: standard\n")
    listed = helper("--config", str(config), "--dry-run").stdout
    assert f"dslim/bert-base-NER: already in {tmp_path / 'dslim' / 'bert-base-NER'} (2.0 KB)" in listed
    # a misspelled id is an error with a suggestion; a failed download exits non-zero
    typo = helper("--config", str(config), "--only", "dslim/bert-base-NRE")
    assert typo.returncode == 2 and "did you mean dslim/bert-base-NER" in typo.stderr
    failed = helper("--config", str(config), "--only", "hustvl/yolos-tiny")
    assert failed.returncode == 1 and "hustvl/yolos-tiny: failed" in failed.stderr


def test_metrics_count_calls_by_model_and_report_the_pool(tiny):
    from tests.test_front_doors import metric

    def scrape() -> str:
        resp = requests.get(tiny[0] + "/metrics", timeout=10)
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain")
        return resp.text

    before = scrape()
    assert post(tiny[0], "dslim/bert-base-NER", {"text": "Anna lives in Berlin"}).status_code == 200
    assert post(tiny[0], "dslim/bert-base-NER", {"img_url": "/examples/red.png"}).status_code == 400
    after = scrape()
    model = {"model": "dslim/bert-base-NER"}
    assert metric(after, "models_server_calls_total", outcome="ok", **model) - \
        metric(before, "models_server_calls_total", outcome="ok", **model) == 1
    assert metric(after, "models_server_calls_total", outcome="error", **model) - \
        metric(before, "models_server_calls_total", outcome="error", **model) == 1
    assert metric(after, "models_server_call_seconds_count", **model) - \
        metric(before, "models_server_call_seconds_count", **model) == 2
    loaded = requests.get(tiny[0] + "/models", timeout=10).json()["models"]
    assert metric(after, "models_server_models_loaded") == sum(m["loaded"] for m in loaded) >= 1
    assert metric(after, "models_server_model_loads_total") >= metric(after, "models_server_models_loaded")
    held = [m for m in loaded if m["loaded"]]
    assert metric(after, "models_server_memory_used_bytes") == pytest.approx(  # /models rounds to 0.1 MB
        sum(m["memory_mb"] for m in held) * 1e6, abs=0.05e6 * len(held))
    assert metric(after, "models_server_memory_used_bytes") > 0


def test_audio_at_another_rate_is_resampled_to_the_models_rate(tiny):
    """The same sound sent at 8 kHz and at 16 kHz reaches a 16 kHz speech recognizer as the same second of
    audio, so both get the same transcript (a resampling ratio turned the wrong way hands it a quarter second).
    The 16 kHz file holds exactly what resampling the 8 kHz one gives, stored as float: the model sees equal
    inputs only when the server resamples by the right ratio."""
    url, public, _, _ = tiny
    rng = np.random.default_rng(7)
    envelope = np.repeat(rng.uniform(0.05, 0.9, 40), 200)  # the loudness changes every 25 ms: a varied transcript
    low = (rng.standard_normal(8000) * envelope).astype("float32")
    high = np.interp(np.linspace(0, 7999, 16000), np.arange(8000), low).astype("float32")
    sf.write(public / "examples" / "noise-8k.wav", low, 8000, subtype="FLOAT")
    sf.write(public / "examples" / "noise-16k.wav", high, 16000, subtype="FLOAT")
    texts = {}
    for name in ("noise-16k.wav", "noise-8k.wav"):
        resp = post(url, "facebook/wav2vec2-base-960h", {"audio_url": f"/examples/{name}"})
        assert resp.status_code == 200, resp.text
        texts[name] = resp.json()["text"]
    assert len(texts["noise-16k.wav"]) >= 5
    assert texts["noise-8k.wav"] == texts["noise-16k.wav"], "the 8 kHz file was heard differently"
