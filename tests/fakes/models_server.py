"""A fake local models server speaking JARVIS's protocol, with per-model delays and call timing.

It returns the same shapes the real server does, writing real image and audio files under public/.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flask import Flask, Response, jsonify, request
from PIL import Image


def image_from(value: str, public: Path) -> Image.Image:
    if value.startswith("data:"):
        return Image.open(io.BytesIO(base64.b64decode(value.split(",", 1)[1])))
    return Image.open(public / value.lstrip("/").removeprefix("public/"))


@dataclass
class FakeModels:
    public: Path
    models: dict[str, str] = field(default_factory=dict)  # id -> task
    delays: dict[str, float] = field(default_factory=dict)
    gates: dict[str, threading.Event] = field(default_factory=dict)  # a call waits until its model's gate opens
    broken: set[str] = field(default_factory=set)
    calls: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[str] = field(default_factory=list)  # model ids as calls arrive (before any delay or gate)
    status_calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def save_png(self, image: Image.Image) -> str:
        (self.public / "images").mkdir(parents=True, exist_ok=True)
        name = f"fake{time.perf_counter_ns()}.png"
        image.save(self.public / "images" / name)
        return f"/images/{name}"

    def run(self, model_id: str, body: dict[str, Any]) -> Any:
        task = self.models[model_id]
        if task == "text-to-image":
            seed = sum(map(ord, body.get("text", ""))) % 255
            return {"path": self.save_png(Image.new("RGB", (64, 48), (seed, 100, 200)))}
        if task == "image-to-text":
            img = image_from(body["img_url"], self.public)
            return {"generated text": f"a picture of {img.width}x{img.height} pixels"}
        if task == "image-classification":
            image_from(body["img_url"], self.public)
            return [{"label": "tabby cat", "score": 0.9}, {"label": "dog", "score": 0.1}]
        if task == "object-detection":
            img = image_from(body["img_url"], self.public)
            return [{"label": "cat", "score": 0.98, "box": {"xmin": 2, "ymin": 2, "xmax": img.width // 2,
                                                           "ymax": img.height // 2}}]
        if task == "text-to-speech":
            import soundfile as sf

            (self.public / "audios").mkdir(parents=True, exist_ok=True)
            name = f"fake{time.perf_counter_ns()}.wav"
            sf.write(self.public / "audios" / name, np.zeros(1600, dtype="float32"), 16000)
            return {"path": f"/audios/{name}"}
        if task == "automatic-speech-recognition":
            return {"text": f"transcript of {len(body['audio_url'])} bytes"}
        if task == "token-classification":
            return [{"entity_group": "PER", "word": body["text"].split()[0], "score": 0.99}]
        return {"generated text": f"{task} of {body.get('text', '')}"}

    def app(self) -> Flask:
        app = Flask("fake-models")

        @app.get("/running")
        def running() -> Response:
            return jsonify({"running": True})

        @app.get("/status/<path:model_id>")
        def status(model_id: str) -> Response:
            with self.lock:
                self.status_calls.append(model_id)
            return jsonify({"loaded": model_id in self.models})

        @app.post("/models/<path:model_id>")
        def infer(model_id: str) -> Response:
            start = time.perf_counter()
            body = request.get_json(force=True)
            with self.lock:
                self.arrivals.append(model_id)
            if model_id not in self.models:
                return jsonify({"error": {"message": f"unknown model {model_id}"}}), 404
            time.sleep(self.delays.get(model_id, 0.0))
            gate = self.gates.get(model_id)
            if gate is not None:
                gate.wait(60)
            if model_id in self.broken:
                result: Any = {"error": {"message": f"{model_id} crashed (scripted)"}}
                code = 500
            else:
                result, code = self.run(model_id, body), 200
            with self.lock:
                self.calls.append({"model": model_id, "start": start, "end": time.perf_counter(),
                                   "body": {k: (v[:40] if isinstance(v, str) else v) for k, v in body.items()}})
            return jsonify(result), code

        return app
