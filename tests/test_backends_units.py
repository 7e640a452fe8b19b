"""The backends alone (hugginggpt/backends/): the client of our local models server, the Hugging Face hosted backend
(Inference Providers through the Hub's router, or an own endpoint) and the normalisation of their answers, each
against fakes on loopback, the way the product talks to them. Each behaviour is pinned where a user would notice it
broken (mutation audit: docs/TESTING.md).

Fakes: a scriptable models server and a scriptable hosted endpoint (below, in-process), the fake Hub and router
(tests/fakes/router_server.py) with a recorder of every request it receives, and bare-socket peers for answers that
dribble, stall, break off or never let a connection in."""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import urllib3
from flask import Flask, Response, jsonify, request
from PIL import Image

from hugginggpt import cancel, urlpolicy
from hugginggpt.backends import HostedFailure, ModelStatus, TaskInputs
from hugginggpt.backends import hosted as hosted_mod
from hugginggpt.backends.failures import Failure, one_line, provider_failure, status_of, timed_out
from hugginggpt.backends.hosted import HostedInference, Route, plain
from hugginggpt.backends.hubclient import HostedCall, hosted_call, on_request
from hugginggpt.backends.local import LocalModelsServer, _cause
from hugginggpt.backends.normalize import BOX_COLORS, draw_boxes, normalize, overlay_masks, path_key
from hugginggpt.config import load_config
from hugginggpt.errors import BackendError
from hugginggpt.resources import Resource
from hugginggpt.urlpolicy import UrlPolicy, deadline_scope
from tests.conftest import write_config
from tests.fakes.llm_server import ThreadedServer
from tests.fakes.router_server import FakeRouter, Served

LOOPBACK = UrlPolicy.from_entries(["127.0.0.1"])
TOKEN = "hf_backends_unit_token"


def png(size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def wav() -> bytes:
    out = io.BytesIO()
    sf.write(out, np.zeros(800, dtype="float32"), 16000, format="WAV")
    return out.getvalue()


def image_input(size: tuple[int, int] = (40, 30), color: tuple[int, int, int] = (0, 0, 0)) -> Resource:
    return Resource(png(size, color), "image/png", "/examples/x.png")


def audio_input() -> Resource:
    return Resource(wav(), "audio/wav", "/examples/x.wav")


def opened(public: Path, path: str) -> Path:
    assert path.startswith("/"), path
    return public / path.lstrip("/")


# -- bare-socket peers -------------------------------------------------------------------------------------------


class Peer:
    """A loopback HTTP peer on a bare socket. `mode`: "stall" (silence), "dribble" (headers, then a byte every
    0.1 s, no length said), "cut" (a Content-Length it never fulfils, then it hangs up), "hold" (a Content-Length it never
    fulfils, then silence), "big" (`size` bytes, then silence), "close" (hangs up before answering)."""

    def __init__(self, mode: str, size: int = 0, seconds: float = 5.0):
        self.mode, self.size, self.seconds = mode, size, seconds
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = threading.Event()
        self.requests: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.requests.append(conn.recv(65536).decode("latin-1"))
                if self.mode == "close":
                    return
                if self.mode == "stall":
                    self.stop.wait(self.seconds)
                    return
                length = b"Content-Length: 1000\r\n" if self.mode in ("cut", "hold") else b""
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + length +
                             b"Connection: close\r\n\r\n")
                if self.mode in ("cut", "hold"):
                    conn.sendall(b"x" * 10)
                    if self.mode == "hold":
                        self.stop.wait(self.seconds)
                    return
                if self.mode == "big":
                    conn.sendall(b"x" * self.size)
                until = time.monotonic() + self.seconds
                while time.monotonic() < until and not self.stop.is_set():
                    if self.mode == "dribble":
                        conn.sendall(b" ")
                    time.sleep(0.1)
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


class Backlogged:
    """A listening socket whose one-place queue is taken: a further connect hangs (its SYN is dropped)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(0)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.held = socket.create_connection(("127.0.0.1", self.port))

    def close(self) -> None:
        self.held.close()
        self.sock.close()


@pytest.fixture
def peers():
    made: list[Any] = []

    def make(kind: str, **kw) -> Any:
        peer = Backlogged() if kind == "backlogged" else Peer(kind, **kw)
        made.append(peer)
        return peer

    yield make
    for peer in made:
        peer.close()


# -- the fake local models server --------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int = 200
    body: Any = None  # JSON, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class FakeModelsPeer:
    """Our models server on another machine: `answers[model]` for POST /models/<model>, `files["images/x.png"]` for
    GET of a generated file, `status[model]` for /status/<model>, `running` for /running; `token`: every request
    must carry it; `prefix`: the path it is served under (behind a proxy). Every request is recorded (method, path,
    Authorization, Content-Type, body)."""

    answers: dict[str, Answer] = field(default_factory=dict)
    files: dict[str, Answer] = field(default_factory=dict)
    status: dict[str, Answer] = field(default_factory=dict)
    running: Answer = field(default_factory=lambda: Answer(body={"running": True}))
    token: str | None = None
    prefix: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def reset(self) -> None:
        self.answers.clear()
        self.files.clear()
        self.status.clear()
        self.running = Answer(body={"running": True})
        self.token = None
        self.prefix = ""
        self.calls.clear()

    def paths(self) -> list[str]:
        return [f"{c['method']} {c['path']}" for c in self.calls]

    @staticmethod
    def send(answer: Answer) -> Response:
        time.sleep(answer.delay)
        if isinstance(answer.body, bytes):
            resp = Response(answer.body, status=answer.status)
        else:
            resp = Response(json.dumps(answer.body), status=answer.status, mimetype="application/json")
        for name, value in answer.headers.items():
            if value is None:
                del resp.headers[name]
            else:
                resp.headers[name] = value
        return resp

    def app(self) -> Flask:
        app = Flask("fake-models-peer")
        app.url_map.merge_slashes = False

        @app.route("/<path:path>", methods=["GET", "POST"])
        def any_path(path: str) -> Response:
            self.calls.append({"method": request.method, "path": request.environ.get("RAW_URI"),
                               "authorization": request.headers.get("Authorization"),
                               "content_type": request.headers.get("Content-Type"),
                               "json": request.get_json(silent=True), "data": request.get_data()})
            if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
                return jsonify({"error": "unauthorized"}), 401
            if not path.startswith(self.prefix):
                return jsonify({"error": "not found"}), 404
            path = path.removeprefix(self.prefix)
            if request.method == "POST" and path.startswith("models/"):
                answer = self.answers.get(path.removeprefix("models/"))
                return self.send(answer) if answer else (jsonify({"error": {"message": "no such model"}}), 404)
            if path.startswith("status/"):
                answer = self.status.get(path.removeprefix("status/"))
                return self.send(answer) if answer else jsonify({"loaded": False})
            if path == "running":
                return self.send(self.running)
            if path in self.files:
                return self.send(self.files[path])
            return jsonify({"error": "not found"}), 404

        return app


@pytest.fixture(scope="module")
def models_peer_server():
    fake = FakeModelsPeer()
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def peer(models_peer_server):
    fake, _ = models_peer_server
    fake.reset()
    return fake


@pytest.fixture
def peer_url(models_peer_server) -> str:
    return models_peer_server[1]


@pytest.fixture
def ours(tmp_path) -> Path:
    """Our own public/ (the models server's is elsewhere)."""
    folder = tmp_path / "public"
    folder.mkdir()
    return folder


def local(url: str, public: Path, **kw) -> LocalModelsServer:
    kw.setdefault("policy", LOOPBACK)
    return LocalModelsServer(url, public, **kw)


# -- local: status and running ---------------------------------------------------------------------------------


def test_status_is_asked_with_the_token_and_loaded_or_loadable_means_available(peer, peer_url, ours):
    peer.token = "models-secret"
    peer.status["acme/loaded"] = Answer(body={"loaded": True})
    peer.status["acme/loadable"] = Answer(body={"loaded": False, "loadable": True})
    peer.status["acme/neither"] = Answer(body={"loaded": False, "loadable": False})
    peer.status["acme/teapot"] = Answer(status=418, body={"loaded": True, "loadable": True})
    peer.status["acme/list"] = Answer(body=["loaded"])
    peer.status["acme/html"] = Answer(body=b"<html>maintenance</html>")
    backend = local(peer_url + "/", ours, token="models-secret")
    assert backend.is_available("acme/loaded") is True
    assert backend.is_available("acme/loadable") is True
    assert backend.is_available("acme/neither") is False
    assert backend.is_available("acme/teapot") is False  # only a 200 answer counts
    assert backend.is_available("acme/list") is False
    assert backend.is_available("acme/html") is False
    assert peer.paths()[0] == "GET /status/acme/loaded"
    assert {c["authorization"] for c in peer.calls} == {"Bearer models-secret"}
    assert local(peer_url, ours, token="wrong").is_available("acme/loaded") is False


def test_a_model_id_is_quoted_in_the_path(peer, peer_url, ours):
    peer.status["acme/a b"] = Answer(body={"loaded": True})
    assert local(peer_url, ours).is_available("acme/a b") is True
    assert peer.calls[-1]["path"] == "/status/acme/a%20b"


def test_without_a_token_no_authorization_is_sent(peer, peer_url, ours):
    peer.status["acme/m"] = Answer(body={"loaded": True})
    peer.answers["acme/m"] = Answer(body={"generated text": "hi"})
    backend = local(peer_url, ours)
    assert backend.is_available("acme/m") and backend.running()
    backend.infer("acme/m", TaskInputs("summarization", text="x"))
    assert [c["authorization"] for c in peer.calls] == [None, None, None]


def test_running_says_what_the_models_server_says(peer, peer_url, ours, peers):
    backend = local(peer_url, ours, token="t")
    assert backend.running() is True
    assert peer.paths() == ["GET /running"] and peer.calls[0]["authorization"] == "Bearer t"
    peer.running = Answer(body={"running": False})
    assert backend.running() is False
    peer.running = Answer(body=b"not json")
    assert backend.running() is False
    peer.running = Answer(body=["running"])
    assert backend.running() is False
    assert local("http://127.0.0.1:9", ours).running() is False
    assert local(peers("close").url, ours).running() is False


def test_a_status_that_takes_too_long_is_not_available(peer, peer_url, ours):
    peer.status["acme/slow"] = Answer(body={"loaded": True}, delay=1.5)
    started = time.monotonic()
    assert local(peer_url, ours, status_timeout=0.3).is_available("acme/slow") is False
    assert time.monotonic() - started < 1.2
    assert local(peer_url, ours, status_timeout=3).is_available("acme/slow") is True


def test_an_unreachable_models_server_is_not_available(ours):
    assert local("http://127.0.0.1:9", ours).is_available("acme/m") is False


# -- local: inference ------------------------------------------------------------------------------------------


def test_the_request_body_carries_text_image_and_audio_as_data_uris(peer, peer_url, ours):
    peer.answers["acme/m"] = Answer(body={"generated text": "ok"})
    backend = local(peer_url, ours, token="models-secret")
    image, audio = image_input(), audio_input()
    result = backend.infer("acme/m", TaskInputs("image-to-text", text="what is it", image=image, audio=audio))
    assert result == {"generated text": "ok"}
    call = peer.calls[-1]
    assert call["method"] == "POST" and call["path"] == "/models/acme/m"
    assert call["json"] == {"img_url": image.data_uri(), "audio_url": audio.data_uri(), "text": "what is it"}
    assert call["content_type"] == "application/json" and call["authorization"] == "Bearer models-secret"
    backend.infer("acme/m", TaskInputs("summarization", text="only text"))
    assert peer.calls[-1]["json"] == {"text": "only text"}
    backend.infer("acme/m", TaskInputs("image-classification", image=image))
    assert peer.calls[-1]["json"] == {"img_url": image.data_uri()}
    backend.infer("acme/m", TaskInputs("automatic-speech-recognition", audio=audio))
    assert peer.calls[-1]["json"] == {"audio_url": audio.data_uri()}
    backend.infer("acme/m", TaskInputs("summarization", text=""))
    assert peer.calls[-1]["json"] == {"text": ""}  # an empty text is still the text


def test_a_lone_surrogate_travels_escaped(peer, peer_url, ours):
    peer.answers["acme/m"] = Answer(body={"generated text": "ok"})
    local(peer_url, ours).infer("acme/m", TaskInputs("summarization", text="a\ud800b"))
    assert peer.calls[-1]["data"] == b'{"text": "a\\ud800b"}'


def test_an_error_answer_is_the_servers_error(peer, peer_url, ours):
    backend = local(peer_url, ours)
    peer.answers["acme/e"] = Answer(status=500, body={"error": {"message": "CUDA out of memory"}})
    assert backend.infer("acme/e", TaskInputs("summarization", text="x")) == {"error": {"message": "CUDA out of memory"}}
    peer.answers["acme/e"] = Answer(status=500, body={"error": "plain words"})
    assert backend.infer("acme/e", TaskInputs("summarization", text="x")) == {"error": {"message": "plain words"}}
    # an error status without an error in its JSON says the status
    peer.answers["acme/e"] = Answer(status=500, body={"detail": "boom"})
    assert backend.infer("acme/e", TaskInputs("summarization", text="x")) == {"error": {"message": "HTTP 500"}}
    peer.answers["acme/e"] = Answer(status=400, body=["a", "list"])
    assert backend.infer("acme/e", TaskInputs("summarization", text="x")) == {"error": {"message": "HTTP 400"}}
    # a 2xx answer is the result, whatever its shape
    peer.answers["acme/e"] = Answer(status=299, body=["a", "list"])
    assert backend.infer("acme/e", TaskInputs("summarization", text="x")) == {"predicted": ["a", "list"]}


def test_an_answer_that_is_not_json_is_an_error(peer, peer_url, ours):
    peer.answers["acme/h"] = Answer(status=502, body=b"<html>bad gateway</html>")
    with pytest.raises(BackendError) as info:
        local(peer_url, ours).infer("acme/h", TaskInputs("summarization", text="x"))
    assert str(info.value) == "local models server answered HTTP 502 without JSON for acme/h"


@pytest.mark.parametrize("status", [300, 302, 399])
def test_a_redirect_is_not_followed(peer, peer_url, ours, status):
    peer.answers["acme/moved"] = Answer(status=status, body={"generated text": "from the redirect itself"},
                                        headers={"Location": peer_url + "/models/acme/there"})
    peer.answers["acme/there"] = Answer(body={"generated text": "followed"})
    with pytest.raises(BackendError) as info:
        local(peer_url, ours).infer("acme/moved", TaskInputs("summarization", text="x"))
    assert str(info.value) == (f"the local models server answered HTTP {status} (a redirect to "
                               f"'{peer_url}/models/acme/there'): set local_inference_endpoint to the address that "
                               "answers")
    assert peer.paths() == ["POST /models/acme/moved"]


def test_a_redirect_without_a_location_and_a_long_one(peer, peer_url, ours):
    backend = local(peer_url, ours)
    peer.answers["acme/moved"] = Answer(status=307, body={})
    with pytest.raises(BackendError, match=r"HTTP 307 \(a redirect to '\?'\): "):
        backend.infer("acme/moved", TaskInputs("summarization", text="x"))
    long = "http://elsewhere.example/" + "a" * 400
    peer.answers["acme/moved"] = Answer(status=307, body={}, headers={"Location": long})
    with pytest.raises(BackendError) as info:
        backend.infer("acme/moved", TaskInputs("summarization", text="x"))
    assert f"(a redirect to {long[:200]!r})" in str(info.value)


def test_a_trailing_slash_in_the_address_is_dropped(peer, peer_url, ours):
    peer.answers["acme/m"] = Answer(body={"generated text": "ok"})
    assert local(peer_url + "/", ours).infer("acme/m", TaskInputs("summarization", text="x")) == {
        "generated text": "ok"}
    assert peer.paths() == ["POST /models/acme/m"]


def test_a_models_server_under_a_path_given_with_a_trailing_slash(peer, peer_url, ours):
    """Behind a proxy at /BOX/, written with its slash: every call goes under that path, with one slash (and the X
    that ends the path is kept)."""
    peer.prefix = "BOX/"
    peer.status["acme/m"] = Answer(body={"loaded": True})
    peer.answers["acme/m"] = Answer(body={"path": "/images/fox.png"})
    peer.files["images/fox.png"] = Answer(body=png())
    backend = local(peer_url + "/BOX/", ours)
    assert backend.running() is True and backend.is_available("acme/m") is True
    result = backend.infer("acme/m", TaskInputs("text-to-image", text="a fox"))
    assert opened(ours, result["generated image"]).read_bytes() == png()
    assert peer.paths() == ["GET /BOX/running", "GET /BOX/status/acme/m", "POST /BOX/models/acme/m",
                            "GET /BOX/images/fox.png"]


def test_an_unreachable_server_and_a_connection_cut_before_an_answer(ours, peers):
    with pytest.raises(BackendError) as info:
        local("http://127.0.0.1:9", ours).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server is unreachable (ConnectionError)"
    with pytest.raises(BackendError) as info:  # not a timeout, though the call runs under a deadline
        local(peers("close").url, ours, task_timeout=30).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server is unreachable (ConnectionError)"
    with pytest.raises(BackendError) as info:
        local("http://127.0.0.1:99999", ours).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server is unreachable (InvalidURL)"


def test_a_model_call_that_takes_too_long_times_out(peer, peer_url, ours):
    peer.answers["acme/slow"] = Answer(body={"generated text": "late"}, delay=2.0)
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peer_url, ours, task_timeout=1.0).infer("acme/slow", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server timed out after 1s on acme/slow"
    assert time.monotonic() - started < 1.8


def test_a_model_call_ends_at_the_requests_deadline(ours, peers):
    """The request's deadline comes before task_timeout: the socket is shut then, and the error names the
    deadline (not a 30 s timeout that never happened)."""
    backend = local(peers("stall").url, ours, task_timeout=30)
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 0.5), pytest.raises(BackendError) as info:
        backend.infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the request's deadline passed while the local models server ran acme/m"
    assert time.monotonic() - started < 3


def test_task_timeout_before_the_requests_deadline_is_named_as_itself(ours, peers):
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 60), pytest.raises(BackendError) as info:
        local(peers("stall").url, ours, task_timeout=1.0).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server timed out after 1s on acme/m"
    assert time.monotonic() - started < 3


def test_a_dribbling_answer_ends_at_task_timeout(ours, peers):
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("dribble").url, ours, task_timeout=1.0).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server timed out after 1s on acme/m"
    assert time.monotonic() - started < 2.5


def test_a_connect_that_hangs_ends_at_task_timeout(ours, peers):
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("backlogged").url, ours, task_timeout=0.5).infer("acme/m", TaskInputs("summarization", text="x"))
    assert str(info.value) == "the local models server timed out after 0s on acme/m"
    assert time.monotonic() - started < 2


def test_keep_alive_connections_are_pooled_without_discards(peer, peer_url, ours, caplog):
    """`connections` is about the calls in flight at once (at least 10): a pool that size discards none."""
    peer.answers["acme/m"] = Answer(body={"generated text": "ok"}, delay=0.3)
    backend = local(peer_url, ours, connections=2)

    def burst(n: int) -> None:
        threads = [threading.Thread(target=backend.infer, args=("acme/m", TaskInputs("summarization", text="x")))
                   for _ in range(n)]
        [t.start() for t in threads]
        [t.join() for t in threads]

    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        burst(10)
        assert "Connection pool is full" not in caplog.text
        burst(11)
        assert "Connection pool is full" in caplog.text


# -- local: files the models server generated --------------------------------------------------------------------


def test_a_generated_image_is_copied_into_our_public_folder(peer, peer_url, ours):
    picture = png((64, 48), (10, 20, 30))
    peer.answers["acme/sd"] = Answer(body={"path": "/images/fox.png"})
    peer.files["images/fox.png"] = Answer(body=picture, headers={"Content-Type": "image/png"})
    result = local(peer_url, ours, token="models-secret").infer("acme/sd", TaskInputs("text-to-image", text="a fox"))
    assert set(result) == {"generated image"}
    path = result["generated image"]
    assert path.startswith("/images/") and path.endswith(".png") and path != "/images/fox.png"
    assert opened(ours, path).read_bytes() == picture
    assert peer.paths() == ["POST /models/acme/sd", "GET /images/fox.png"]
    assert peer.calls[-1]["authorization"] == "Bearer models-secret"


def test_generated_audio_and_video_keep_their_kind_and_extension(peer, peer_url, ours):
    backend = local(peer_url, ours)
    peer.answers["acme/tts"] = Answer(body={"path": "public/audios/say.v2.wav"})
    peer.files["audios/say.v2.wav"] = Answer(body=wav())
    result = backend.infer("acme/tts", TaskInputs("text-to-speech", text="hello"))
    assert result["generated audio"].startswith("/audios/") and result["generated audio"].endswith(".wav")
    assert "." not in result["generated audio"].removesuffix(".wav").rsplit("/", 1)[1]
    assert opened(ours, result["generated audio"]).read_bytes() == wav()
    peer.answers["acme/ttv"] = Answer(body={"path": " videos/clip "})
    peer.files["videos/clip"] = Answer(body=b"\x00\x00\x00\x18ftypmp42")
    result = backend.infer("acme/ttv", TaskInputs("text-to-video", text="a clip"))
    assert result["generated video"].startswith("/videos/") and result["generated video"].endswith(".bin")


def test_a_file_in_a_shared_public_folder_is_not_copied(peer, peer_url, ours):
    (ours / "images").mkdir()
    (ours / "images" / "shared.png").write_bytes(png())
    peer.answers["acme/sd"] = Answer(body={"path": "/images/shared.png"})
    result = local(peer_url, ours).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    assert result == {"generated image": "/images/shared.png"}
    assert peer.paths() == ["POST /models/acme/sd"]


def test_a_large_file_is_copied_whole_up_to_the_limit(peer, peer_url, ours):
    data = bytes(range(256)) * 1024  # 256 KiB: several reads
    peer.answers["acme/sd"] = Answer(body={"path": "/images/big.png"})
    peer.files["images/big.png"] = Answer(body=data)
    result = local(peer_url, ours, max_output_bytes=len(data)).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    assert opened(ours, result["generated image"]).read_bytes() == data
    with pytest.raises(BackendError) as info:
        local(peer_url, ours, max_output_bytes=len(data) - 1).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    assert str(info.value) == "/images/big.png on the models server is larger than the 0 MiB output limit"


def test_the_output_limit_is_said_in_mib(peer, peer_url, ours):
    peer.answers["acme/sd"] = Answer(body={"path": "/images/huge.png"})
    peer.files["images/huge.png"] = Answer(body=b"x" * (3 * 1024 * 1024 + 1))
    with pytest.raises(BackendError) as info:
        local(peer_url, ours, max_output_bytes=3 * 1024 * 1024).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    assert str(info.value) == "/images/huge.png on the models server is larger than the 3 MiB output limit"
    assert not list(ours.rglob("*.*"))


def test_a_copy_stops_reading_at_the_limit(ours, peers):
    """A file past the limit that then stalls: the copy stops at the limit, it does not wait for the rest."""
    backend = local(peers("big", size=2 * 1024 * 1024, seconds=5).url, ours, max_output_bytes=1024 * 1024,
                    copy_timeout=3)
    started = time.monotonic()
    with pytest.raises(BackendError, match="larger than the 1 MiB output limit"):
        backend.bring_home("/images/x.png")
    assert time.monotonic() - started < 2


def test_a_failed_copy_says_why(peer, peer_url, ours, peers):
    peer.answers["acme/sd"] = Answer(body={"path": "/images/gone.png"})
    with pytest.raises(BackendError) as info:
        local(peer_url, ours).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    assert str(info.value) == "copying /images/gone.png from the models server failed: HTTP 404"
    peer.files["images/gone.png"] = Answer(status=201, body=png())
    with pytest.raises(BackendError, match="failed: HTTP 201$"):
        local(peer_url, ours).infer("acme/sd", TaskInputs("text-to-image", text="x"))
    with pytest.raises(BackendError) as info:
        local(peers("cut").url, ours, copy_timeout=30).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server failed (ConnectionError)"
    with pytest.raises(BackendError) as info:
        local("http://127.0.0.1:9", ours).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server failed (ConnectionError)"


def test_a_slow_copy_ends_at_copy_timeout(ours, peers):
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("dribble").url, ours, copy_timeout=1.0).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server took longer than 1s"
    assert time.monotonic() - started < 2.5


def test_a_copy_whose_body_stalls_short_of_its_length_ends_at_copy_timeout(ours, peers):
    """The length said, part of it sent, then silence: the deadline shuts the socket mid-body, and that is named as
    slowness (not as a broken connection)."""
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("hold").url, ours, copy_timeout=0.6).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server took longer than 1s"
    assert time.monotonic() - started < 2
    assert not list(ours.rglob("*.*"))


def test_a_silent_copy_is_named_slow_whichever_timer_wakes_first(ours, peers, monkeypatch):
    """The read timeout (copy_timeout) ends with the deadline: on a busy machine it may wake before the watchdog,
    and the copy is still named as slowness, not as a broken connection."""
    monkeypatch.setattr(urlpolicy._WATCHDOG, "add", lambda watch: None)  # the watchdog never fires
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("stall").url, ours, copy_timeout=0.6).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server took longer than 1s"
    assert time.monotonic() - started < 2.5  # the peer says nothing for 5 s
    assert not list(ours.rglob("*.*"))


def test_a_copy_cut_by_the_requests_earlier_deadline_says_so(ours, peers):
    started = time.monotonic()
    with deadline_scope(started + 0.5), pytest.raises(BackendError) as info:
        local(peers("dribble").url, ours, copy_timeout=30).bring_home("/images/a.png")
    assert str(info.value) == "the request's deadline passed while copying /images/a.png from the models server"
    assert time.monotonic() - started < 2.5  # the peer goes on for 5 s
    assert not list(ours.rglob("*.*"))
    with deadline_scope(time.monotonic() + 60), pytest.raises(BackendError) as info:  # a later one: its own timeout
        local(peers("stall").url, ours, copy_timeout=0.5).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server took longer than 0s"


def test_a_copy_whose_connect_hangs_ends_at_status_timeout(ours, peers):
    started = time.monotonic()
    with pytest.raises(BackendError) as info:
        local(peers("backlogged").url, ours, status_timeout=0.3, copy_timeout=3).bring_home("/images/a.png")
    assert str(info.value) == "copying /images/a.png from the models server failed (ConnectTimeout)"
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("named", ["/etc/passwd", "../images/a.png", "/images/../secret.txt", "images/a/b.png",
                                   "X/images/a.png", "/public/uploads/a.png", "ftp://127.0.0.1/images/a.png",
                                   "/images/" + "a" * 300 + ".png"])
def test_a_named_output_that_is_not_a_generated_file_is_refused(peer, peer_url, ours, named):
    with pytest.raises(BackendError) as info:
        local(peer_url, ours).bring_home(named)
    assert str(info.value) == f"the models server named an output that is not a generated file: {named[:200]!r}"
    assert peer.calls == []


def test_an_output_url_is_fetched_under_the_url_policy(peer, peer_url, ours):
    picture = png((8, 8), (1, 2, 3))
    peer.files["cdn/pic"] = Answer(body=picture, headers={"Content-Type": None})  # no type: its bytes say PNG
    peer.files["cdn/clip.wav"] = Answer(body=b"no magic here", headers={"Content-Type": None})  # its name says
    peer.files["cdn/movie"] = Answer(body=b"no magic here", headers={"Content-Type": "video/mp4"})
    peer.files["cdn/blob"] = Answer(body=b"no magic here", headers={"Content-Type": "application/x-unknown-thing"})
    backend = local(peer_url, ours, token="models-secret")
    path = backend.bring_home("HTTP" + peer_url[4:] + "/cdn/pic")  # a scheme in capitals is a URL too
    assert path.startswith("/images/") and path.endswith(".png") and opened(ours, path).read_bytes() == picture
    assert peer.calls[-1]["authorization"] is None  # a URL in a result is not the models server: no token
    path = backend.bring_home(peer_url + "/cdn/clip.wav")
    assert path.startswith("/audios/") and path.endswith(".wav")
    path = backend.bring_home(peer_url + "/cdn/movie")
    assert path.startswith("/videos/") and path.endswith(".mp4")
    path = backend.bring_home(peer_url + "/cdn/blob")
    assert path.startswith("/images/") and path.endswith(".bin")


def test_an_output_url_the_policy_refuses_is_an_error(peer, peer_url, ours):
    peer.files["cdn/pic"] = Answer(body=png())
    with pytest.raises(BackendError) as info:
        LocalModelsServer(peer_url, ours).bring_home(peer_url + "/cdn/pic")  # the default policy: no loopback
    assert str(info.value).startswith("the models server named an output URL that cannot be fetched: refusing to "
                                      "fetch ")
    assert peer.calls == []
    peer.files["cdn/big"] = Answer(body=b"x" * (1024 * 1024 + 1))
    with pytest.raises(BackendError, match="cannot be fetched: .* is larger than the 1 MiB limit"):
        local(peer_url, ours, max_output_bytes=1024 * 1024).bring_home(peer_url + "/cdn/big")


def test_file_keys_of_a_result_are_brought_home_and_others_left(peer, peer_url, ours):
    peer.answers["acme/x"] = Answer(body={"generated image": "/images/a.png", "generated audio": "",
                                          "generated video": None, "predicted": "/images/a.png"})
    peer.files["images/a.png"] = Answer(body=png())
    result = local(peer_url, ours).infer("acme/x", TaskInputs("image-to-image", text="x"))
    assert result["generated image"].startswith("/images/") and result["generated image"] != "/images/a.png"
    assert result["generated audio"] == "" and result["generated video"] is None
    assert result["predicted"] == "/images/a.png"


def test_object_detection_draws_its_boxes_on_our_copy_of_the_input(peer, peer_url, ours):
    predicted = [{"label": "cat", "score": 0.9, "box": {"xmin": 5, "ymin": 5, "xmax": 30, "ymax": 25}}]
    peer.answers["acme/detr"] = Answer(body=predicted)
    result = local(peer_url, ours).infer("acme/detr", TaskInputs("object-detection", image=image_input()))
    assert result["predicted"] == predicted
    drawn = Image.open(opened(ours, result["generated image"]))
    assert drawn.size == (40, 30) and drawn.getpixel((5, 15)) != (0, 0, 0)


def test_the_reasons_a_copy_fails_are_named_as_requests_named_them():
    url = "http://127.0.0.1:1/x"
    assert _cause(urllib3.exceptions.NewConnectionError(None, "refused")) == "ConnectionError"
    assert _cause(urllib3.exceptions.ProtocolError("reset")) == "ConnectionError"
    assert _cause(urllib3.exceptions.ConnectTimeoutError("slow")) == "ConnectTimeout"
    assert _cause(urllib3.exceptions.ReadTimeoutError(None, url, "slow")) == "ReadTimeout"
    assert _cause(urllib3.exceptions.LocationParseError("x:y")) == "InvalidURL"
    assert _cause(urllib3.exceptions.SSLError("bad certificate")) == "SSLError"


# -- normalize -----------------------------------------------------------------------------------------------------


def test_a_file_path_lands_under_the_key_of_its_kind():
    assert path_key("text-to-video") == "generated video"
    assert path_key("text-to-speech") == "generated audio"
    assert path_key("audio-to-audio") == "generated audio"
    assert path_key("text-to-image") == "generated image"
    none = TaskInputs("x")
    assert normalize("text-to-speech", {"path": "/audios/a.wav", "x": 1}, none, Path(".")) == {
        "generated audio": "/audios/a.wav", "x": 1}
    assert normalize("text-to-image", {"path": "/images/a.png"}, none, Path(".")) == {"generated image": "/images/a.png"}
    assert normalize("audio-to-audio", {"paths": ["/audios/1.wav", "/audios/2.wav"], "predicted": ["a", "b"]}, none,
                     Path(".")) == {"generated audio": "/audios/1.wav", "predicted": ["a", "b"]}
    assert normalize("audio-to-audio", {"paths": "/audios/1.wav"}, none, Path(".")) == {"paths": "/audios/1.wav"}
    assert normalize("text-to-speech", {"paths": ["/audios/1.wav"]}, none, Path(".")) == {"paths": ["/audios/1.wav"]}
    assert normalize("summarization", {"generated text": "s"}, none, Path(".")) == {"generated text": "s"}


def test_an_answer_of_another_shape_is_what_was_predicted():
    none = TaskInputs("x")
    seps = [{"path": "/audios/1.wav", "label": "a"}, {"path": "/audios/2.wav", "label": "b"}]
    assert normalize("audio-to-audio", seps, none, Path(".")) == {"generated audio": "/audios/1.wav", "predicted": seps}
    assert normalize("audio-to-audio", [], none, Path(".")) == {"predicted": []}
    assert normalize("audio-to-audio", ["/audios/1.wav"], none, Path(".")) == {"predicted": ["/audios/1.wav"]}
    assert normalize("audio-to-audio", [{"label": "a"}], none, Path(".")) == {"predicted": [{"label": "a"}]}
    assert normalize("audio-to-audio", "path", none, Path(".")) == {"predicted": "path"}
    assert normalize("text-classification", seps, none, Path(".")) == {"predicted": seps}
    assert normalize("image-classification", [{"label": "cat"}], none, Path(".")) == {"predicted": [{"label": "cat"}]}
    assert normalize("object-detection", {"path": "/images/a.png"}, none, Path(".")) == {"generated image": "/images/a.png"}
    assert normalize("object-detection", [], none, Path(".")) == {"generated image": None, "predicted": []}
    assert normalize("summarization", "text", none, Path(".")) == {"predicted": "text"}


def test_an_error_answer_is_one_error_dict():
    none = TaskInputs("x")
    assert normalize("summarization", {"error": {"message": "m", "code": 3}}, none, Path(".")) == {
        "error": {"message": "m", "code": 3}}
    assert normalize("summarization", {"error": None}, none, Path(".")) == {"error": {"message": "None"}}
    assert normalize("summarization", {"error": 7, "path": "x"}, none, Path(".")) == {"error": {"message": "7"}}
    assert normalize("summarization", ["error"], none, Path(".")) == {"predicted": ["error"]}


def drawn(predicted: list, size=(60, 50)) -> Image.Image:
    public = Path(__import__("tempfile").mkdtemp()) / "public"
    path = draw_boxes(TaskInputs("object-detection", image=image_input(size)), predicted, public)
    return Image.open(opened(public, path)).convert("RGB")


def expected_drawing(size, boxes: list[tuple[dict, str, tuple[int, int, int]]]) -> Image.Image:
    """What a drawing must be: each box a 2-px outline in its label's colour, the label 3 px in and 12 px above the
    box (no higher than the top edge), in the same colour."""
    from PIL import ImageDraw

    image = Image.new("RGB", size, (0, 0, 0))
    draw = ImageDraw.Draw(image)
    for box, label, color in boxes:
        draw.rectangle(((box["xmin"], box["ymin"]), (box["xmax"], box["ymax"])), outline=color, width=2)
        draw.text((box["xmin"] + 3, max(0, box["ymin"] - 12)), label, fill=color)
    return image


COLORS = BOX_COLORS  # the same colours for the same labels on every run


def test_boxes_are_drawn_in_one_colour_per_label_with_the_label_above():
    cat1 = {"xmin": 5, "ymin": 20, "xmax": 30, "ymax": 45}
    dog = {"xmin": 35, "ymin": 14, "xmax": 55, "ymax": 40}
    cat2 = {"xmin": 2, "ymin": 5, "xmax": 12, "ymax": 12}
    predicted = ["not a dict", {"label": "fish"}, {"label": "cat", "box": cat1}, {"label": "dog", "box": dog},
                 {"label": "cat", "box": cat2}, {"box": {}}]
    got = drawn(predicted)
    want = expected_drawing((60, 50), [(cat1, "cat", COLORS[0]), (dog, "dog", COLORS[1]), (cat2, "cat", COLORS[0])])
    assert got.tobytes() == want.tobytes()
    assert got.getpixel((6, 30)) == COLORS[0] and got.getpixel((7, 30)) == (0, 0, 0)  # 2 px wide


def test_each_label_has_its_own_colour_until_the_colours_run_out():
    assert len(set(BOX_COLORS)) == len(BOX_COLORS) >= 8
    boxes = [{"label": f"l{n}", "box": {"xmin": 4 * n, "ymin": 20, "xmax": 4 * n + 2, "ymax": 40}}
             for n in range(len(BOX_COLORS) + 1)]
    got = drawn(boxes, size=(4 * len(boxes), 45))
    assert [got.getpixel((4 * n, 30)) for n in range(len(boxes))] == [*BOX_COLORS, BOX_COLORS[0]]


def test_a_box_without_a_label_has_no_text():
    box = {"xmin": 5, "ymin": 20, "xmax": 30, "ymax": 45}
    got = drawn([{"box": box}])
    assert got.tobytes() == expected_drawing((60, 50), [(box, "", COLORS[0])]).tobytes()
    assert set(got.crop((0, 0, 60, 19)).tobytes()) == {0}


def test_no_input_image_draws_nothing(tmp_path):
    assert draw_boxes(TaskInputs("object-detection"), [{"box": {"xmin": 1}}], tmp_path) is None
    assert not tmp_path.joinpath("images").exists()


def test_an_unreadable_input_image_says_which_image():
    with pytest.raises(Exception, match="the input image is not a readable image"):
        draw_boxes(TaskInputs("object-detection", image=Resource(b"nope", "image/png", "x")), [], Path("."))


def test_each_mask_is_tinted_in_its_own_colour_half_transparent():
    colors = [(30, 80, 40), (127, 137, 191), (224, 194, 86), (65, 251, 237), (162, 52, 132)]  # each past 255 once
    for shade in (0, 1):  # both parities: a colour one off would show in one of them
        base = Image.new("RGB", (10, 2), (shade, shade, shade))
        masks = []
        for n in range(5):
            mask = Image.new("L", (10, 2), 0)
            mask.putpixel((2 * n, 0), 255)
            masks.append(mask)
        out = overlay_masks(base, masks)
        assert out.size == (10, 2) and base.getpixel((0, 0)) == (shade, shade, shade)
        for n, color in enumerate(colors):
            want = Image.blend(Image.new("RGB", (1, 1), (shade,) * 3), Image.new("RGB", (1, 1), color), 0.5)
            assert out.getpixel((2 * n, 0)) == want.getpixel((0, 0)), (shade, n)
        assert out.getpixel((0, 1)) == (shade, shade, shade) and out.getpixel((1, 0)) == (shade, shade, shade)
    # a mask of another size covers the image once resized to it
    whole = overlay_masks(Image.new("RGB", (8, 2)), [Image.new("1", (2, 2), 1)])
    assert set(whole.tobytes()[i:i + 3] for i in range(0, 48, 3)) == {bytes((15, 40, 20))}


def test_a_mask_in_colour_covers_where_it_is_white():
    """A mask sent as an RGB picture (a hosted model's PNG) still says where: white covers, black does not."""
    mask = Image.new("RGB", (4, 2), (0, 0, 0))
    mask.paste((255, 255, 255), (0, 0, 2, 2))
    out = overlay_masks(Image.new("RGB", (4, 2)), [mask])
    assert [out.getpixel((x, 0)) for x in range(4)] == [(15, 40, 20), (15, 40, 20), (0, 0, 0), (0, 0, 0)]


# -- hosted: a scriptable endpoint (an own Inference Endpoint, or a Hub and router for odd answers) -----------------


@dataclass
class FakeEndpoint:
    """`answers[path]` for any request to that path (a callable of the recorded call, or an Answer); every request
    recorded with its raw target (a proxy sees the absolute URL), headers and body."""

    answers: dict[str, Any] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Flask:
        app = Flask("fake-endpoint")

        @app.route("/<path:path>", methods=["GET", "POST"])
        def any_path(path: str) -> Response:
            call = {"method": request.method, "path": request.path, "raw": request.environ.get("RAW_URI"),
                    "authorization": request.headers.get("Authorization"), "host": request.headers.get("Host"),
                    "json": request.get_json(silent=True), "data": request.get_data()}
            self.calls.append(call)
            answer = self.answers.get(request.path)
            if answer is None:
                return jsonify({"error": f"nothing at {request.path}"}), 404
            return FakeModelsPeer.send(answer(call) if callable(answer) else answer)

        return app


@pytest.fixture(scope="module")
def endpoint_server():
    fake = FakeEndpoint()
    server = ThreadedServer(fake.app()).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def endpoint(endpoint_server):
    fake, _ = endpoint_server
    fake.answers.clear()
    fake.calls.clear()
    return fake


@pytest.fixture
def endpoint_url(endpoint_server) -> str:
    return endpoint_server[1]


def b64png(size=(4, 4), color=(0, 0, 0), mode="RGB") -> str:
    out = io.BytesIO()
    Image.new(mode, size, color).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def hosted_at(url: str, public: Path, **kw) -> HostedInference:
    return HostedInference(kw.pop("token", TOKEN), public, base_url=url, **kw)


def test_an_own_endpoint_is_called_with_the_token_and_its_answer_is_mapped(endpoint, endpoint_url, ours):
    endpoint.answers["/BOX/models/acme/tc"] = Answer(body=[[{"label": "POSITIVE", "score": 0.9, "extra": None}]])
    backend = hosted_at(endpoint_url + "/BOX/", ours)
    seen = []
    backend.observe_provider = lambda *a: seen.append(a)
    result = backend.infer("acme/tc", TaskInputs("text-classification", text="what a day"))
    assert result == {"predicted": [{"label": "POSITIVE", "score": 0.9}], "provider": "endpoint"}
    call = endpoint.calls[-1]
    assert (call["method"], call["path"]) == ("POST", "/BOX/models/acme/tc")
    assert call["authorization"] == f"Bearer {TOKEN}" and call["json"]["inputs"] == "what a day"
    [(label, outcome, seconds)] = seen
    assert (label, outcome) == ("endpoint", "ok") and 0 <= seconds < 5


def test_a_model_template_in_the_base_url(endpoint, endpoint_url, ours):
    endpoint.answers["/deploy/acme/tc/run"] = Answer(body=[[{"label": "NEG", "score": 0.6}]])
    backend = hosted_at(endpoint_url + "/deploy/{model}/run", ours)
    assert backend.infer("acme/tc", TaskInputs("text-classification", text="x"))["predicted"] == [
        {"label": "NEG", "score": 0.6}]
    endpoint.answers["/deploy/acme/tc/run"] = Answer(body={"loaded": True})
    assert backend.is_available("acme/tc") is True
    assert endpoint.calls[-1]["method"] == "GET" and endpoint.calls[-1]["path"] == "/deploy/acme/tc/run"


def test_object_detection_segmentation_and_audio_from_an_endpoint(endpoint, endpoint_url, ours):
    backend = hosted_at(endpoint_url, ours)
    box = {"xmin": 2, "ymin": 3, "xmax": 20, "ymax": 15}
    endpoint.answers["/models/acme/od"] = Answer(body=[{"label": "dog", "score": 0.5, "box": box}])
    result = backend.infer("acme/od", TaskInputs("object-detection", image=image_input()))
    assert result["predicted"] == [{"label": "dog", "score": 0.5, "box": box}] and result["provider"] == "endpoint"
    assert Image.open(opened(ours, result["generated image"])).getpixel((2, 10)) == COLORS[0]
    assert endpoint.calls[-1]["data"] == png()

    left = Image.new("L", (40, 30), 0)
    left.paste(255, (0, 0, 20, 30))
    mask = io.BytesIO()
    left.save(mask, format="PNG")
    endpoint.answers["/models/acme/seg"] = Answer(body=[
        {"label": "sky", "score": 0.75, "mask": base64.b64encode(mask.getvalue()).decode()}])
    result = backend.infer("acme/seg", TaskInputs("image-segmentation", image=image_input()))
    assert result["predicted"] == [{"label": "sky", "score": 0.75}]
    overlay = Image.open(opened(ours, result["generated image"])).convert("RGB")
    assert overlay.getpixel((5, 5)) == (15, 40, 20) and overlay.getpixel((35, 5)) == (0, 0, 0)

    clip = wav()
    endpoint.answers["/models/acme/a2a"] = Answer(body=[
        {"label": "voice", "content-type": "audio/flac", "blob": base64.b64encode(clip).decode()},
        {"label": "noise", "content-type": "audio/flac", "blob": base64.b64encode(b"n").decode()}])
    result = backend.infer("acme/a2a", TaskInputs("audio-to-audio", audio=audio_input()))
    assert result["predicted"] == ["voice", "noise"] and result["generated audio"].endswith(".flac")
    assert result["generated audio"].startswith("/audios/") and opened(ours, result["generated audio"]).read_bytes() == clip


def test_a_question_and_its_context_are_split(endpoint, endpoint_url, ours):
    endpoint.answers["/models/acme/qa"] = Answer(body={"answer": "Paris", "score": 0.9, "start": 0, "end": 5})
    result = hosted_at(endpoint_url, ours).infer("acme/qa", TaskInputs("question-answering",
                                                                       text="Where? | She lives in Paris."))
    assert result == {"answer": "Paris", "score": 0.9, "start": 0, "end": 5, "provider": "endpoint"}
    assert endpoint.calls[-1]["json"]["inputs"] == {"question": "Where?", "context": "She lives in Paris."}


@pytest.mark.parametrize("text, pair", [
    ("a\nb | c", ("a", "b | c")), ("a | b|c", ("a", "b|c")), ("a|b vs c", ("a", "b vs c")),
    ("x vs. y vs z", ("x", "y vs z")), ("x vs y", ("x", "y")), ("one\ntwo\nthree", ("one", "two\nthree")),
    ("a|b | c", ("a|b", "c")),  # " | " before a bare "|": a question may hold a pipe
    ("alone", ("alone", "alone"))])
def test_a_pair_of_texts_splits_at_its_first_separator(text, pair):
    assert hosted_mod._split_pair(text) == pair


def test_an_input_the_task_needs_is_asked_for(endpoint, endpoint_url, ours):
    backend = hosted_at(endpoint_url, ours)
    seen = []
    backend.observe_provider = lambda *a: seen.append(a[:2])
    for task, field_ in [("text-classification", "text"), ("image-classification", "image"),
                         ("audio-classification", "audio")]:
        with pytest.raises(BackendError) as info:
            backend.infer("acme/x", TaskInputs(task))
        assert str(info.value) == f"{task} needs an {field_} argument" and not isinstance(info.value, HostedFailure)
    assert seen == [] and endpoint.calls == []  # never sent: no call of the endpoint's to count


def test_a_task_hosted_inference_cannot_run_and_a_missing_token(endpoint, endpoint_url, ours):
    with pytest.raises(BackendError) as info:
        hosted_at(endpoint_url, ours).infer("acme/x", TaskInputs("canny-control", text="x"))
    assert str(info.value) == "hosted inference does not support canny-control"
    for token in (None, ""):
        backend = hosted_at(endpoint_url, ours, token=token)
        with pytest.raises(BackendError) as info:
            backend.infer("acme/x", TaskInputs("text-classification", text="x"))
        assert str(info.value) == ("hosted inference needs a Hugging Face token: set huggingface.token in the config "
                                   "or export HUGGINGFACE_ACCESS_TOKEN")
        assert backend.is_available("acme/x") is False
    assert endpoint.calls == []


@pytest.mark.parametrize("status, outcome, says, final", [
    (401, "unauthorized", "the endpoint at huggingface.base_url refused the Hugging Face token (401 Unauthorized): "
     "check huggingface.token or HUGGINGFACE_ACCESS_TOKEN (a fine-grained token needs the permission to make calls "
     "to Inference Providers)", True),
    (402, "out_of_credits", "the Hugging Face account has no Inference Providers credits left (402 Payment Required "
     "from the endpoint at huggingface.base_url): add credits at https://huggingface.co/settings/billing, or run the "
     "task on the local models server (inference_mode: hybrid)", True),
    (429, "rate_limited", "the endpoint at huggingface.base_url is rate-limiting this token (429 Too Many Requests): "
     "wait a minute, or allow more providers in huggingface.providers", False),
    (503, "unavailable", "the endpoint at huggingface.base_url cannot serve acme/x right now (503 Service "
     "Unavailable: the model is loading or the provider is overloaded); try again in a minute", False),
    (500, "error", "the endpoint at huggingface.base_url failed (500): the GPU caught fire", False),
    (400, "error", "the endpoint at huggingface.base_url failed (400): the GPU caught fire", False),
])
def test_each_failure_of_an_endpoint_is_one_line(endpoint, endpoint_url, ours, status, outcome, says, final):
    endpoint.answers["/models/acme/x"] = Answer(status=status, body={"error": "the GPU caught fire\nTraceback: ..."})
    backend = hosted_at(endpoint_url, ours)
    seen = []
    backend.observe_provider = lambda *a: seen.append(a[:2])
    with pytest.raises(HostedFailure) as info:
        backend.infer("acme/x", TaskInputs("text-classification", text="x"))
    assert str(info.value) == f"hosted inference of acme/x failed: {says}"
    assert info.value.tried == [{"model": "acme/x", "hosted_on": "huggingface", "provider": "endpoint", "error": says}]
    assert info.value.final is final and seen == [("endpoint", outcome)]


def test_an_error_message_is_one_line_without_the_token_or_urls_and_at_most_300_characters(endpoint, endpoint_url,
                                                                                           ours):
    backend = hosted_at(endpoint_url, ours)
    endpoint.answers["/models/acme/x"] = lambda call: Answer(status=500, body={
        "error": f"overloaded (request by {call['authorization']}) see http://user:pw@internal.example/x?token=abc"})
    with pytest.raises(HostedFailure) as info:
        backend.infer("acme/x", TaskInputs("text-classification", text="x"))
    assert TOKEN not in str(info.value) and "pw@" not in str(info.value)
    assert "overloaded (request by Bearer ***) see http://***@internal.example/x" in str(info.value)
    endpoint.answers["/models/acme/x"] = Answer(status=500, body={"error": "y" * 500})
    with pytest.raises(HostedFailure) as info:
        backend.infer("acme/x", TaskInputs("text-classification", text="x"))
    assert info.value.tried[0]["error"] == "the endpoint at huggingface.base_url failed (500): " + "y" * 300
    endpoint.answers["/models/acme/x"] = Answer(status=200, body={"not": "a classification"})
    with pytest.raises(HostedFailure) as info:
        backend.infer("acme/x", TaskInputs("text-classification", text="x"))
    assert info.value.tried[0]["error"].startswith("the endpoint at huggingface.base_url failed: ")
    assert "(None)" not in str(info.value) and "\n" not in str(info.value)


def test_the_first_line_of_an_error_or_its_type():
    assert one_line(ValueError(" \n "), TOKEN) == "ValueError"
    assert one_line(ValueError(""), TOKEN) == "ValueError"
    assert one_line(ValueError(f"  first {TOKEN}\nsecond"), TOKEN) == "first ***"
    assert one_line(SimpleNamespace(server_message="from the server\nmore", __str__=None), TOKEN) == "from the server"
    assert one_line(ValueError("plain"), None) == "plain"


def test_statuses_and_timeouts_are_found_anywhere_in_the_chain():
    import httpx2
    from huggingface_hub.errors import InferenceTimeoutError

    def chained(inner: BaseException, how: str) -> BaseException:
        outer = ValueError("outer")
        setattr(outer, how, inner)
        return outer

    with_status = SimpleNamespace(response=SimpleNamespace(status_code=429), __cause__=None, __context__=None)
    assert status_of(None) is None
    assert status_of(ValueError("x")) is None
    for how in ("__cause__", "__context__"):
        err = chained(RuntimeError("x"), how)
        getattr(err, how).response = SimpleNamespace(status_code=502)
        assert status_of(err) == 502
        assert timed_out(chained(httpx2.ReadTimeout("slow"), how)) is True
        assert timed_out(chained(InferenceTimeoutError("slow"), how)) is True
    assert status_of(with_status) == 429
    looped = ValueError("a loop")
    looped.__context__ = looped
    assert timed_out(looped) is False and status_of(looped) is None
    assert timed_out(ValueError("x")) is False
    assert status_of(SimpleNamespace(response=SimpleNamespace(status_code="500"), __cause__=None,
                                                 __context__=None)) is None


def test_a_provider_silent_past_task_timeout_and_a_request_deadline_that_passes(endpoint, endpoint_url, ours):
    endpoint.answers["/models/acme/slow"] = Answer(body=[{"label": "late", "score": 1}], delay=3)
    backend = hosted_at(endpoint_url, ours, timeout=1.0)
    seen = []
    backend.observe_provider = lambda *a: seen.append(a[:2])
    started = time.monotonic()
    with deadline_scope(time.monotonic() + 1.8), pytest.raises(HostedFailure) as info:
        backend.infer("acme/slow", TaskInputs("text-classification", text="x"))
    assert str(info.value) == "hosted inference of acme/slow failed: the endpoint at huggingface.base_url timed out " \
                              "(no answer for 1s)"
    assert info.value.final is False and seen == [("endpoint", "timeout")] and time.monotonic() - started < 1.7
    backend = hosted_at(endpoint_url, ours, timeout=10.0)
    seen.clear()
    backend.observe_provider = lambda *a: seen.append(a[:2])
    with deadline_scope(time.monotonic() + 0.5), pytest.raises(HostedFailure) as info:
        backend.infer("acme/slow", TaskInputs("text-classification", text="x"))
    assert info.value.tried[0]["error"] == "the endpoint at huggingface.base_url timed out (the deadline passed)"
    assert info.value.final is True and seen == [("endpoint", "timeout")]
    backend = hosted_at(endpoint_url, ours, timeout=1.0)
    with pytest.raises(HostedFailure) as info:  # no request deadline at all
        backend.infer("acme/slow", TaskInputs("text-classification", text="x"))
    assert info.value.final is False and "(no answer for 1s)" in str(info.value)


def test_a_timeout_with_the_requests_deadline_at_most_50_ms_away_is_final():
    """What is left of the request's deadline when a call times out decides: 50 ms or less, and no other provider
    could answer in time; more, and the next one is asked."""
    import httpx2

    slow = httpx2.ReadTimeout("slow")
    assert provider_failure(slow, "the endpoint", "acme/x", 7.0, 0.05, "slow") == Failure(
        "timeout", "the endpoint timed out (the deadline passed)", True)
    assert provider_failure(slow, "fal-ai", "acme/x", 7.0, 0.051, "slow") == Failure(
        "timeout", "fal-ai timed out (no answer for 7s)", False)


def test_a_dribbling_endpoint_is_cut_at_task_timeout(ours, peers):
    backend = hosted_at(peers("dribble").url, ours, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(HostedFailure, match=r"timed out \(no answer for 1s\)"):
        backend.infer("acme/x", TaskInputs("text-classification", text="x"))
    assert time.monotonic() - started < 3


def test_a_redirecting_endpoint_is_followed(endpoint, endpoint_url, ours):
    endpoint.answers["/models/acme/old"] = Answer(status=307, body={}, headers={"Location": "/models/acme/new"})
    endpoint.answers["/models/acme/new"] = Answer(body=[[{"label": "moved", "score": 1.0}]])
    result = hosted_at(endpoint_url, ours).infer("acme/old", TaskInputs("text-classification", text="x"))
    assert result["predicted"] == [{"label": "moved", "score": 1.0}]


def test_an_endpoints_status_says_whether_a_model_is_available(endpoint, endpoint_url, ours):
    backend = hosted_at(endpoint_url + "/", ours)
    states = {"acme/loaded": Answer(body={"loaded": True}), "acme/loadable": Answer(body={"state": "Loadable"}),
              "acme/ready": Answer(body={"loaded": False, "state": "Loaded"}),
              "acme/cold": Answer(body={"loaded": False, "state": "TooBig"}),
              "acme/proxy": Answer(status=403, body={"loaded": True, "state": "Loaded"}),
              "acme/html": Answer(body=b"<html>")}
    for model, answer in states.items():
        endpoint.answers[f"/status/{model}"] = answer
    assert {m: backend.is_available(m) for m in states} == {
        "acme/loaded": True, "acme/loadable": True, "acme/ready": True, "acme/cold": False, "acme/proxy": False,
        "acme/html": False}
    assert {c["authorization"] for c in endpoint.calls} == {f"Bearer {TOKEN}"}
    assert endpoint.calls[0]["path"] == "/status/acme/loaded"


def test_an_endpoints_status_sits_beside_its_models_path(endpoint, endpoint_url, ours):
    """`/status/<id>` under the base, whatever the base's own path holds; a `/models/{model}` template's status is
    its `/status/{model}`."""
    endpoint.answers["/models/proxy/status/acme/x"] = Answer(body={"loaded": True})
    assert hosted_at(endpoint_url + "/models/proxy", ours).is_available("acme/x") is True
    endpoint.answers["/api/status/acme/x"] = Answer(body={"loaded": True})
    assert hosted_at(endpoint_url + "/api/models/{model}", ours).is_available("acme/x") is True
    assert [c["path"] for c in endpoint.calls] == ["/models/proxy/status/acme/x", "/api/status/acme/x"]
    endpoint.answers["/api/models/acme/x"] = Answer(body=[[{"label": "OK", "score": 1.0}]])
    assert hosted_at(endpoint_url + "/api/models/{model}", ours).infer(
        "acme/x", TaskInputs("text-classification", text="x"))["predicted"] == [{"label": "OK", "score": 1.0}]


def test_an_endpoints_status_is_bounded_by_status_timeout(ours, peers):
    for peer_ in (peers("dribble"), peers("backlogged")):
        started = time.monotonic()
        assert hosted_at(peer_.url, ours, status_timeout=0.5).is_available("acme/x") is False
        assert time.monotonic() - started < 1.5


def test_calls_go_through_the_configured_proxy(endpoint, endpoint_url, ours):
    """The proxy (the fake, here) is asked for the endpoint's absolute URL: an address only it can reach."""
    endpoint.answers["/status/acme/x"] = Answer(body={"loaded": True})
    endpoint.answers["/models/acme/x"] = Answer(body=[[{"label": "via proxy", "score": 1.0}]])
    backend = HostedInference(TOKEN, ours, base_url="http://hosted.invalid", proxy=endpoint_url)
    try:
        assert backend.is_available("acme/x") is True
        assert backend.infer("acme/x", TaskInputs("text-classification", text="x"))["predicted"][0]["label"] == "via proxy"
    finally:
        HostedInference(TOKEN, ours)  # the process-wide hub client without a proxy again
    assert [c["raw"] for c in endpoint.calls] == ["http://hosted.invalid/status/acme/x", "http://hosted.invalid/models/acme/x"]


# -- hosted: Inference Providers through the Hub's router -------------------------------------------------------

FLUX = "black-forest-labs/FLUX.1-schnell"
WHISPER = "openai/whisper-large-v3"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GPT2 = "openai-community/gpt2"
CAPTIONER = "microsoft/git-base-coco"


def serve_models(fake: FakeRouter) -> None:
    fake.models.clear()
    fake.serve(FLUX, "text-to-image", Served("replicate", "black-forest-labs/flux-schnell", "text-to-image"),
               Served("fal-ai", "fal-ai/flux/schnell", "text-to-image"),
               Served("hf-inference", FLUX, "text-to-image"),
               Served("made-up-provider", "x", "text-to-image"),
               Served("fal-ai-old", "x", "text-to-image", status="error"))
    fake.serve(WHISPER, "automatic-speech-recognition",
               Served("replicate", "openai/whisper:8099696689d249cf8b122d833c36ac3f75505c666a395ca40ef26f68e7d3d16e",
                      "automatic-speech-recognition"),
               Served("fal-ai", "fal-ai/whisper", "automatic-speech-recognition", status="staging"))
    fake.serve(CAPTIONER, "image-to-text", Served("hf-inference", CAPTIONER, "image-to-text"),
               Served("fal-ai", "fal-ai/caption", "image-to-text"),  # fal-ai cannot be called for image-to-text
               Served("together", CAPTIONER, "feature-extraction"))  # a task no handler runs
    fake.serve(LLAMA, "text-generation", Served("together", "meta-llama/Meta-Llama-3.1-8B-Instruct-Turbo",
                                                "conversational"))
    fake.serve(GPT2, "text-generation", Served("hf-inference", GPT2, "text-generation"))
    fake.preferences[TOKEN] = ["fal-ai", "hf-inference", "replicate", "together"]


@pytest.fixture(scope="module")
def router_server():
    fake = FakeRouter()
    serve_models(fake)
    app = fake.app()
    seen: list[dict[str, Any]] = []

    @app.before_request
    def record() -> None:
        seen.append({"path": request.path, "host": request.headers.get("Host"), "json": request.get_json(silent=True),
                     "authorization": request.headers.get("Authorization")})

    fake.seen = seen  # type: ignore[attr-defined]
    server = ThreadedServer(app).start()
    yield fake, server.url
    server.stop()


@pytest.fixture
def router(router_server):
    fake, url = router_server
    fake.reset()
    fake.seen.clear()
    serve_models(fake)
    return fake


@pytest.fixture
def router_url(router_server) -> str:
    return router_server[1]


def via_router(url: str, public: Path, **kw) -> HostedInference:
    kw.setdefault("status_ttl", 0)
    return HostedInference(kw.pop("token", TOKEN), public, router_url=url + "/", hub_url=url + "/", **kw)


def test_a_silent_hub_costs_status_timeout_not_the_whole_task(router, router_url, ours):
    router.hangs["hub"] = 5
    backend = via_router(router_url, ours, status_timeout=0.5, timeout=30)
    started = time.monotonic()
    status = backend.model_status(FLUX)
    assert time.monotonic() - started < 2.5
    assert status == ModelStatus(False, f"the Hugging Face Hub did not answer within 0.5s while looking up the "
                                        f"providers of {FLUX}; try again", lasting=False)  # asked again next time
    started = time.monotonic()
    with pytest.raises(BackendError, match=f"^the Hugging Face Hub did not answer within 0.5s while looking up the "
                                           f"providers of {FLUX}"):
        backend.infer(FLUX, TaskInputs("text-to-image", text="a lighthouse"))
    assert time.monotonic() - started < 2.5
    assert router.calls == []  # no provider was asked


def test_the_routes_are_the_live_callable_providers_in_the_users_order(router, router_url, ours):
    backend = via_router(router_url, ours)
    assert backend.routes(FLUX) == (Route("fal-ai", "text-to-image"), Route("hf-inference", "text-to-image"),
                                    Route("replicate", "text-to-image"))
    assert router.hub_calls[-1] == {"model": FLUX, "expand": ["inferenceProviderMapping"], "token": TOKEN}
    assert backend.routes(WHISPER) == (Route("replicate", "automatic-speech-recognition"),)  # fal-ai's is not live
    assert backend.routes(CAPTIONER) == (Route("hf-inference", "image-to-text"),)
    assert backend.routes(LLAMA) == (Route("together", "conversational"),)
    only = via_router(router_url, ours, providers=("replicate", "fal-ai", "together"))
    assert only.routes(FLUX) == (Route("replicate", "text-to-image"), Route("fal-ai", "text-to-image"))
    assert only.is_available(FLUX) is True and only.is_available(CAPTIONER) is False


def test_the_routes_of_a_model_are_remembered_for_status_ttl(router, router_url, ours):
    backend = via_router(router_url, ours, status_ttl=0.8)
    assert backend.is_available(FLUX) and backend.is_available(FLUX)
    assert [c["model"] for c in router.hub_calls] == [FLUX]
    time.sleep(0.9)
    assert backend.is_available(FLUX)
    assert [c["model"] for c in router.hub_calls] == [FLUX, FLUX]
    uncached = via_router(router_url, ours, status_ttl=0)
    assert uncached.is_available(FLUX) and uncached.is_available(FLUX)
    assert len(router.hub_calls) == 4


def test_the_remembered_routes_are_bounded(router, router_url, ours):
    backend = via_router(router_url, ours, status_ttl=60)
    backend._routes.update({f"m{i}": ((), math.inf) for i in range(10_000)})
    backend.routes(FLUX)
    assert len(backend._routes) == 10_001
    backend.routes(WHISPER)
    assert list(backend._routes) == [WHISPER]


def test_a_model_the_hub_does_not_know_is_not_available(router, router_url, ours):
    backend = via_router(router_url, ours)
    assert backend.is_available("acme/nothing") is False
    with pytest.raises(BackendError) as info:
        backend.infer("acme/nothing", TaskInputs("text-to-image", text="x"))
    assert str(info.value) == "acme/nothing is not on the Hub (or is private or gated for this token)"
    assert not isinstance(info.value, HostedFailure)


def test_no_provider_serving_the_model_for_the_task(router, router_url, ours):
    with pytest.raises(BackendError) as info:
        via_router(router_url, ours).infer(CAPTIONER, TaskInputs("text-to-image", text="x"))
    assert str(info.value) == f"no Inference Provider serves {CAPTIONER} for text-to-image now"
    with pytest.raises(BackendError) as info:
        via_router(router_url, ours, providers=("together", "sambanova")).infer(FLUX, TaskInputs("text-to-image",
                                                                                                text="x"))
    assert str(info.value) == (f"no Inference Provider among huggingface.providers (together, sambanova) serves {FLUX} "
                               "for text-to-image now")
    assert router.calls == []


def test_a_picture_from_fal_ai_is_fetched_from_its_cdn_with_the_token_on_the_router_only(router, router_url, ours):
    result = via_router(router_url, ours).infer(FLUX, TaskInputs("text-to-image", text="a boat"))
    assert result["provider"] == "fal-ai" and "fallback" not in result
    image = Image.open(opened(ours, result["generated image"]))
    assert image.size == (48, 32) and image.convert("RGB").getpixel((0, 0)) == (250, 120, 0)
    host = router_url.removeprefix("http://")
    paths = [c["path"] for c in router.seen]  # ours (the client is handed the mapping), the call, the CDN
    assert paths[:2] == [f"/api/models/{FLUX}", "/fal-ai/fal-ai/flux/schnell"]
    assert len(paths) == 3 and paths[2].startswith("/files/")
    assert {c["host"] for c in router.seen} == {host}  # each moved call says the host it went to
    assert router.seen[1]["authorization"] == f"Bearer {TOKEN}" and not router.seen[2]["authorization"]


def test_a_provider_error_falls_back_to_the_next_provider(router, router_url, ours):
    router.failures["fal-ai"] = 503
    router.failures["hf-inference"] = 500
    backend = via_router(router_url, ours)
    seen = []
    backend.observe_provider = lambda *a: seen.append(a[:2])
    result = backend.infer(FLUX, TaskInputs("text-to-image", text="a boat"))
    assert result["provider"] == "replicate"
    assert result["fallback"] == {"tried": [
        {"model": FLUX, "hosted_on": "huggingface", "provider": "fal-ai",
         "error": f"fal-ai cannot serve {FLUX} right now (503 Service Unavailable: the model is loading or the "
                  "provider is overloaded); try again in a minute"},
        {"model": FLUX, "hosted_on": "huggingface", "provider": "hf-inference",
         "error": "hf-inference failed (500): Internal server error"}]}
    assert seen == [("fal-ai", "unavailable"), ("hf-inference", "error"), ("replicate", "ok")]
    assert [c["provider"] for c in router.calls] == ["fal-ai", "hf-inference", "replicate"]


def test_every_provider_failing_names_each(router, router_url, ours):
    router.failures.update({"fal-ai": 429, "hf-inference": 500, "replicate": 500})
    with pytest.raises(HostedFailure) as info:
        via_router(router_url, ours).infer(FLUX, TaskInputs("text-to-image", text="x"))
    assert str(info.value) == (f"hosted inference of {FLUX} failed on every provider: fal-ai is rate-limiting this "
                               "token (429 Too Many Requests): wait a minute, or allow more providers in "
                               "huggingface.providers; hf-inference failed (500): Internal server error; replicate "
                               "failed (500): Internal server error")
    assert [t["provider"] for t in info.value.tried] == ["fal-ai", "hf-inference", "replicate"]
    assert info.value.final is False
    with pytest.raises(HostedFailure) as info:
        via_router(router_url, ours).infer(WHISPER, TaskInputs("automatic-speech-recognition", audio=audio_input()))
    assert str(info.value) == f"hosted inference of {WHISPER} failed: replicate failed (500): Internal server error"
    assert info.value.final is False and len(info.value.tried) == 1


def test_a_refused_token_is_not_tried_on_other_providers(router, router_url, ours):
    router.failures.update({"fal-ai": 503, "hf-inference": 401})
    with pytest.raises(HostedFailure) as info:
        via_router(router_url, ours, providers=("fal-ai", "hf-inference", "replicate")).infer(
            FLUX, TaskInputs("text-to-image", text="x"))
    assert info.value.final is True
    assert [t["provider"] for t in info.value.tried] == ["fal-ai", "hf-inference"]
    assert str(info.value).startswith(f"hosted inference of {FLUX} failed: hf-inference refused the Hugging Face token")
    assert [c["provider"] for c in router.calls] == ["fal-ai", "hf-inference"]


def test_a_cancelled_request_asks_no_provider(router, router_url, ours):
    """Cancelled once its providers are known (remembered from before): none of them is asked."""
    backend = via_router(router_url, ours, status_ttl=60)
    assert backend.is_available(FLUX)
    token = cancel.CancelToken()
    token.cancel()
    ctx = cancel.CURRENT.set(token)
    try:
        with pytest.raises(HostedFailure) as info:
            backend.infer(FLUX, TaskInputs("text-to-image", text="x"))
    finally:
        cancel.CURRENT.reset(ctx)
    assert str(info.value) == f"hosted inference of {FLUX} failed on every provider: cancelled"
    assert info.value.tried == [] and router.calls == []


def test_a_chat_model_serves_text_generation_as_a_chat(router, router_url, ours):
    result = via_router(router_url, ours).infer(LLAMA, TaskInputs("text-generation", text="hello there"))
    assert result == {"generated text": "together says: hello there", "provider": "together"}
    chat = router.seen[-1]
    assert chat["path"] == "/together/v1/chat/completions"
    assert chat["json"]["messages"] == [{"role": "user", "content": "hello there"}]


def test_a_text_generation_model_is_not_asked_as_a_chat(router, router_url, ours):
    with pytest.raises(HostedFailure, match="the fake does not do text-generation on hf-inference"):
        via_router(router_url, ours).infer(GPT2, TaskInputs("text-generation", text="once upon"))
    assert router.calls[-1]["path"] == f"/hf-inference/models/{GPT2}"


def test_a_chat_answer_without_content_is_empty_text(endpoint, endpoint_url, ours):
    endpoint.answers["/api/models/acme/llm"] = Answer(body={"_id": "1", "id": "acme/llm", "inferenceProviderMapping": {
        "together": {"providerId": "acme/llm-turbo", "status": "live", "task": "conversational"}}})
    endpoint.answers["/together/v1/chat/completions"] = Answer(body={
        "id": "c", "object": "chat.completion", "created": 1, "model": "acme/llm-turbo",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": None}}]})
    result = via_router(endpoint_url, ours).infer("acme/llm", TaskInputs("conversational", text="hi"))
    assert result == {"generated text": "", "provider": "together"}


def test_routes_fit_the_planned_task():
    assert Route("fal-ai", "text-to-image").fits("text-to-image")
    assert not Route("fal-ai", "text-to-image").fits("image-to-text")
    for task in ("text-generation", "text2text-generation", "conversational"):
        assert Route("together", "conversational").fits(task)
        assert Route("hf-inference", "text-generation").fits(task)
    assert not Route("hf-inference", "text2text-generation").fits("text-generation")
    assert not Route("together", "conversational").fits("summarization")
    assert not Route("hf-inference", "summarization").fits("text-generation")


def test_client_outputs_become_plain_json():
    from huggingface_hub import ObjectDetectionOutputElement

    @dataclass
    class Box:
        xmin: int
        label: str | None = None

    assert plain([Box(1), (Box(2, "cat"), {"a": None, "b": np.float32(0.5)})]) == [
        {"xmin": 1}, [{"xmin": 2, "label": "cat"}, {"b": 0.5}]]
    assert type(plain(np.int64(3))) is int and plain("text") == "text" and plain(None) is None
    odd = SimpleNamespace(item=5)
    assert plain(odd) is odd and plain(Box) is Box and plain(ObjectDetectionOutputElement) is ObjectDetectionOutputElement


def test_a_mask_comes_as_a_picture_or_as_base64():
    picture = Image.new("L", (3, 2), 9)
    assert hosted_mod._image(picture) is picture
    decoded = hosted_mod._image(b64png((3, 2), 9, "L"))
    assert decoded.size == (3, 2) and decoded.getpixel((0, 0)) == 9


def test_hosted_calls_are_moved_to_the_configured_router_and_hub_only():
    import httpx2

    def sent(url: str) -> tuple[str, str]:
        req = httpx2.Request("GET", url)
        on_request(req)
        return str(req.url), req.headers["Host"]

    call = HostedCall((("https://router.huggingface.co", "http://127.0.0.1:7"),
                       ("https://huggingface.co", "http://127.0.0.1:8/hub")), "http://127.0.0.1:7",
                      "http://127.0.0.1:8/hub", TOKEN, UrlPolicy(), 1000, 5.0)
    with hosted_call(call):
        assert sent("https://router.huggingface.co/fal-ai/x") == ("http://127.0.0.1:7/fal-ai/x", "127.0.0.1:7")
        assert sent("https://router.huggingface.co?x=1") == ("http://127.0.0.1:7?x=1", "127.0.0.1:7")
        assert sent("https://router.huggingface.co") == ("http://127.0.0.1:7", "127.0.0.1:7")
        assert sent("https://huggingface.co/api/models/x") == ("http://127.0.0.1:8/hub/api/models/x", "127.0.0.1:8")
        assert sent("https://router.huggingface.co.evil.example/x") == (
            "https://router.huggingface.co.evil.example/x", "router.huggingface.co.evil.example")
        assert sent("http://127.0.0.1:9/files/1.png") == ("http://127.0.0.1:9/files/1.png", "127.0.0.1:9")
    assert sent("https://router.huggingface.co/fal-ai/x") == ("https://router.huggingface.co/fal-ai/x",
                                                              "router.huggingface.co")


def test_the_backend_is_built_from_the_config(tmp_path, router, router_url, endpoint, endpoint_url):
    public = tmp_path / "site"
    public.mkdir()
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", public,
                                      huggingface={"token": TOKEN, "providers": ["replicate", "fal-ai"],
                                                   "router_url": router_url},
                                      catalog_sync={"endpoint": router_url}, status_cache_seconds=60,
                                      task_timeout=7, status_timeout=1.5))
    backend = HostedInference.from_config(config)
    assert (backend.timeout, backend.status_timeout, backend.status_ttl) == (7.0, 1.5, 60.0)
    result = backend.infer(FLUX, TaskInputs("text-to-image", text="x"))
    assert result["provider"] == "replicate" and opened(public, result["generated image"]).is_file()
    backend.infer(FLUX, TaskInputs("text-to-image", text="x"))
    assert len(router.hub_calls) == 1

    (tmp_path / "b").mkdir()
    endpoint.answers["/models/acme/tc"] = Answer(body=[[{"label": "OK", "score": 1.0}]])
    config = load_config(write_config(tmp_path / "b", "http://127.0.0.1:9", "http://127.0.0.1:9", public,
                                      huggingface={"token": TOKEN, "base_url": "http://hosted.invalid"},
                                      proxy=endpoint_url))
    try:
        result = HostedInference.from_config(config).infer("acme/tc", TaskInputs("text-classification", text="x"))
    finally:
        HostedInference(TOKEN, public)
    assert result == {"predicted": [{"label": "OK", "score": 1.0}], "provider": "endpoint"}
    assert endpoint.calls[-1]["raw"] == "http://hosted.invalid/models/acme/tc"


def test_a_segmentation_of_an_unreadable_picture_says_so(endpoint, endpoint_url, ours):
    endpoint.answers["/models/acme/seg"] = Answer(body=[{"label": "sky", "score": 0.5, "mask": b64png((4, 4), 255, "L")}])
    with pytest.raises(HostedFailure) as info:
        hosted_at(endpoint_url, ours).infer("acme/seg", TaskInputs("image-segmentation",
                                                                   image=Resource(b"not a picture", "image/png", "x")))
    assert info.value.tried[0]["error"] == "the endpoint at huggingface.base_url failed: the input image is not a " \
                                           "readable image"
