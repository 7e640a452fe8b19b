"""A fake Hugging Face Hub on loopback that serves model repositories (info, tree, files) to huggingface_hub.

Written from the installed huggingface_hub's client code, so the real `HfApi(endpoint=...).model_info`,
`snapshot_download(..., endpoint=...)` and `hf_hub_download` read it as they read the Hub:

- `GET /api/models/<id>` and `/api/models/<id>/revision/<rev>` (hf_api.py `model_info` / `repo_info`): the JSON
  `ModelInfo` parses: `id`, `author`, `sha`, `pipeline_tag`, `library_name`, `tags`, `gated`, `config`,
  `siblings` (each sibling's `size`, `blobId` and `lfs` only with `?blobs=true`, as the Hub does), ...
- `GET /api/models/<id>/tree/<rev>[/<path>]?recursive=..` (`list_repo_tree`, which `snapshot_download` calls):
  `{"type": "file", "path", "size", "oid", "lfs": {"oid", "size", "pointerSize"}}` entries, folders too.
- `HEAD`/`GET /<id>/resolve/<rev>/<file>` (file_download.py `get_hf_file_metadata`, `http_get`): a small file
  answers 200 with `X-Repo-Commit`, `ETag` (its git blob sha1) and `Content-Length`; a weight file (LFS) answers
  302 to `/cdn/<sha256>` with `X-Repo-Commit`, `X-Linked-Etag` (its sha256) and `X-Linked-Size`, and the CDN
  answers the bytes (with `Range` support, for resumed downloads). The redirect stays on this host, so the client
  follows it on HEAD; the CDN's answer repeats the commit and ETag for that reason.
- errors as the Hub answers them: 404 with `X-Error-Code: RepoNotFound | RevisionNotFound | EntryNotFound`; a
  gated repository's files are 403 with `X-Error-Code: GatedRepo` (its info stays readable, `gated: "manual"`).

`FakeHubRepos.respond(method, path, query, base_url)` is plain data in and out (None when the path is not one of
its routes), so another fake server can mount it; `FakeHubRepos.wsgi` and `FakeHubServer` serve it standalone.
Every request is recorded in `requests` as (method, path); `delays` slows chosen files down (concurrency tests).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from werkzeug.serving import WSGIRequestHandler, make_server

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".onnx_data", ".gguf")
_INFO = re.compile(r"^/api/models/(?P<id>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?/?$")
_TREE = re.compile(r"^/api/models/(?P<id>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_RESOLVE = re.compile(r"^/(?P<id>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha256>[0-9a-f]{64})$")


def paced(data: bytes, seconds: float, piece: int = 2**20) -> Iterator[bytes]:
    """`data` a MiB at a time, `seconds` apart."""
    for at in range(0, len(data), piece):
        if at:
            time.sleep(seconds)
        yield data[at:at + piece]


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    pieces: Iterator[bytes] | None = None  # the body sent piece by piece (FakeHubRepos.paces), else at once

    @classmethod
    def json(cls, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> HubResponse:
        body = json.dumps(value).encode()
        return cls(status, {"Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})},
                   body)

    @classmethod
    def error(cls, status: int, code: str, message: str, commit: str | None = None) -> HubResponse:
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        if commit:
            headers["X-Repo-Commit"] = commit
        return cls.json({"error": message}, status, headers)


@dataclass
class FakeRepo:
    id: str
    files: dict[str, bytes]
    sha: str
    pipeline_tag: str | None = None
    library_name: str | None = "transformers"
    gated: bool | str = False
    tags: tuple[str, ...] = ()
    config: dict[str, Any] | None = None
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-06-01T00:00:00.000Z"

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)

    def sibling(self, name: str, blobs: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {"rfilename": name}
        if blobs:
            data = self.files[name]
            entry.update(size=len(data), blobId=git_blob_sha1(data))
            if self.is_lfs(name):
                entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        return entry

    def info(self, blobs: bool = False) -> dict[str, Any]:
        author = self.id.split("/")[0]
        tags = [t for t in (self.library_name, self.pipeline_tag) if t] + list(self.tags) + ["region:us"]
        return {
            "_id": hashlib.md5(self.id.encode()).hexdigest()[:24], "id": self.id, "modelId": self.id,
            "author": author, "sha": self.sha, "lastModified": self.last_modified, "createdAt": self.last_modified,
            "private": False, "disabled": False, "gated": self.gated, "downloads": self.downloads,
            "likes": self.likes, "library_name": self.library_name, "pipeline_tag": self.pipeline_tag,
            "tags": tags, "config": self.config or {}, "cardData": {"license": "apache-2.0"},
            "siblings": [self.sibling(name, blobs) for name in sorted(self.files)],
            "usedStorage": sum(len(d) for d in self.files.values()),
        }

    def tree(self, under: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = under.strip("/") + "/" if under.strip("/") else ""
        entries, folders = [], set()
        for name in sorted(self.files):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix):]
            parts = rest.split("/")
            for depth in range(1, len(parts)):  # the folders on the way to this file
                folder = prefix + "/".join(parts[:depth])
                if (recursive or depth == 1) and folder not in folders:
                    folders.add(folder)
                    entries.append({"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(),
                                    "size": 0, "path": folder})
            if len(parts) > 1 and not recursive:
                continue
            data = self.files[name]
            entry: dict[str, Any] = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": name}
            if self.is_lfs(name):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries


def hub_config(files: Mapping[str, bytes]) -> dict[str, Any]:
    """The `config` summary the Hub derives from a repository's config.json (architectures, model_type, auto_map)."""
    try:
        raw = json.loads(files["config.json"])
    except (KeyError, ValueError):
        return {}
    return {k: raw[k] for k in ("architectures", "model_type", "auto_map") if k in raw}


class FakeHubRepos:
    """Model repositories served the way the Hub serves them; see the module docstring for the routes."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []
        self.delays: dict[str, float] = {}  # file name -> seconds its download (GET) waits before answering
        # file name -> seconds between the MiB pieces of its download (GET), as a slow link delivers a big file
        self.paces: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, repo_id: str, files: Mapping[str, bytes] | Path, *, pipeline_tag: str | None,
            library_name: str | None = "transformers", gated: bool | str = False, tags: tuple[str, ...] = (),
            config: dict[str, Any] | None = None, sha: str | None = None, **extra: Any) -> FakeRepo:
        """A repository from a dict of files or from a folder (e.g. one `save_pretrained` wrote)."""
        if isinstance(files, Path):
            files = {p.relative_to(files).as_posix(): p.read_bytes() for p in sorted(files.rglob("*"))
                     if p.is_file() and ".cache" not in p.relative_to(files).parts}
        files = dict(files)
        sha = sha or hashlib.sha1(repo_id.encode() + b"".join(sorted(files.values()))).hexdigest()
        repo = FakeRepo(repo_id, files, sha, pipeline_tag, library_name, gated, tuple(tags),
                        hub_config(files) if config is None else config, **extra)
        with self._lock:
            self.repos[repo_id] = repo
        return repo

    def requests_for(self, repo_id: str) -> list[tuple[str, str]]:
        """The requests that named this repository (info, tree, files; CDN downloads carry its id in the query)."""
        with self._lock:
            return [(m, p) for m, p in self.requests
                    if f"/{repo_id}/" in p.split("?")[0] + "/" or f"repo={quote(repo_id, safe='')}" in p]

    def downloads_of(self, repo_id: str, name: str) -> int:
        """How many times a file's bytes were sent (GET on the CDN or on /resolve), HEAD not counted."""
        with self._lock:
            repo = self.repos[repo_id]
            data = repo.files[name]
            cdn = f"/cdn/{hashlib.sha256(data).hexdigest()}"
            return sum(1 for m, p in self.requests if m == "GET" and (
                p.split("?")[0] == cdn and f"repo={quote(repo_id, safe='')}" in p
                or (p.startswith(f"/{repo_id}/resolve/") and p.endswith(f"/{name}") and not repo.is_lfs(name))))

    def _repo_at(self, repo_id: str, rev: str | None) -> tuple[FakeRepo | None, HubResponse | None]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, HubResponse.error(404, "RepoNotFound", "Repository not found")
        if rev is not None and unquote(rev) not in ("main", repo.sha):
            return None, HubResponse.error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}")
        return repo, None

    def respond(self, method: str, path: str, query: Mapping[str, str], base_url: str,
                headers: Mapping[str, str] | None = None) -> HubResponse | None:
        """One request -> the Hub's answer, or None when `path` is not one of these routes."""
        path = unquote(path)
        with self._lock:
            self.requests.append((method, path + (("?" + "&".join(f"{k}={quote(str(v), safe='')}"
                                                                  for k, v in query.items())) if query else "")))
        if method not in ("GET", "HEAD"):
            return None
        if m := _TREE.match(path):
            repo, err = self._repo_at(m["id"], m["rev"])
            if err:
                return err
            recursive = str(query.get("recursive", "")).lower() in ("1", "true")
            return HubResponse.json(repo.tree(m["path"] or "", recursive))
        if m := _INFO.match(path):
            repo, err = self._repo_at(m["id"], m["rev"])
            if err:
                return err
            return HubResponse.json(repo.info(blobs=str(query.get("blobs", "")).lower() in ("1", "true")))
        if m := _RESOLVE.match(path):
            return self._resolve(method, m["id"], m["rev"], m["file"], base_url, headers or {})
        if m := _CDN.match(path):
            return self._cdn(method, m["sha256"], query.get("repo", ""), headers or {})
        return None

    def _resolve(self, method: str, repo_id: str, rev: str, name: str, base_url: str,
                 headers: Mapping[str, str]) -> HubResponse:
        repo, err = self._repo_at(repo_id, rev)
        if err:
            return err
        if repo.gated:
            return HubResponse.error(403, "GatedRepo", f"Access to model {repo_id} is restricted: you must have "
                                                       "access to it and be authenticated to access it.", repo.sha)
        data = repo.files.get(name)
        if data is None:
            return HubResponse.error(404, "EntryNotFound", f"{name} does not exist on \"{rev}\"", repo.sha)
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if repo.is_lfs(name):
            sha256 = hashlib.sha256(data).hexdigest()
            location = f"{base_url.rstrip('/')}/cdn/{sha256}?repo={quote(repo_id, safe='')}&file={quote(name, safe='')}"
            return HubResponse(302, {**common, "Location": location, "X-Linked-Etag": f'"{sha256}"',
                                     "X-Linked-Size": str(len(data)), "ETag": f'"{git_blob_sha1(data)}"',
                                     "Content-Length": "0"})
        return self._bytes(method, data, {**common, "ETag": f'"{git_blob_sha1(data)}"'}, name, headers)

    def _cdn(self, method: str, sha256: str, repo_id: str, headers: Mapping[str, str]) -> HubResponse:
        for repo in list(self.repos.values()):
            if repo_id and repo.id != repo_id:
                continue
            for name, data in repo.files.items():
                if repo.is_lfs(name) and hashlib.sha256(data).hexdigest() == sha256:
                    return self._bytes(method, data, {"X-Repo-Commit": repo.sha, "ETag": f'"{sha256}"',
                                                      "Accept-Ranges": "bytes"}, name, headers)
        return HubResponse(404, {"Content-Length": "0"})

    def _bytes(self, method: str, data: bytes, base: dict[str, str], name: str,
               headers: Mapping[str, str]) -> HubResponse:
        if method == "GET" and self.delays.get(name):
            time.sleep(self.delays[name])
        start = 0
        m = re.match(r"bytes=(\d+)-$", headers.get("Range", headers.get("range", "")) or "")
        if m and int(m[1]) < len(data):
            start = int(m[1])
        body = data[start:]
        out = {**base, "Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
        if start:
            out["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        pace = self.paces.get(name) if method == "GET" else None
        return HubResponse(206 if start else 200, out, b"" if method == "HEAD" else body,
                           paced(body, pace) if pace else None)

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        """A WSGI app of these routes alone (404 for anything else)."""
        scheme = environ.get("wsgi.url_scheme", "http")
        host = environ.get("HTTP_HOST") or f"{environ['SERVER_NAME']}:{environ['SERVER_PORT']}"
        query = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        headers = {k[5:].replace("_", "-").title(): v for k, v in environ.items() if k.startswith("HTTP_")}
        raw_path = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
        resp = self.respond(environ["REQUEST_METHOD"], raw_path.split("?")[0], query, f"{scheme}://{host}", headers)
        if resp is None:
            resp = HubResponse.error(404, "NotFound", "no such route on the fake Hub")
        reason = {200: "OK", 206: "Partial Content", 302: "Found", 403: "Forbidden", 404: "Not Found"}
        start_response(f"{resp.status} {reason.get(resp.status, 'Status')}", list(resp.headers.items()))
        return resp.pieces if resp.pieces is not None else [resp.body]


class _Quiet(WSGIRequestHandler):
    def log_request(self, *args: object, **kwargs: object) -> None:  # the requests are in FakeHubRepos.requests
        pass


class FakeHubServer:
    """FakeHubRepos on a free loopback port, from a background thread (also a context manager)."""

    def __init__(self, repos: FakeHubRepos | None = None, port: int = 0):
        self.repos = repos or FakeHubRepos()
        self.server = make_server("127.0.0.1", port, self.repos.wsgi, threaded=True, request_handler=_Quiet)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeHubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeHubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
