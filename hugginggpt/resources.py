"""Inputs and outputs on disk and on the web, handled as untrusted.

A request may name a file under `public/` (`/examples/a.jpg`, `examples/a.jpg`, `public/examples/a.jpg`),
an http(s) URL, or a data URI. Paths never escape `public/`; URLs are fetched with size and time limits;
generated files get collision-free names under `public/images|audios|videos/`.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import mimetypes
import os
import re
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from .errors import ResourceError

KIND_DIRS = {"image": "images", "audio": "audios", "video": "videos", "upload": "uploads"}
UPLOAD_TYPES = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/bmp": "bmp",
                "audio/wav": "wav", "audio/flac": "flac", "audio/ogg": "ogg", "audio/mpeg": "mp3"}
_MAGIC = (
    (b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "audio/wav"),
    (b"ID3", "audio/mpeg"), (b"fLaC", "audio/flac"), (b"OggS", "audio/ogg"), (b"BM", "image/bmp"),
)


@dataclass(frozen=True)
class Resource:
    data: bytes
    mime: str
    source: str  # what the request said
    public_path: str | None = None  # "/examples/a.jpg" when the file lies under public/

    def data_uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def sniff_mime(data: bytes, name: str = "") -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            if magic == b"RIFF" and data[8:12] == b"WEBP":
                return "image/webp"
            return mime
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


def public_file(value: str, public_dir: Path) -> Path:
    """The file under public/ that a request path names; refuses anything outside it."""
    raw = unquote(value.strip()).replace("\\", "/")
    if "\x00" in raw:
        raise ResourceError(f"invalid path {value!r}")
    rel = raw.lstrip("/")
    if rel.startswith("public/"):
        rel = rel[len("public/") :]
    root = public_dir.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise ResourceError(f"path {value!r} points outside public/; use a path like /examples/a.jpg")
    if not target.is_file():
        raise ResourceError(f"file not found: {value!r} (paths are relative to public/, e.g. /examples/a.jpg)")
    return target


def public_path_of(path: Path, public_dir: Path) -> str:
    return "/" + path.resolve().relative_to(public_dir.resolve()).as_posix()


def _check_host(url: str) -> None:
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        raise ResourceError(f"cannot resolve host of {url!r}") from None
    for info in infos:
        addr = ipaddress.ip_address(info[4][0].split("%")[0])
        if addr.is_link_local or addr.is_multicast or addr.is_unspecified:
            raise ResourceError(f"refusing to fetch {url!r}: link-local, multicast or unspecified address")


def fetch_url(url: str, max_bytes: int, timeout: float, proxy: str | None = None) -> Resource:
    _check_host(url)
    proxies = {"http": proxy, "https": proxy} if proxy else None
    try:
        with requests.get(url, stream=True, timeout=timeout, proxies=proxies, allow_redirects=True) as resp:
            if resp.status_code >= 400:
                raise ResourceError(f"fetching {url!r} failed: HTTP {resp.status_code}")
            declared = resp.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > max_bytes:
                raise ResourceError(f"{url!r} is larger than the {max_bytes // (1024 * 1024)} MiB limit")
            chunks, size = [], 0
            for chunk in resp.iter_content(65536):
                size += len(chunk)
                if size > max_bytes:
                    raise ResourceError(f"{url!r} is larger than the {max_bytes // (1024 * 1024)} MiB limit")
                chunks.append(chunk)
            data = b"".join(chunks)
            mime = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
    except requests.RequestException as exc:
        raise ResourceError(f"fetching {url!r} failed: {exc.__class__.__name__}") from None
    if not mime or mime == "application/octet-stream":
        mime = sniff_mime(data, urlsplit(url).path)
    return Resource(data=data, mime=mime, source=url)


def decode_data_uri(value: str, max_bytes: int) -> Resource:
    m = re.match(r"^data:([\w/+.-]*)(;[^,]*)?,(.*)$", value, re.DOTALL)
    if not m:
        raise ResourceError("malformed data URI")
    if len(m.group(3)) > max_bytes * 4 // 3 + 4:
        raise ResourceError(f"data URI is larger than the {max_bytes // (1024 * 1024)} MiB limit")
    try:
        if m.group(2) and "base64" in m.group(2):
            data = base64.b64decode(m.group(3), validate=False)
        else:
            data = unquote(m.group(3)).encode()
    except (binascii.Error, ValueError):
        raise ResourceError("data URI is not valid base64") from None
    mime = m.group(1) or sniff_mime(data)
    return Resource(data=data, mime=mime, source="data:" + mime)


def resolve(value: str, public_dir: Path, max_bytes: int, timeout: float, proxy: str | None = None) -> Resource:
    """Any accepted way of naming an input -> its bytes."""
    if not isinstance(value, str) or not value.strip():
        raise ResourceError("empty resource reference")
    value = value.strip()
    if value.startswith("data:"):
        return decode_data_uri(value, max_bytes)
    scheme = urlsplit(value).scheme.lower()
    if scheme in ("http", "https"):
        return fetch_url(value, max_bytes, timeout, proxy)
    if scheme and len(scheme) > 1:
        raise ResourceError(f"unsupported URL scheme {scheme!r} in {value!r}; use http(s), data: or a public/ path")
    path = public_file(value, public_dir)
    if path.stat().st_size > max_bytes:
        raise ResourceError(f"{value!r} is larger than the {max_bytes // (1024 * 1024)} MiB limit")
    data = path.read_bytes()
    return Resource(data=data, mime=sniff_mime(data, path.name), source=value, public_path=public_path_of(path, public_dir))


def new_output_path(public_dir: Path, kind: str, ext: str) -> tuple[Path, str]:
    """A fresh file under public/<kind>s/ that no other writer can take; returns (path, public path)."""
    folder = public_dir / KIND_DIRS[kind]
    folder.mkdir(parents=True, exist_ok=True)
    ext = ext.lstrip(".")
    while True:
        name = f"{uuid.uuid4().hex[:12]}.{ext}"
        path = folder / name
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return path, f"/{KIND_DIRS[kind]}/{name}"


def save_bytes(public_dir: Path, kind: str, data: bytes, ext: str) -> str:
    path, public = new_output_path(public_dir, kind, ext)
    path.write_bytes(data)
    return public


def save_image(public_dir: Path, image) -> str:
    """Write a PIL image as a new PNG under public/images/; returns its public path."""
    path, public = new_output_path(public_dir, "image", "png")
    image.save(path, format="PNG")
    return public


def extension_for(mime: str, default: str) -> str:
    ext = mimetypes.guess_extension(mime or "") or ""
    return {".jpe": "jpg", ".jpeg": "jpg"}.get(ext, ext.lstrip(".") or default)
