"""Flask app of the local models server (JARVIS protocol plus `GET /models` and its output files).

The app speaks the protocol; an engine (`engine.py`) runs the models: `LocalEngine` in this process, or
`RayEngine` (`ray_engine.py`), whose Ray Serve replicas hold the models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from ..access import allowed_host_names, bearer_ok, host_allowed, host_name, origin_is_local_or_same, send_public_file
from ..cancel import Cancelled
from ..errors import BadRequest, ResourceError
from ..httpbody import BODY_GATE, BodyGate, Refusal
from ..resources import DEFAULT_MAX_PIXELS
from ..urlpolicy import UrlPolicy
from .batching import batch_size_var
from .discover import Discovery, DiscoveryRefused
from .engine import Engine
from .handlers import MAX_DEPTH, Inputs, check_body, check_options
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ModelsMetrics
from .pool import InferenceFailed, ModelUnavailable, NoRoom
from .progress_stream import Answer, call_while_connected, failure, stream_call, wants_events
from .registry import ModelSpec, Registry

# header names, each written once (HTTP compares them without regard to case)
HOST, ORIGIN, AUTHORIZATION = "Host", "Origin", "Authorization"
CONTENT_TYPE, NOSNIFF = "Content-Type", "X-Content-Type-Options"
RETRY_AFTER, BATCH_SIZE, ACCEPT = "Retry-After", "X-Batch-Size", "Accept"

log = logging.getLogger(__name__)


def _error(message: str, status: int, kind: str | None = None) -> Response:
    resp = jsonify(failure(message, status, kind)[1])
    resp.status_code = status
    return resp


def create_app(pool: Engine, public_dir: Path, max_body_bytes: int = 50 * 1024 * 1024, *,
               token: str | None = None, policy: UrlPolicy | None = None,
               max_pixels: int = DEFAULT_MAX_PIXELS, discovery: Discovery | None = None,
               listen_host: str | None = None, hosts: tuple[str, ...] = (),
               fetch_bytes: int = 20 * 1024 * 1024, fetch_timeout: float = 15.0) -> Flask:
    """token: every route (files included) needs `Authorization: Bearer <token>` when set.

    fetch_bytes, fetch_timeout: the limits of an http(s) `img_url` / `audio_url` (`max_fetch_bytes`,
    `fetch_timeout`).

    Without a token, the server defends itself against web pages in a browser that can reach it (issue 20):
    a POST must be `application/json` (415; a page cannot send that without a CORS preflight, which this
    server never answers), a request with an `Origin` other than its own or a loopback page's is refused
    (403), and the `Host` header must be a loopback name, `listen_host`, this machine's name, an IP literal
    or one of `hosts` (`models_server_hosts`; 403 otherwise: DNS rebinding).

    discovery: Hub models outside the catalog that this server may download and run (`discovered_models:
    local`); None or another mode: an id outside the catalog is unknown, as in JARVIS.
    """
    registry: Registry = pool.registry
    discovering = discovery is not None and discovery.enabled

    def discovered(model_id: str) -> bool:
        """Is this id one for the discovery path (not a catalog model of any level)?"""
        return discovering and model_id not in registry.catalog_ids  # the registry's ids are all catalog ids
    app = Flask(__name__, static_folder=None)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    tokens = (token,) if token else ()
    host_names = allowed_host_names(listen_host, hosts)

    # routes are registered by call, not by decorator: mutmut skips decorated functions (docs/TESTING.md)
    def authorize() -> Response | None:
        if tokens:
            if not bearer_ok(request.headers.get(AUTHORIZATION), tokens):
                return _error("this models server needs `Authorization: Bearer <models_server_token>`", 401)
            return None
        host = request.headers.get(HOST)
        if not host_allowed(host, host_names):
            return _error(f"this models server does not answer to the host name {host_name(host)[:100]!r}; add it "
                          "to models_server_hosts in its config (or set models_server_token)", 403)
        origin = request.headers.get(ORIGIN)
        if origin is not None and not origin_is_local_or_same(origin, host):
            return _error("requests from a web page on another site are refused by a models server without "
                          "models_server_token", 403)
        if request.method == "POST" and not request.is_json:
            return _error(f"send the body as JSON with `Content-Type: application/json` (got "
                          f"{(request.mimetype or 'none')[:100]})", 415)
        return None
    app.before_request(authorize)

    def no_sniff(resp: Response) -> Response:
        resp.headers[NOSNIFF] = "nosniff"
        return resp
    app.after_request(no_sniff)

    def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500  # pragma: no mutate: werkzeug's errors all carry their code
        resp = _error(exc.description or exc.name, status)
        if getattr(exc, "valid_methods", None):  # a 405 names the methods the resource takes (HTTP requires it)
            resp.headers["Allow"] = ", ".join(exc.valid_methods)
        return resp
    app.register_error_handler(HTTPException, http_error)

    def unexpected(exc: Exception) -> Response:
        log.exception("models server error")
        return _error(f"internal error ({exc.__class__.__name__})", 500)
    app.register_error_handler(Exception, unexpected)

    metrics = ModelsMetrics(pool)

    def metrics_text() -> Response:
        """Prometheus text format; behind models_server_token like every route."""
        return Response(metrics.exposition(), headers={CONTENT_TYPE: METRICS_CONTENT_TYPE})
    app.add_url_rule("/metrics", view_func=metrics_text)  # GET (and HEAD): Flask's default

    def running() -> Response:
        return jsonify({"running": True})
    app.add_url_rule("/running", view_func=running)

    def status(model_id: str) -> Response:
        if discovered(model_id):
            return jsonify({**discovery.status(model_id), "in_memory": model_id in pool.loaded()})
        spec = registry.get(model_id)
        servable = spec is not None and registry.servable(spec)
        return jsonify({"loaded": servable, "in_memory": model_id in pool.loaded()})
    app.add_url_rule("/status/<path:model_id>", view_func=status)

    def ran_on(entry: object) -> dict[str, object]:
        """What a loaded model really runs in and on, and the device memory its load took (CUDA)."""
        if entry is None:
            return {}
        taken = getattr(entry, "device_bytes", None)
        return {"dtype": getattr(entry, "dtype", None), "weights_device": getattr(entry, "weights_device", None),
                "device_memory_mb": round(taken / 1e6, 3) if taken is not None else None}

    def model_row(spec: ModelSpec, entry: object, problem: str | None, **extra: object) -> dict[str, object]:
        return {"id": spec.id, "task": spec.task, "servable": problem is None, "problem": problem,
                "loaded": entry is not None, "device": pool.device, **extra,
                "memory_mb": round(entry.nbytes / 1e6, 1) if entry else None, **ran_on(entry)}

    def models() -> Response:
        loaded = pool.loaded()
        rows = [model_row(spec, loaded.get(spec.id), registry.problem(spec)) for spec in registry.specs.values()]
        if discovering:
            for spec in discovery.listed():  # downloaded on an earlier request; servable while the policy allows
                try:
                    discovery.check_policy(spec.id)
                    problem = None
                except DiscoveryRefused as exc:
                    problem = str(exc)
                rows.append(model_row(spec, loaded.get(spec.id), problem, discovered=True))
        memory = getattr(pool, "memory", None)  # LocalEngine: counted, budget, and the device's own reading
        return jsonify({"deployment": registry.deployment, "models": rows,
                        "discovered_models": discovery.policy.mode if discovery is not None else "off",
                        **({"memory": memory()} if memory is not None else {})})
    app.add_url_rule("/models", view_func=models)

    def infer(model_id: str) -> Response:
        spec = registry.get(model_id)
        if spec is None and not discovered(model_id):
            return _error(f"unknown model {model_id!r} at deployment level {registry.deployment!r}; see GET /models", 404)
        try:
            body = request.get_json(silent=True, force=True)
        except RecursionError:  # the JSON parser's own limit: thousands of nested brackets
            return _error(f"the body is nested more than {MAX_DEPTH} levels deep", 400)
        if not isinstance(body, dict):
            return _error("the body must be a JSON object such as {\"text\": ...} or {\"img_url\": ...}", 400)
        try:
            check_body(body)
            check_options(body)
        except BadRequest as exc:
            return _error(str(exc), 400)
        if wants_events(request.headers.get(ACCEPT)):
            return stream_call(
                lambda: call(model_id, spec, body), request.environ.get("waitress.client_disconnected"),
                name=f"call-{model_id[:40]}")
        status, payload, headers = call_while_connected(
            lambda: call(model_id, spec, body), request.environ.get("waitress.client_disconnected"))
        resp = jsonify(payload)
        resp.status_code = status
        resp.headers.update(headers)
        return resp

    def call(model_id: str, spec: ModelSpec | None, body: dict) -> Answer:
        """Download (a discovered model's first use), load and run: (status, JSON, headers), as one answer or as
        the last event of a stream."""
        if spec is None:  # a Hub model outside the catalog: judged, then downloaded on first use
            try:
                spec = discovery.ensure(model_id)
            except DiscoveryRefused as exc:
                return failure(str(exc), exc.status, exc.kind)
        problem = registry.problem(spec)
        if problem:
            return failure(problem, 404)
        inputs = Inputs(body=body, public_dir=public_dir, policy=policy, max_pixels=max_pixels, max_bytes=fetch_bytes,
                        timeout=fetch_timeout)
        started, ok, cancelled = time.perf_counter(), False, False
        batch_size_var.set(None)  # the engine says how many requests shared this one's batch
        try:
            result = pool.infer(spec, inputs)
            ok = True
        except (BadRequest, ResourceError) as exc:
            return failure(str(exc), 400)
        except ModelUnavailable as exc:
            return failure(str(exc), 404)
        except NoRoom as exc:  # memory held by models in use: a later try may fit
            return failure(str(exc), 503, "no_room", {RETRY_AFTER: "5"})
        except InferenceFailed as exc:
            return failure(f"{model_id} failed: {exc}", 500)
        except Cancelled:  # the client left (streamed or one-shot); nobody reads this
            cancelled = True
            log.info("%s stopped: its client left", model_id)
            return failure(f"{model_id} was stopped: its client left", 499, "cancelled")
        except Exception as exc:  # noqa: BLE001 - inference errors are the model's, not the server's
            log.exception("inference with %s failed", model_id)
            return failure(f"{model_id} failed: {exc.__class__.__name__}: {str(exc)[:300]}", 500)
        finally:
            metrics.call(spec.id, ok, time.perf_counter() - started, cancelled)
        size = batch_size_var.get()
        return 200, result, ({BATCH_SIZE: str(size)} if size is not None else {})

    app.add_url_rule("/models/<path:model_id>", view_func=infer, methods=[
        "POST",  # pragma: no mutate: werkzeug upper-cases method names
    ])

    def output_file(folder: str, name: str) -> Response:
        """Files this server generated, for an orchestrator that runs on another machine."""
        return send_public_file(public_dir, f"{folder}/{name}")
    app.add_url_rule("/<any(images, audios, videos):folder>/<name>", view_func=output_file)

    def check(method: str, path: str, headers: Mapping[str, str]) -> Refusal | None:
        """`authorize`'s token check on the headers alone, so a body without the token is never read."""
        if tokens and not bearer_ok(headers.get(AUTHORIZATION), tokens):
            return Refusal(401, "this models server needs `Authorization: Bearer <models_server_token>`", None)
        return None

    app.extensions[BODY_GATE] = BodyGate(max_body_bytes, check, too_large_kind=None)  # read by server.serve
    return app
