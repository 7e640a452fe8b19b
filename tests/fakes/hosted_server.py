"""A fake hosted-inference server speaking the HTTP protocol InferenceClient uses for hf-inference.

POST /models/<id> with JSON {"inputs": ...} for text, or raw image/audio bytes (or base64 in JSON
`inputs`) for vision and audio; GET /status/<id>. Records every call; models can be marked broken.
"""

from __future__ import annotations

import base64
import io
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flask import Flask, Response, jsonify, request
from PIL import Image


@dataclass
class FakeHosted:
    models: dict[str, str] = field(default_factory=dict)  # id -> task
    broken: set[str] = field(default_factory=set)
    calls: list[dict[str, Any]] = field(default_factory=list)
    status_calls: list[str] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    down: bool = False

    def payload(self) -> tuple[Any, bytes | None]:
        raw = request.get_data()
        if request.is_json or raw[:1] in (b"{", b"["):
            body = request.get_json(force=True)
            inputs = body.get("inputs") if isinstance(body, dict) else body
            if isinstance(inputs, str) and len(inputs) > 200:
                try:
                    return body, base64.b64decode(inputs)
                except ValueError:
                    pass
            return body, None
        return None, raw

    def answer(self, task: str, body: Any, blob: bytes | None) -> Response:
        if task == "text-classification":
            return jsonify([[{"label": "POSITIVE", "score": 0.9}, {"label": "NEGATIVE", "score": 0.1}]])
        if task == "token-classification":
            return jsonify([{"entity_group": "PER", "word": body["inputs"].split()[0], "score": 0.99, "start": 0,
                             "end": len(body["inputs"].split()[0])}])
        if task == "text-to-image":
            buf = io.BytesIO()
            Image.new("RGB", (32, 24), (10, 20, 30)).save(buf, format="PNG")
            return Response(buf.getvalue(), mimetype="image/png")
        if task == "image-classification":
            img = Image.open(io.BytesIO(blob))
            return jsonify([{"label": f"image {img.width}x{img.height}", "score": 0.8}])
        if task == "object-detection":
            img = Image.open(io.BytesIO(blob))
            return jsonify([{"label": "dog", "score": 0.9, "box": {"xmin": 1, "ymin": 1, "xmax": img.width - 2,
                                                                   "ymax": img.height - 2}}])
        if task == "image-to-text":
            img = Image.open(io.BytesIO(blob))
            return jsonify([{"generated_text": f"hosted caption of {img.width}x{img.height}"}])
        if task == "automatic-speech-recognition":
            return jsonify({"text": f"hosted transcript of {len(blob)} bytes"})
        if task == "text-to-speech":
            import soundfile as sf

            buf = io.BytesIO()
            sf.write(buf, np.zeros(800, dtype="float32"), 16000, format="FLAC")
            return Response(buf.getvalue(), mimetype="audio/flac")
        return jsonify({"error": f"fake does not do {task}"}), 400

    def app(self) -> Flask:
        app = Flask("fake-hosted")

        @app.get("/status/<path:model_id>")
        def status(model_id: str) -> Response:
            with self.lock:
                self.status_calls.append(model_id)
            if self.down:
                return jsonify({"error": "unavailable"}), 503
            return jsonify({"loaded": model_id in self.models, "state": "Loaded" if model_id in self.models else None})

        @app.post("/models/<path:model_id>")
        def infer(model_id: str) -> Response:
            with self.lock:
                self.auth.append(request.headers.get("Authorization", ""))
            if self.down:
                return jsonify({"error": "Service Unavailable"}), 503
            if model_id not in self.models:
                return jsonify({"error": f"Model {model_id} does not exist"}), 404
            body, blob = self.payload()
            with self.lock:
                self.calls.append({"model": model_id, "json": body is not None, "bytes": len(blob or b"")})
            if model_id in self.broken:  # a provider (or proxy) that echoes the credentials it was sent
                echo = request.headers.get("Authorization", "nobody")
                return jsonify({"error": f"{model_id} is overloaded (request by {echo})"}), f"500 Overloaded ({echo})"
            return self.answer(self.models[model_id], body, blob)

        return app
