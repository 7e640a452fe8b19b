"""The models server on "another machine": its own public/ folder, a token, and outputs that travel.

The real models_server.py runs tiny models with one public/ folder; the orchestrator runs with another.
A chain (edge map -> classify the edge map) must work, and every file the answer names must be one the
orchestrator itself serves.
"""

from __future__ import annotations

import base64
import io
import json
import time

import pytest
import requests
from PIL import Image

from tests.conftest import free_port, make_public, start_server, stop_server, write_config
from tests.fakes.llm_server import ThreadedServer
from tests.test_models_server import start_models_server
from tests.tiny_models import BUILDERS

TOKEN = "models-token-7f3a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def gpu_box(tmp_path_factory):
    """The models server with its own folders, as on a separate GPU machine."""
    box = tmp_path_factory.mktemp("gpu-box")
    models_dir = box / "models"
    BUILDERS["google/vit-base-patch16-224"](models_dir / "google/vit-base-patch16-224")
    public = make_public(box / "public")
    proc, url = start_models_server(box, models_dir, public, token=TOKEN)
    yield url, public
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def orchestrator(tmp_path, llm, gpu_box):
    url, _ = gpu_box
    own_public = make_public(tmp_path / "orchestrator-public")
    config = write_config(tmp_path, llm.base_url, url, own_public, local_deployment="standard",
                          semantic_ranking=False, models_server_token=TOKEN)
    srv = start_server(config, tmp_path)
    yield srv, own_public
    stop_server(srv)


def test_a_chain_runs_across_two_public_folders(orchestrator, gpu_box, llm):
    srv, own_public = orchestrator
    _, box_public = gpu_box
    llm.on("parse_task", json.dumps([
        {"task": "canny-control", "id": 0, "dep": [-1], "args": {"image": "/examples/red.png"}},
        {"task": "image-classification", "id": 1, "dep": [0], "args": {"image": "<GENERATED>-0"}},
    ]))
    resp = srv.post("/hugginggpt", {"messages": [{"role": "user", "content": "edges, then classify them"}]},
                    timeout=120)
    assert resp.status_code == 200, resp.text
    answer = resp.json()["message"]
    results = srv.post("/results", {"messages": [{"role": "user", "content": "edges, then classify them"}]},
                       timeout=120).json()
    edge = results["0"]["inference result"]["generated image"]
    assert edge.startswith("/images/")
    # the orchestrator holds and serves the file; the dependent task read it
    assert (own_public / edge.lstrip("/")).is_file()
    served = requests.get(srv.url + edge, timeout=5)
    assert served.status_code == 200
    assert Image.open(io.BytesIO(served.content)).size == (80, 60)
    assert "error" not in results["1"]["inference result"], results["1"]
    assert results["1"]["task"]["args"]["image"] == edge
    labels = {p["label"] for p in results["1"]["inference result"]["predicted"]}
    assert labels <= {"tabby cat", "golden retriever", "rocket"}
    # the models server wrote its own copy in its own folder (two separate disks)
    assert list((box_public / "images").glob("*.png"))
    # every file the answer names is one the orchestrator serves
    for path in {p for p in answer.split() if p.strip("'\",.()[]{}").startswith("/images/")}:
        assert requests.get(srv.url + path.strip("'\",.()[]{}"), timeout=5).status_code == 200


def test_the_models_server_serves_outputs_only_with_its_token_and_only_inside_public(gpu_box):
    url, box_public = gpu_box
    data = base64.b64encode((box_public / "examples" / "red.png").read_bytes()).decode()
    made = requests.post(url + "/models/canny-control", json={"img_url": f"data:image/png;base64,{data}"},
                         headers=AUTH, timeout=60).json()["path"]
    assert requests.get(url + made, timeout=5).status_code == 401
    got = requests.get(url + made, headers=AUTH, timeout=5)
    assert got.status_code == 200 and got.headers["X-Content-Type-Options"] == "nosniff"
    (box_public / "images" / "escape.png").symlink_to(box_public.parent / "models.yaml")
    assert requests.get(url + "/images/escape.png", headers=AUTH, timeout=5).status_code == 404
    assert requests.get(url + "/images/..%2fmodels.yaml", headers=AUTH, timeout=5).status_code == 404


def test_a_result_url_is_fetched_under_the_url_policy(tmp_path, llm):
    """A models server answering {"path": "http://<internal>"} does not make the orchestrator fetch it."""
    from flask import Flask, jsonify

    hits: list[str] = []
    inside = Flask("inside")

    @inside.get("/secret.png")
    def secret():
        hits.append("secret")
        return "internal"

    inner = ThreadedServer(inside).start()
    rogue = Flask("rogue-models")

    @rogue.get("/running")
    def running():
        return jsonify({"running": True})

    @rogue.get("/status/<path:mid>")
    def status(mid):
        return jsonify({"loaded": True})

    @rogue.post("/models/<path:mid>")
    def infer(mid):
        return jsonify({"path": inner.url + "/secret.png"})

    rogue_srv = ThreadedServer(rogue).start()
    public = make_public(tmp_path / "public")
    srv = start_server(write_config(tmp_path, llm.base_url, rogue_srv.url, public, semantic_ranking=False), tmp_path)
    try:
        llm.on("parse_task", json.dumps([{"task": "text-to-image", "id": 0, "dep": [-1], "args": {"text": "x"}}]))
        results = srv.post("/results", {"messages": [{"role": "user", "content": "draw x"}]}).json()
        message = results["0"]["inference result"]["error"]["message"]
        assert "output URL" in message and "refusing" in message
        assert hits == []
    finally:
        stop_server(srv)
        rogue_srv.stop()
        inner.stop()


def test_outputs_a_models_server_names_are_only_its_generated_files_and_within_the_size_limit(tmp_path):
    """A models server (on another machine, perhaps compromised) names its outputs: only a plain
    /images|audios|videos/<name> is copied, and no more than max_output_mb of it."""
    from flask import Flask, Response, jsonify

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.errors import BackendError

    named = {"dots": "/images/../../secret.txt", "abs": "/etc/passwd", "deep": "/images/a/b.png",
             "big": "/images/big.png", "ok": "/images/small.png"}
    rogue = Flask("rogue-models")

    @rogue.post("/models/<path:mid>")
    def infer(mid):
        return jsonify({"path": named[mid]})

    @rogue.get("/images/<name>")
    def image(name):
        size = 3 * 1024 * 1024 if name == "big.png" else 100
        return Response((b"\x89PNG" + b"\0" * size for _ in range(1)), mimetype="image/png")

    srv = ThreadedServer(rogue).start()
    public = make_public(tmp_path / "public")
    backend = LocalModelsServer(srv.url, public, max_output_bytes=1024 * 1024)
    try:
        for mid in ("dots", "abs", "deep"):
            with pytest.raises(BackendError, match="not a generated file"):
                backend.infer(mid, TaskInputs("text-to-image", text="x"))
        with pytest.raises(BackendError, match="larger than the 1 MiB output limit"):
            backend.infer("big", TaskInputs("text-to-image", text="x"))
        copied = backend.infer("ok", TaskInputs("text-to-image", text="x"))["generated image"]
        assert copied.startswith("/images/") and (public / copied.lstrip("/")).stat().st_size == 104
        assert sorted(p.name for p in (public / "images").iterdir()) == [copied.rsplit("/", 1)[1]]
    finally:
        srv.stop()


def test_many_calls_at_once_reuse_their_connections(models, models_server, public_dir, caplog):
    """The client keeps as many connections as requests in flight: none is closed and reopened per call (a pool
    of 10 under 30 calls at once logs 'Connection pool is full, discarding connection' and costs a connect)."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer

    model = "dslim/bert-base-NER"
    models.delays[model] = 0.2
    client = LocalModelsServer(models_server[1], public_dir, connections=64)
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    with ThreadPoolExecutor(30) as pool:
        results = list(pool.map(lambda _: client.infer(model, TaskInputs(task="token-classification", text="Anna")),
                                range(60)))
    assert all("error" not in r for r in results)
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_a_models_server_that_is_down_reads_as_unreachable_and_one_too_slow_as_timed_out(tmp_path):
    """urllib3 calls a refused connection a kind of timeout; the user must read which of the two it was, and
    a status check of a server that is down says "not available" (no exception)."""
    from flask import Flask, jsonify

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.errors import BackendError

    public = make_public(tmp_path / "public")
    down = LocalModelsServer(f"http://127.0.0.1:{free_port()}", public, task_timeout=5)
    with pytest.raises(BackendError, match=r"unreachable \(ConnectionError\)"):
        down.infer("dslim/bert-base-NER", TaskInputs("token-classification", text="Anna"))
    assert down.is_available("dslim/bert-base-NER") is False and down.running() is False

    slow = Flask("slow-models")

    @slow.post("/models/<path:mid>")
    def infer(mid):
        time.sleep(3)
        return jsonify([])

    srv = ThreadedServer(slow).start()
    try:
        with pytest.raises(BackendError, match="timed out after 1s"):
            LocalModelsServer(srv.url, public, task_timeout=1).infer("x/y", TaskInputs("token-classification", text="a"))
    finally:
        srv.stop()


def test_a_failed_copy_leaves_the_next_call_on_its_connection_unharmed(tmp_path):
    """A file the models server names but cannot hand over (404, or over the size limit) is an error for that
    task only: the connection it was asked on is not handed to the next call with the unread answer in it.
    (A plain HTTP/1.1 keep-alive server, as Python's own: the answer to the next call would read as broken.)"""
    import threading
    from http.server import BaseHTTPRequestHandler

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.errors import BackendError
    from tests.test_llm_connections import QuietServer

    class Forgetful(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path.endswith("/ner/ok"):
                return self.send(200, json.dumps([{"entity_group": "PER", "word": "Anna", "score": 0.9}]).encode())
            return self.send(200, json.dumps({"path": "/images/big.png" if self.path.endswith("/draw/big")
                                                      else "/images/gone.png"}).encode())

        def do_GET(self):
            if self.path.endswith("/big.png"):
                return self.send(200, b"\x89PNG" + b"\0" * (2 * 1024 * 1024))
            return self.send(404, b"no such file, and a body the client must not leave unread " * 20)

    srv = QuietServer(("127.0.0.1", 0), Forgetful)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    backend = LocalModelsServer(f"http://127.0.0.1:{srv.server_address[1]}", make_public(tmp_path / "public"),
                                max_output_bytes=1024 * 1024)
    try:
        for failing, why in (("draw/gone", "HTTP 404"), ("draw/big", "larger than the 1 MiB output limit")):
            for _ in range(3):
                with pytest.raises(BackendError, match=why):
                    backend.infer(failing, TaskInputs("text-to-image", text="a fox"))
                result = backend.infer("ner/ok", TaskInputs("token-classification", text="Anna"))
                assert "error" not in result, result
    finally:
        srv.shutdown()


def test_a_models_server_that_redirects_is_not_followed(tmp_path):
    """The configured address is the trusted one: a redirect is reported, not followed (and a lone surrogate in
    a task's text travels escaped, as JSON allows, instead of failing the call)."""
    from flask import Flask, jsonify, redirect, request

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.errors import BackendError

    seen = []
    app = Flask("moving-models")

    @app.post("/models/<path:mid>")
    def infer(mid):
        if mid == "moved/away":
            return redirect("http://169.254.169.254/latest/meta-data", code=307)
        seen.append(request.get_json()["text"])
        return jsonify([])

    srv = ThreadedServer(app).start()
    backend = LocalModelsServer(srv.url, make_public(tmp_path / "public"))
    try:
        with pytest.raises(BackendError, match=r"HTTP 307 \(a redirect to 'http://169.254.169.254/.*local_inference_"):
            backend.infer("moved/away", TaskInputs("token-classification", text="Anna"))
        assert "error" not in backend.infer("ner/ok", TaskInputs("token-classification", text="a\ud800b"))
        assert seen == ["a\ud800b"]
    finally:
        srv.stop()


def test_a_copy_cut_at_its_deadline_says_it_was_slow_and_errors_keep_requests_names(tmp_path):
    """A generated file that takes longer than the copy deadline reads as slow (the deadline shuts the socket,
    which would otherwise read as a broken connection); the other failures keep the names the messages always
    used (requests': ConnectionError, ConnectTimeout, ReadTimeout, InvalidURL)."""
    import urllib3
    from flask import Flask, Response, jsonify

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer, _cause
    from hugginggpt.errors import BackendError

    app = Flask("slow-copies")

    @app.post("/models/<path:mid>")
    def infer(mid):
        return jsonify({"path": "/images/slow.png"})

    @app.get("/images/<name>")
    def image(name):
        time.sleep(3)
        return Response(b"\x89PNG", mimetype="image/png")

    srv = ThreadedServer(app).start()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError, match=r"copying /images/slow.png from the models server took longer than 1s"):
            LocalModelsServer(srv.url, make_public(tmp_path / "public"), copy_timeout=1).infer(
                "draw/slowly", TaskInputs("text-to-image", text="a fox"))
        assert time.monotonic() - started < 2.5
    finally:
        srv.stop()
    errors = urllib3.exceptions
    assert _cause(errors.NewConnectionError(None, "refused")) == "ConnectionError"
    assert _cause(errors.ProtocolError("reset")) == "ConnectionError"
    assert _cause(errors.ConnectTimeoutError()) == "ConnectTimeout"
    assert _cause(errors.ReadTimeoutError(None, "/x", "slow")) == "ReadTimeout"
    assert _cause(errors.LocationParseError("http://[::1")) == "InvalidURL"
    assert _cause(errors.SSLError("bad certificate")) == "SSLError"


def _self_signed(folder):
    """A certificate for 127.0.0.1 that no CA signed: what a misconfigured or impostor models server shows."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_an_https_models_server_is_verified_and_an_untrusted_certificate_refused(tmp_path):
    """The models server may be another machine reached over https: its certificate is checked against the CA
    bundle (certifi's, as requests used), so one nobody signed is an error naming TLS, never data accepted."""
    import threading

    from flask import Flask, jsonify
    from werkzeug.serving import make_server

    from hugginggpt.backends import TaskInputs
    from hugginggpt.backends.local import LocalModelsServer
    from hugginggpt.errors import BackendError

    impostor = Flask("impostor")
    calls = []

    @impostor.post("/models/<path:mid>")
    def infer(mid):
        calls.append(mid)
        return jsonify([{"entity_group": "PER", "word": "Anna", "score": 0.99}])

    @impostor.get("/status/<path:mid>")
    def status(mid):
        return jsonify({"loaded": True})

    cert, key = _self_signed(tmp_path)
    srv = make_server("127.0.0.1", 0, impostor, threaded=True, ssl_context=(str(cert), str(key)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = LocalModelsServer(f"https://127.0.0.1:{srv.server_port}", make_public(tmp_path / "public"),
                                   task_timeout=5)
        with pytest.raises(BackendError, match="SSLError"):
            client.infer("dslim/bert-base-NER", TaskInputs("token-classification", text="Anna"))
        assert client.is_available("dslim/bert-base-NER") is False
        assert calls == []  # nothing was sent past the handshake
    finally:
        srv.shutdown()
