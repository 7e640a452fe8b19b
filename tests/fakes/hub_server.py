"""A fake Hugging Face Hub on loopback: the model listing and a model's files, as huggingface_hub reads them.

Written from huggingface_hub's client code (HfApi.list_models / model_info / repo_info, utils/_pagination.py,
file_download.get_hf_file_metadata):

- `GET /api/models` with `pipeline_tag`, `search` (substring of the id), `author`, `filter` (tags), `sort`
  (downloads | likes | lastModified | createdAt | trendingScore), `direction` (-1 default, or 1), `limit`
  (the page size, at most 1000), `expand` (only those fields, plus `id` and `_id`) or `full`; pages follow
  each other through a `Link: <...&cursor=...>; rel="next"` header, the cursor opaque (base64).
- Everything else (a model's info, file tree and files, as `model_info` and `snapshot_download` read them) is
  answered by the repositories in `repos` (`tests/fakes/hub_repo.py`).

Every request is recorded; `fail_at` makes the N-th listing request answer 500 (a network error mid-sync).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from flask import Flask, Response, jsonify, request

from tests.fakes.hub_repo import FakeHubRepos

DEFAULT_FIELDS = ("_id", "id", "likes", "trendingScore", "private", "downloads", "tags", "pipeline_tag", "library_name",
                  "createdAt", "modelId")
FULL_FIELDS = DEFAULT_FIELDS + ("author", "sha", "lastModified", "gated", "disabled", "siblings")
SORT_KEYS = {"downloads", "likes", "lastModified", "createdAt", "trendingScore", "id"}
MAX_PAGE = 1000


def hub_model(model_id: str, task: str, downloads: int = 0, likes: int = 0,
              last_modified: str = "2025-01-01T00:00:00.000Z", library: str = "transformers",
              tags: tuple[str, ...] = (), language: tuple[str, ...] = (), params: int | None = None,
              providers: tuple[str, ...] = (), license: str = "apache-2.0", sha: str | None = None,
              files: tuple[str, ...] = ("config.json",)) -> dict[str, Any]:
    """One model as the Hub's JSON has it (the fields HfApi parses into ModelInfo)."""
    sha = sha or hashlib.sha1(f"{model_id}{last_modified}".encode()).hexdigest()
    item: dict[str, Any] = {
        "_id": hashlib.md5(model_id.encode()).hexdigest()[:24], "id": model_id, "modelId": model_id,
        "author": model_id.split("/")[0], "sha": sha, "lastModified": last_modified, "createdAt": last_modified,
        "private": False, "gated": False, "disabled": False, "downloads": downloads, "likes": likes,
        "trendingScore": likes // 10, "library_name": library, "pipeline_tag": task,
        "tags": [library, task, *tags, *language, f"license:{license}", "region:us"],
        "cardData": {"language": list(language), "license": license, "tags": list(tags)},
        "siblings": [{"rfilename": f} for f in files],
        "inferenceProviderMapping": [{"provider": p, "providerId": model_id, "status": "live", "task": task}
                                     for p in providers],
    }
    if params:
        item["safetensors"] = {"parameters": {"F32": params}, "total": params}
    return item


@dataclass
class FakeHub:
    models: list[dict[str, Any]] = field(default_factory=list)
    repos: FakeHubRepos = field(default_factory=FakeHubRepos)  # what `/api/models/<id>` and files serve
    default_page: int = MAX_PAGE
    fail_at: int | None = None  # the N-th listing request (1-based) answers 500
    requests: list[str] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def listing_requests(self) -> list[str]:
        return [r for r in self.requests if r.startswith("/api/models?")]

    def _select(self, args) -> list[dict[str, Any]]:
        items = list(self.models)
        if args.get("pipeline_tag"):
            items = [m for m in items if m.get("pipeline_tag") == args["pipeline_tag"]]
        if args.get("author"):
            items = [m for m in items if m["id"].split("/")[0] == args["author"]]
        if args.get("search"):
            items = [m for m in items if args["search"].lower() in m["id"].lower()]
        for tag in args.getlist("filter"):
            items = [m for m in items if tag in m.get("tags", [])]
        sort = args.get("sort")
        if sort:
            if sort not in SORT_KEYS:
                raise ValueError(f"Invalid sort parameter: {sort}")
            reverse = str(args.get("direction", "-1")) != "1"
            items.sort(key=lambda m: (m.get(sort) or 0, m["id"]), reverse=reverse)
        return items

    @staticmethod
    def _fields(item: dict[str, Any], args) -> dict[str, Any]:
        expand = args.getlist("expand") or args.getlist("expand[]")
        if expand:
            keep = ("_id", "id", *expand)
        elif args.get("full") in ("True", "true", "1"):
            keep = FULL_FIELDS + (("cardData",) if args.get("cardData") else ())
        else:
            keep = DEFAULT_FIELDS + (("cardData",) if args.get("cardData") else ())
        return {k: item[k] for k in keep if k in item}

    def app(self) -> Flask:
        app = Flask("fake-hub")

        @app.before_request
        def record() -> None:
            with self.lock:
                self.requests.append(request.full_path.rstrip("?") if request.query_string else request.path)
                self.auth.append(request.headers.get("Authorization"))

        @app.get("/api/models")
        def list_models() -> Response:
            with self.lock:
                n = len(self.listing_requests())
            if self.fail_at is not None and n == self.fail_at:
                return jsonify({"error": "Internal Error"}), 500
            args = request.args
            try:
                items = self._select(args)
                size = min(int(args.get("limit") or self.default_page), MAX_PAGE)
                offset = json.loads(base64.urlsafe_b64decode(args["cursor"]))["offset"] if args.get("cursor") else 0
            except (ValueError, KeyError) as exc:
                return jsonify({"error": str(exc)}), 400
            page = [self._fields(m, args) for m in items[offset:offset + size]]
            resp = jsonify(page)
            if offset + size < len(items):
                query = [(k, v) for k, v in args.items(multi=True) if k != "cursor"]
                cursor = base64.urlsafe_b64encode(json.dumps({"offset": offset + size}).encode()).decode()
                url = f"{request.host_url.rstrip('/')}/api/models?{urlencode([*query, ('cursor', cursor)])}"
                resp.headers["Link"] = f'<{url}>; rel="next"'
            return resp

        @app.route("/<path:rest>", methods=["GET", "HEAD"])
        def repository(rest: str) -> Response:
            """Model info, file trees and files: the repositories in `self.repos` (tests/fakes/hub_repo.py)."""
            answer = self.repos.respond(request.method, "/" + rest, request.args.to_dict(), request.host_url,
                                        dict(request.headers))
            if answer is None:
                return jsonify({"error": "no such route on the fake Hub"}), 404
            resp = Response(answer.body, status=answer.status, headers=answer.headers)
            resp.headers["Content-Length"] = answer.headers.get("Content-Length", str(len(answer.body)))  # HEAD too
            return resp

        return app
