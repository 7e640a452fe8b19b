"""The models server's protocol, the same suite against both engines: in-process (flask) and Ray Serve.

Each engine runs the real `models_server.py --engine ...` on tiny models with a token; the tests talk
JARVIS's protocol to it over HTTP and check what a client would: statuses, answers, output files, errors.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from PIL import Image

from tests.conftest import ROOT, make_public, sse, wait_until
from tests.test_models_server import start_models_server
from tests.tiny_models import image_classifier, text_classifier, tiny_stable_diffusion

TOKEN = "engine-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXT = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
IMAGE = "google/vit-base-patch16-224"
SD = "stable-diffusion-v1-5/stable-diffusion-v1-5"
FRESH = "cardiffnlp/twitter-roberta-base-sentiment-latest"  # used by one test only: its first call loads it
RAY_MISSING = importlib.util.find_spec("ray") is None


@pytest.fixture(scope="module", params=["flask", pytest.param("ray", marks=pytest.mark.skipif(
    RAY_MISSING, reason="ray[serve] is not installed: pip install -r requirements-ray.txt"))])
def engine(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"engine-{request.param}")
    models = folder / "models"
    text_classifier(models / TEXT)
    text_classifier(models / FRESH)
    image_classifier(models / IMAGE)
    tiny_stable_diffusion(models / SD)
    public = make_public(folder / "public")
    try:
        proc, url = start_models_server(folder, models, public, token=TOKEN, engine=request.param, replicas=2,
                                        deployment="full",
                                        extra=("batch_wait_ms: 200",))  # time for a burst to gather, on both
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield request.param, url, public, proc
    proc.terminate()
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the {request.param} models server did not stop within 90 s of SIGTERM")


def post(url: str, model: str, body: dict, headers: dict | None = None) -> requests.Response:
    return requests.post(f"{url}/models/{model}", json=body, headers=AUTH if headers is None else headers, timeout=120)


def test_status_routes(engine):
    _, url, _, _ = engine
    assert requests.get(url + "/running", headers=AUTH, timeout=5).json() == {"running": True}
    assert requests.get(f"{url}/status/{TEXT}", headers=AUTH, timeout=5).json()["loaded"] is True
    assert requests.get(url + "/status/facebook/bart-large-cnn", headers=AUTH, timeout=5).json()["loaded"] is False
    assert requests.get(url + "/status/nobody/nothing", headers=AUTH, timeout=5).json()["loaded"] is False
    rows = {r["id"]: r for r in requests.get(url + "/models", headers=AUTH, timeout=5).json()["models"]}
    assert rows[TEXT]["servable"] and rows[IMAGE]["servable"] and not rows["facebook/bart-large-cnn"]["servable"]


def test_text_and_image_answers(engine):
    _, url, public, _ = engine
    labels = post(url, TEXT, {"text": "a great movie"}).json()
    assert labels[0]["label"] in ("POSITIVE", "NEGATIVE") and 0 <= labels[0]["score"] <= 1
    by_path = post(url, IMAGE, {"img_url": "/examples/red.png"}).json()
    data = base64.b64encode((public / "examples" / "red.png").read_bytes()).decode()
    by_uri = post(url, IMAGE, {"img_url": f"data:image/png;base64,{data}"}).json()
    assert [x["label"] for x in by_path] == [x["label"] for x in by_uri]
    assert {x["label"] for x in by_path} <= {"tabby cat", "golden retriever", "rocket"}


def test_generated_files_are_served_with_the_token(engine):
    _, url, public, _ = engine
    made = post(url, "canny-control", {"img_url": "/examples/red.png"})
    assert made.status_code == 200, made.text
    path = made.json()["path"]
    assert (public / path.lstrip("/")).is_file()  # in this server's public/, whichever replica made it
    assert requests.get(url + path, timeout=5).status_code == 401
    got = requests.get(url + path, headers=AUTH, timeout=5)
    assert got.status_code == 200 and Image.open(io.BytesIO(got.content)).size == (80, 60)


@pytest.mark.parametrize("model, body, status, words", [
    ("nobody/nothing", {"text": "x"}, 404, "unknown model"),
    ("facebook/bart-large-cnn", {"text": "x"}, 404, "weights"),
    (TEXT, {"nope": 1}, 400, "`text` is required"),
    (IMAGE, {"img_url": "/examples/../../secret.txt"}, 400, "outside public/"),
    (IMAGE, {"img_url": "http://127.0.0.1:9/x.png"}, 400, "refusing"),
    (IMAGE, {"img_url": "data:image/png;base64,aGVsbG8="}, 400, "not a readable image"),
])
def test_bad_requests_get_json_errors(engine, model, body, status, words):
    _, url, _, _ = engine
    resp = post(url, model, body)
    assert resp.status_code == status and words in resp.json()["error"]["message"], resp.text


def test_the_token_guards_inference(engine):
    _, url, _, _ = engine
    assert post(url, TEXT, {"text": "hi"}, headers={}).status_code == 401


def test_concurrent_requests_all_answer(engine):
    _, url, _, _ = engine
    codes: list[int] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        resp = post(url, TEXT if i % 2 else IMAGE, {"text": f"movie {i}"} if i % 2 else {"img_url": "/examples/red.png"})
        with lock:
            codes.append(resp.status_code)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert codes == [200] * 8


def test_concurrent_requests_of_one_model_share_batches_with_their_own_answers(engine):
    """Batching on both engines (flask: batching.Batcher; ray: @serve.batch): eight callers at once get what each
    gets alone, a text too long for the model fails only its caller, and some requests shared a batch."""
    _, url, _, _ = engine
    texts = [" ".join(["movie"] * (k + 1)) for k in range(8)]  # lengths differ, so answers differ
    alone = [post(url, TEXT, {"text": t}).json() for t in texts]
    assert len({str(a) for a in alone}) == 8
    bodies = [{"text": t} for t in texts] + [{"text": " ".join(["movie"] * 300)}]  # past 128 positions
    sizes = []
    for _ in range(2):
        out: list = [None] * len(bodies)
        gate = threading.Barrier(len(bodies))

        def go(k: int) -> None:
            gate.wait()
            out[k] = post(url, TEXT, bodies[k])

        threads = [threading.Thread(target=go, args=(k,)) for k in range(len(bodies))]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
        assert [r.status_code for r in out] == [200] * 8 + [500], [r.text for r in out]
        for a, r in zip(alone, out, strict=False):
            got = r.json()
            assert got[0]["label"] == a[0]["label"] and abs(got[0]["score"] - a[0]["score"]) < 1e-6, (got, a)
        assert TEXT in out[8].json()["error"]["message"]
        sizes += [int(r.headers["X-Batch-Size"]) for r in out[:8]]
    assert max(sizes) > 1, sizes


def test_ray_serves_from_two_running_replicas(engine):
    """Only for Ray: the deployment Serve reports is running with the replicas asked for."""
    name, url, _, _ = engine
    if name != "ray":
        pytest.skip("Ray-specific")
    import json

    code = ("import ray, json; from ray import serve; ray.init(address='auto', log_to_driver=False); "
            "print(json.dumps({a: {d: [v.status, dict(v.replica_states)] for d, v in s.deployments.items()} "
            "for a, s in serve.status().applications.items()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    apps = json.loads(out.stdout.strip().splitlines()[-1])
    deployments = [d for app in apps.values() for d in app.values()]
    assert deployments and all(status == "HEALTHY" for status, _ in deployments), apps
    assert all(states.get("RUNNING") == 2 for _, states in deployments), apps


def test_the_catalog_gives_gpu_shares_for_ray():
    from hugginggpt.modelhost.registry import load_specs

    shares = {s.id: s.gpu_fraction for s in load_specs()}
    assert shares["stable-diffusion-v1-5/stable-diffusion-v1-5"] == 0.5 and shares["canny-control"] == 0.0
    assert shares[TEXT] == 0.25
    assert Path(ROOT / "requirements-ray.txt").read_text().count("ray[serve]") == 1


def test_a_watched_diffusion_call_streams_its_steps_then_its_file(engine):
    """Accept: text/event-stream: the steps as the pipeline runs them (in a Ray replica too), then the result."""
    name, url, public, _ = engine
    resp = requests.post(f"{url}/models/{SD}", json={"text": "a red square", "steps": 6}, timeout=120, stream=True,
                         headers={**AUTH, "Accept": "text/event-stream"})
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(resp)
    assert [e["step"] for kind, e in events if kind == "progress" and "step" in e] == [1, 2, 3, 4, 5, 6], events
    assert events[-1][0] == "result"
    path = events[-1][1]["path"]
    assert (public / path.lstrip("/")).is_file()  # written into the front's public/ (from the replica's bytes)
    plain = post(url, SD, {"text": "a red square", "steps": 2})
    assert plain.status_code == 200 and plain.json()["path"].startswith("/images/")


def test_a_watched_first_call_hears_its_model_load_then_gets_its_answer(engine):
    """In a Ray replica the load happens in Serve's multiplexing: the watched call still hears `loading`."""
    _name, url, _, _ = engine
    resp = requests.post(f"{url}/models/{FRESH}", json={"text": "what a day"}, timeout=120, stream=True,
                         headers={**AUTH, "Accept": "text/event-stream"})
    events = sse(resp)
    phases = [e["phase"] for kind, e in events if kind == "progress"]
    assert "loading" in phases, events
    assert events[-1][0] == "result" and {"label", "score"} <= set(events[-1][1][0]), events


def test_a_client_that_leaves_a_watched_call_stops_its_run_and_frees_the_model(engine):
    """In a Ray replica too: the stream's end reaches the replica, whose run stops at its next step, and the log
    says why (not as a failed inference)."""
    name, url, _, proc = engine
    resp = requests.post(f"{url}/models/{SD}", json={"text": "a long one", "steps": 150}, timeout=120, stream=True,
                         headers={**AUTH, "Accept": "text/event-stream"})
    seen = ""
    for line in resp.iter_lines(decode_unicode=True):
        seen = line
        if line.startswith("data: ") and '"step":2,' in line:
            break
    resp.close()  # the client leaves at step 2 of 150
    assert '"step":2,' in seen, seen
    wait_until(lambda: "stopped: its client left" in proc.log_path.read_text(), timeout=30,
               what=f"the {name} models server to stop the run")
    assert f"{SD} failed" not in proc.log_path.read_text()
    started = time.monotonic()
    after = post(url, SD, {"text": "next", "steps": 2})  # not behind 148 more steps
    assert after.status_code == 200 and time.monotonic() - started < 20, name


def test_a_one_shot_caller_that_leaves_stops_its_run_too(engine):
    """JARVIS's one-shot call, whose client closes its socket mid-run: on either engine the run stops at its next
    step (on Ray, the front's cancellation reaches the replica), as for a watched call."""
    import json
    import socket
    from urllib.parse import urlsplit

    name, url, _, proc = engine

    def stopped() -> int:
        return proc.log_path.read_text().count("stopped: its client left")

    assert post(url, SD, {"text": "warm", "steps": 1}).status_code == 200  # loaded: the run, not the load, is cut
    before = stopped()
    where = urlsplit(url)
    payload = json.dumps({"text": "a long one", "steps": 150}).encode()
    sock = socket.create_connection((where.hostname, where.port), timeout=30)
    sock.sendall(f"POST /models/{SD} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {TOKEN}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
    time.sleep(0.5)  # the run has begun (150 tiny steps take seconds)
    sock.close()
    wait_until(lambda: stopped() > before, timeout=30, what=f"the {name} models server to stop the one-shot run")
    assert f"{SD} failed" not in proc.log_path.read_text()
