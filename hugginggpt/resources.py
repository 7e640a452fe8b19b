"""Inputs and outputs on disk and on the web, handled as untrusted.

A request may name a file under `public/` (`/examples/a.jpg`, `examples/a.jpg`, `public/examples/a.jpg`),
an http(s) URL, or a data URI. Paths never escape `public/`; URLs are fetched with size and time limits;
generated files get collision-free names under `public/images|audios|videos/`.
"""

from __future__ import annotations

import base64
import binascii
import io
import mimetypes
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .errors import ResourceError
from .urlpolicy import UrlPolicy, fetch

# A file some server generated, as it names it: /images|audios|videos/<plain name> (no folders, no dot first).
OUTPUT_PATH = re.compile(r"^/(images|audios|videos)/([A-Za-z0-9][A-Za-z0-9._-]{0,127})$")
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
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"


def sniff_mime(data: bytes, name: str = "") -> str:  # pragma: no mutate: any default name without an extension guesses nothing
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            if magic == b"RIFF" and data[8:12] == b"WEBP":
                return "image/webp"
            return mime
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


DEFAULT_MAX_PIXELS = 40_000_000


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, what: str = "the image"):
    """Bytes -> an RGB PIL image, refusing a decompression bomb before any pixel is decoded."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise ResourceError(f"{what} is {width}x{height} pixels; at most {max_pixels:,} pixels are accepted")
            return image.convert("RGB")
    except ResourceError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ResourceError(f"{what} is too large to decode (a decompression bomb?); "
                            f"at most {max_pixels:,} pixels are accepted") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise ResourceError(f"{what} is not a readable image") from None


def public_file(value: str, public_dir: Path) -> Path:
    """The file under public/ that a request path names; refuses anything outside it."""
    raw = unquote(value.strip()).replace("\\", "/")
    if "\x00" in raw:
        raise ResourceError(f"invalid path {value!r}")
    rel = raw.lstrip("/")
    if rel.startswith("public/"):
        rel = rel[len("public/") :]
    root = public_dir.resolve()
    shown = value if len(value) <= 200 else value[:200] + "..."
    try:
        target = (root / rel).resolve()
        if target != root and root not in target.parents:
            raise ResourceError(f"path {shown!r} points outside public/; use a path like /examples/a.jpg")
        if not target.is_file():
            raise ResourceError(f"file not found: {shown!r} (paths are relative to public/, e.g. /examples/a.jpg)")
    except (OSError, RuntimeError):  # a name too long, a loop of links (RuntimeError before Python 3.13): said without
        # the server's own paths
        raise ResourceError(f"not a usable path: {shown!r} (paths are relative to public/, e.g. /examples/a.jpg)") \
            from None
    return target


def public_path_of(path: Path, public_dir: Path) -> str:
    return "/" + path.resolve().relative_to(public_dir.resolve()).as_posix()


def fetch_url(url: str, max_bytes: int, timeout: float, proxy: str | None = None,
              policy: UrlPolicy | None = None) -> Resource:
    """A user-named URL, fetched under the outbound URL policy (strict when none is given)."""
    got = fetch(url, policy or UrlPolicy(), max_bytes, timeout, proxy)
    mime = got.content_type
    if not mime or mime == "application/octet-stream":
        mime = sniff_mime(got.data, urlsplit(got.url).path)
    return Resource(data=got.data, mime=mime, source=url)


def decode_data_uri(value: str, max_bytes: int) -> Resource:
    m = re.match(r"^data:([\w/+.-]*)(;[^,]*)?,(.*)$", value, re.DOTALL)
    if not m:
        raise ResourceError("malformed data URI")
    if 3 * len(m.group(3)) > 4 * max_bytes + 12:  # longer than max_bytes * 4 // 3 + 4 characters (base64, padding)
        raise ResourceError(f"data URI is larger than the {max_bytes // (1024 * 1024)} MiB limit")
    try:
        if m.group(2) and "base64" in m.group(2):
            data = base64.b64decode(m.group(3))  # not validated: line breaks and other stray characters are skipped
        else:
            data = unquote(m.group(3)).encode()
    except (binascii.Error, ValueError):
        raise ResourceError("data URI is not valid base64") from None
    mime = m.group(1) or sniff_mime(data)
    return Resource(data=data, mime=mime, source="data:" + mime)


def resolve(value: str, public_dir: Path, max_bytes: int, timeout: float, proxy: str | None = None,
            policy: UrlPolicy | None = None) -> Resource:
    """Any accepted way of naming an input -> its bytes."""
    if not isinstance(value, str) or not value.strip():
        raise ResourceError("empty resource reference")
    value = value.strip()
    if value.startswith("data:"):
        return decode_data_uri(value, max_bytes)
    try:
        scheme = urlsplit(value).scheme.lower()
    except ValueError as exc:  # e.g. "http://[::1/a.png": an unclosed IPv6 bracket
        raise ResourceError(f"not a valid URL ({exc}): {value[:100]!r}") from None
    if scheme in ("http", "https"):
        return fetch_url(value, max_bytes, timeout, proxy, policy)
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
        name = f"{uuid.uuid4().hex}.{ext}"  # 128 random bits: a file URL is a capability
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
    image.save(path)  # as PNG: the name ends in .png
    return public


def extension_for(mime: str, default: str) -> str:
    ext = (mimetypes.guess_extension(mime) if mime else None) or ""
    return {".jpe": "jpg", ".jpeg": "jpg"}.get(ext, ext.lstrip(".") or default)
