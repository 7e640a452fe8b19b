"""A fake Hugging Face router with the Hub's model API beside it, on loopback: what `InferenceClient(provider=...)`
and `HfApi.model_info` send and read, written from huggingface_hub 2.4.0 (`inference/_providers/*.py`,
`hf_api.py`).

The Hub (point HF_ENDPOINT or `catalog_sync.endpoint` here):
- `GET /api/models/<id>` (`?expand=inferenceProviderMapping` or the full info): the model with its
  `inferenceProviderMapping` as `model_info` has it, a dict {provider: {providerId, status, task}} in the order
  the token's owner set in their settings (`preferences`; the default order without a token).

The router (point `huggingface.router_url` here; the real one is https://router.huggingface.co/<provider>/...):
- hf-inference: `POST /hf-inference/models/<id>`: raw image/audio bytes or JSON {"inputs"}; the pipeline's JSON
  (an image's bytes for text-to-image).
- fal-ai (synchronous fal.run behind the router): `POST /fal-ai/<providerId>` with JSON: text-to-image
  {"prompt"} -> {"images": [{"url", "width", "height", "content_type"}], ...}, whose url the client then GETs
  (`/files/<name>`, fal's CDN); automatic-speech-recognition {"audio_url": "data:audio/mpeg;base64,..."} ->
  {"text", "chunks"}.
- fal-ai's queue (what huggingface_hub uses for image-to-image, text-to-video, image-to-video, image-segmentation),
  for an `hf_` token: `POST /fal-ai/<providerId>?_subdomain=queue` -> {"request_id", "status": "IN_QUEUE",
  "queue_position", "response_url": "https://queue.fal.run/<owner>/<app>/requests/<id>", "status_url", ...} (fal
  names the request under the app's first two segments: `fal-ai/flux/dev` is `fal-ai/flux`); the client then polls
  `GET /fal-ai/<owner>/<app>/requests/<id>/status?_subdomain=queue` every 0.5 s -> {"status": "IN_QUEUE",
  "queue_position": n} / {"status": "IN_PROGRESS", "logs": [...]} / {"status": "COMPLETED"}, then GETs
  `/fal-ai/<owner>/<app>/requests/<id>?_subdomain=queue` for the result ({"images": [{"url", ...}]}).
  `fal_queue[providerId] = [2, 1, 0, "IN_PROGRESS"]`: what the polls answer before COMPLETED (a number: that
  position in the queue); without it the first poll answers COMPLETED.
- replicate: `POST /replicate/v1/models/<owner>/<name>/predictions` or `/replicate/v1/predictions` with
  {"version"} (a providerId `owner/name:version`), `Prefer: wait`, {"input": {...}} -> the prediction, its
  `output` a transcription object for speech recognition or file URLs for images.
- every OpenAI-compatible provider: `POST /<provider>/v1/chat/completions` {"model": providerId, "messages"}.

`failures[provider] = status` makes that provider answer with the router's error for the status (401, 402, 429,
503, 500); every call is recorded (`calls`), with the Authorization header it carried.

What real accounts and networks do, as the real services do it:
- `revoked`: tokens the Hub and the router refuse on every call, public models included: 401 with the Hub's
  `X-Error-Message: Invalid credentials in Authorization header` (what huggingface_hub reads to tell a bad token
  from a missing repository, which the Hub also answers with 401).
- `hub_status`: the Hub's model API answers every call with this status (500 Internal Error, 429 with the
  rate-limit headers, 503); `anonymous_status`: only calls without a token get it (the Hub rate-limits
  anonymous callers first).
- `links[provider] = url`: the file URL that provider's answer points at instead of its own (a loopback or
  private address, an expired signed link, a redirect, a huge file). `cdn` (`cdn_app`) is a file host like
  fal's or replicate's: `/files/<name>`, `/expired/<name>` (403, the XML body of an expired signed URL), `/gone/<name>` (410),
  `/big` (64 MB, its length said), `/redirect?to=<url>` (302).
- `replicate_outputs[model] = output`: replicate's prediction `output` for that model instead of the usual one
  (a `{"txt_file": url}` transcription, or None: `Prefer: wait` ran out before the prediction finished).
"""

from __future__ import annotations

import base64
import io
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, jsonify, request
from PIL import Image

INVALID_TOKEN = "Invalid credentials in Authorization header"
ERRORS = {
    401: "Invalid credentials in Authorization header",
    402: "You have exceeded your monthly included credits for Inference Providers. Subscribe to PRO to get 20x "
         "more monthly included credits.",
    429: "Rate limit reached. Please retry later.",
    500: "Internal server error",
}


@dataclass
class Served:
    """One model on one provider: the id the provider knows it by, the task, and whether it is live."""

    provider: str
    provider_id: str
    task: str
    status: str = "live"


@dataclass
class FakeRouter:
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {"pipeline_tag", "served": [Served]}
    preferences: dict[str, list[str]] = field(default_factory=dict)  # token -> providers in the user's order
    failures: dict[str, int] = field(default_factory=dict)  # provider -> HTTP status it answers with
    hangs: dict[str, float] = field(default_factory=dict)  # provider (or "hub") -> seconds it waits before answering
    calls: list[dict[str, Any]] = field(default_factory=list)
    hub_calls: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    hub_status: int | None = None
    anonymous_status: int | None = None
    links: dict[str, str] = field(default_factory=dict)
    replicate_outputs: dict[str, Any] = field(default_factory=dict)
    fal_queue: dict[str, list[Any]] = field(default_factory=dict)  # providerId -> what each status poll answers
    queued: dict[str, dict[str, Any]] = field(default_factory=dict)  # request id -> its script and result
    cdn_hits: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _names: Any = field(default_factory=lambda: itertools.count(1))

    def serve(self, model_id: str, pipeline_tag: str, *served: Served) -> None:
        self.models[model_id] = {"pipeline_tag": pipeline_tag, "served": list(served)}

    def reset(self) -> None:
        with self.lock:
            self.failures.clear()
            self.hangs.clear()
            self.calls.clear()
            self.hub_calls.clear()
            self.revoked.clear()
            self.hub_status = self.anonymous_status = None
            self.links.clear()
            self.replicate_outputs.clear()
            self.fal_queue.clear()
            self.queued.clear()
            self.cdn_hits.clear()

    def calls_to(self, provider: str) -> list[dict[str, Any]]:
        with self.lock:
            return [c for c in self.calls if c["provider"] == provider]

    # -- the Hub's model API ---------------------------------------------------------------------------

    def mapping(self, model_id: str, token: str | None) -> dict[str, dict[str, str]]:
        served = list(self.models[model_id]["served"])
        order = self.preferences.get(token or "")
        if order:
            served.sort(key=lambda s: order.index(s.provider) if s.provider in order else len(order))
        return {s.provider: {"providerId": s.provider_id, "status": s.status, "task": s.task} for s in served}

    def refused(self) -> Response | None:
        """The Hub's and the router's answer to a revoked token: 401 on every call."""
        token = (request.headers.get("Authorization") or "").removeprefix("Bearer ") or None
        if token in self.revoked:
            resp = jsonify({"error": INVALID_TOKEN})
            resp.status_code = 401
            resp.headers["X-Error-Message"] = INVALID_TOKEN
            return resp
        return None

    def hub_failure(self, token: str | None) -> Response | None:
        status = self.hub_status or (self.anonymous_status if token is None else None)
        if status is None:
            return None
        if status == 429:
            resp = jsonify({"error": "You have exceeded our hourly quotas for action: api. We invite you to retry "
                                     "later."})
            resp.headers["RateLimit"] = '"api";r=0;t=120'
            resp.headers["RateLimit-Policy"] = '"fixed window";"api";q=500;w=300'
        else:
            resp = jsonify({"error": "Internal Error - We're working hard to fix this as soon as possible!"})
        resp.status_code = status
        return resp

    def model_info(self, model_id: str) -> Response:
        token = (request.headers.get("Authorization") or "").removeprefix("Bearer ") or None
        with self.lock:
            self.hub_calls.append({"model": model_id, "expand": request.args.getlist("expand"), "token": token})
        time.sleep(self.hangs.get("hub", 0))
        refused = self.refused() or self.hub_failure(token)
        if refused is not None:
            return refused
        model = self.models.get(model_id)
        if model is None:
            return jsonify({"error": "Repository not found"}), 404
        info: dict[str, Any] = {"_id": f"id-{model_id}", "id": model_id}
        expand = request.args.getlist("expand") or request.args.getlist("expand[]")
        if not expand or "pipeline_tag" in expand:
            info.update(pipeline_tag=model["pipeline_tag"], modelId=model_id, private=False, tags=[model["pipeline_tag"]],
                        downloads=1000, likes=10, library_name="transformers")
        if not expand or "inferenceProviderMapping" in expand:
            info["inferenceProviderMapping"] = self.mapping(model_id, token)
        return jsonify(info)

    # -- the router --------------------------------------------------------------------------------

    def record(self, provider: str, model: str | None, **extra: Any) -> None:
        with self.lock:
            self.calls.append({"provider": provider, "model": model, "path": request.path,
                               "authorization": request.headers.get("Authorization"),
                               "content_type": request.headers.get("Content-Type"), **extra})

    def failure(self, provider: str, model: str | None) -> Response | tuple[Response, int] | None:
        refused = self.refused()
        if refused is not None:
            return refused
        if provider in self.hangs:
            time.sleep(self.hangs[provider])
        status = self.failures.get(provider)
        if status is None:
            return None
        if status == 503:
            return jsonify({"error": f"Model {model} is currently loading", "estimated_time": 20.0}), 503
        return jsonify({"error": ERRORS.get(status, "error")}), status

    def served_by(self, provider: str, provider_id: str) -> tuple[str, Served] | None:
        for model_id, model in self.models.items():
            for s in model["served"]:
                if s.provider == provider and (s.provider_id == provider_id or s.provider_id.endswith(":" + provider_id)):
                    return model_id, s
        return None

    def file_url(self, data: bytes, suffix: str, provider: str | None = None) -> str:
        if provider in self.links:
            return self.links[provider]
        name = f"{next(self._names)}.{suffix}"
        with self.lock:
            self.files[name] = data
        return f"{request.host_url.rstrip('/')}/files/{name}"

    def keep(self, data: bytes, suffix: str) -> str:
        """A file on the CDN; its name (`/files/<name>` there)."""
        name = f"{next(self._names)}.{suffix}"
        with self.lock:
            self.files[name] = data
        return name

    def cdn_app(self) -> Flask:
        """A provider's file host: the files `keep` stored, expired signed links, a huge file, redirects."""
        app = Flask("fake-cdn")

        @app.before_request
        def hit() -> None:
            with self.lock:
                self.cdn_hits.append(request.full_path.rstrip("?"))

        @app.get("/files/<name>")
        def cdn_file(name: str) -> Response:
            with self.lock:
                data = self.files.get(name)
            if data is None:
                return jsonify({"error": "no such file"}), 404
            return Response(data, mimetype="image/png" if name.endswith(".png") else "text/plain")

        @app.get("/expired/<name>")
        def expired(name: str) -> Response:
            return Response("<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>Request "
                            "has expired</Message></Error>", status=403, mimetype="application/xml")

        @app.get("/gone/<name>")
        def gone(name: str) -> Response:  # a file the host has deleted for good
            return jsonify({"error": "gone"}), 410

        @app.get("/big")
        def big() -> Response:
            chunk, count = b"\0" * 65536, 1024  # 64 MB, its length said

            def body():
                for _ in range(count):
                    yield chunk

            return Response(body(), mimetype="image/png", headers={"Content-Length": str(len(chunk) * count)})

        @app.get("/unsaid")
        def unsaid() -> Response:  # 64 MB, no length said: only counting the bytes stops it
            def body():
                for _ in range(1024):
                    yield b"\0" * 65536

            return Response(body(), mimetype="image/png")

        @app.get("/redirect")
        def redirect() -> Response:
            return Response("", status=302, headers={"Location": request.args["to"]})

        return app

    def fal_submit(self, provider_id: str, task: str, body: dict[str, Any]) -> Response | tuple[Response, int]:
        """A request into fal's queue: its id, and the answers its status polls and result will get."""
        if task != "image-to-image":
            return jsonify({"detail": f"the fake does not queue {task} on fal-ai"}), 422
        source = Image.open(io.BytesIO(base64.b64decode(body["image_url"].split(",", 1)[1])))
        buf = io.BytesIO()
        Image.new("RGB", source.size, (30, 60, 90)).save(buf, format="PNG")
        result = {"images": [{"url": self.file_url(buf.getvalue(), "png", "fal-ai"), "width": source.width,
                              "height": source.height, "content_type": "image/png"}], "prompt": body.get("prompt")}
        app = "/".join(provider_id.split("/")[:2])
        request_id = f"req-{next(self._names)}"
        response_url = f"https://queue.fal.run/{app}/requests/{request_id}"
        script = list(self.fal_queue.get(provider_id, []))
        with self.lock:
            self.queued[request_id] = {"app": app, "model": provider_id, "script": script, "result": result,
                                       "response_url": response_url, "done": False}
        first = script[0] if script and isinstance(script[0], int) else 0
        return jsonify({"request_id": request_id, "status": "IN_QUEUE", "queue_position": first,
                        "response_url": response_url, "status_url": f"{response_url}/status",
                        "cancel_url": f"{response_url}/cancel"})

    def image(self, prompt: str, color: tuple[int, int, int]) -> tuple[bytes, int, int]:
        buf = io.BytesIO()
        width, height = 48, 32
        Image.new("RGB", (width, height), color).save(buf, format="PNG")
        return buf.getvalue(), width, height

    def app(self) -> Flask:
        app = Flask("fake-router")
        app.json.sort_keys = False  # the mapping's order is the user's order of providers

        @app.get("/api/models/<path:model_id>")
        def hub_model(model_id: str) -> Response:
            return self.model_info(model_id.removesuffix("/"))

        @app.get("/files/<name>")
        def cdn(name: str) -> Response:
            with self.lock:
                data = self.files.get(name)
            if data is None:
                return jsonify({"error": "no such file"}), 404
            return Response(data, mimetype="image/png" if name.endswith(".png") else "application/octet-stream")

        @app.post("/hf-inference/models/<path:model_id>")
        def hf_inference(model_id: str) -> Response:
            self.record("hf-inference", model_id, bytes=len(request.get_data()))
            failed = self.failure("hf-inference", model_id)
            if failed:
                return failed
            model = self.models.get(model_id)
            if model is None or not any(s.provider == "hf-inference" for s in model["served"]):
                return jsonify({"error": f"Model {model_id} is not served by hf-inference"}), 404
            task = model["pipeline_tag"]
            if task == "image-to-text":
                img = Image.open(io.BytesIO(request.get_data()))
                return jsonify([{"generated_text": f"hf-inference caption of {img.width}x{img.height}"}])
            if task == "text-classification":
                return jsonify([[{"label": "POSITIVE", "score": 0.9}]])
            if task == "text-to-image":
                data, _, _ = self.image(request.get_json(force=True)["inputs"], (0, 200, 90))
                return Response(data, mimetype="image/png")
            return jsonify({"error": f"the fake does not do {task} on hf-inference"}), 400

        @app.post("/fal-ai/<path:provider_id>")
        def fal_ai(provider_id: str) -> Response:
            body = request.get_json(force=True)
            found = self.served_by("fal-ai", provider_id)
            self.record("fal-ai", found[0] if found else None, provider_id=provider_id, json=sorted(body))
            failed = self.failure("fal-ai", found[0] if found else provider_id)
            if failed:
                return failed
            if found is None:
                return jsonify({"detail": f"Application '{provider_id}' not found"}), 404
            task = found[1].task
            if request.args.get("_subdomain") == "queue":
                return self.fal_submit(provider_id, task, body)
            if task == "text-to-image":
                data, w, h = self.image(body["prompt"], (250, 120, 0))
                return jsonify({"images": [{"url": self.file_url(data, "png", "fal-ai"), "width": w, "height": h,
                                            "content_type": "image/png"}],
                                "timings": {"inference": 0.01}, "seed": 42, "has_nsfw_concepts": [False],
                                "prompt": body["prompt"]})
            if task == "automatic-speech-recognition":
                audio = base64.b64decode(body["audio_url"].split(",", 1)[1])
                text = f"fal-ai transcript of {len(audio)} bytes"
                return jsonify({"text": text, "chunks": [{"timestamp": [0.0, 0.5], "text": text}]})
            return jsonify({"detail": f"the fake does not do {task} on fal-ai"}), 422

        @app.get("/fal-ai/<path:rest>")
        def fal_ai_queue(rest: str) -> Response:
            refused = self.refused()
            if refused is not None:
                return refused
            head, _, tail = rest.partition("/requests/")
            request_id, _, status = tail.partition("/")
            with self.lock:
                job = self.queued.get(request_id)
                if job is None or job["app"] != head:
                    return jsonify({"detail": "Request not found"}), 404
                self.calls.append({"provider": "fal-ai", "model": job["model"], "path": request.path,
                                   "authorization": request.headers.get("Authorization"), "poll": status or "result"})
                if status == "status":
                    step = job["script"].pop(0) if job["script"] else "COMPLETED"
                    job["done"] = step == "COMPLETED"
                    answer: dict[str, Any] = {"status": step, "response_url": job["response_url"]}
                    if isinstance(step, int):
                        answer = {"status": "IN_QUEUE", "queue_position": step, "response_url": job["response_url"]}
                    elif step == "IN_PROGRESS":
                        answer["logs"] = [{"message": "step 3/28", "level": "INFO", "timestamp": "2026-11-28T07:00:00"}]
                    return jsonify(answer)
                if not job["done"]:
                    return jsonify({"detail": "Request is still in progress"}), 400
                return jsonify(job["result"])

        def replicate(provider_id: str) -> Response:
            body = request.get_json(force=True)
            found = self.served_by("replicate", provider_id)
            self.record("replicate", found[0] if found else None, provider_id=provider_id, json=sorted(body),
                        prefer=request.headers.get("Prefer"))
            failed = self.failure("replicate", found[0] if found else provider_id)
            if failed:
                return failed
            if found is None:
                return jsonify({"detail": "The requested resource could not be found."}), 404
            task, inputs = found[1].task, body.get("input") or {}
            prediction = {"id": "p1", "model": found[1].provider_id.split(":")[0], "version": body.get("version"),
                          "status": "succeeded", "input": sorted(inputs), "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
            if found[0] in self.replicate_outputs:
                prediction["output"] = self.replicate_outputs[found[0]]
                if prediction["output"] is None:  # `Prefer: wait` ran out (60 s at most) before it finished
                    prediction["status"] = "processing"
            elif task == "automatic-speech-recognition":
                audio = base64.b64decode(inputs["audio"].split(",", 1)[1])
                prediction["output"] = {"transcription": f"replicate transcript of {len(audio)} bytes",
                                        "segments": [], "detected_language": "english"}
            elif task == "text-to-image":
                data, _, _ = self.image(inputs["prompt"], (0, 90, 250))
                prediction["output"] = [self.file_url(data, "png", "replicate")]
            else:
                return jsonify({"detail": f"the fake does not do {task} on replicate"}), 422
            return jsonify(prediction), 201

        @app.post("/replicate/v1/models/<path:provider_id>/predictions")
        def replicate_model(provider_id: str) -> Response:
            return replicate(provider_id)

        @app.post("/replicate/v1/predictions")
        def replicate_version() -> Response:
            return replicate(str(request.get_json(force=True).get("version")))

        @app.post("/<provider>/v1/chat/completions")
        def chat(provider: str) -> Response:
            body = request.get_json(force=True)
            found = self.served_by(provider, body.get("model", ""))
            self.record(provider, found[0] if found else None, provider_id=body.get("model"), json=sorted(body))
            failed = self.failure(provider, found[0] if found else body.get("model"))
            if failed:
                return failed
            if found is None:
                return jsonify({"error": {"message": f"model {body.get('model')} not found"}}), 404
            question = body["messages"][-1]["content"]
            return jsonify({"id": "c1", "object": "chat.completion", "created": int(time.time()),
                            "model": body["model"],
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": f"{provider} says: {question}"}}],
                            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})

        return app
