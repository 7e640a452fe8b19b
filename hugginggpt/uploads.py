"""Files a client uploads: decoded before they are kept, under a size quota for public/uploads/."""

from __future__ import annotations

import io
import threading
from pathlib import Path

from .errors import BadRequest, StorageFull
from .folderlock import locked_folder
from .resources import KIND_DIRS, UPLOAD_TYPES, decode_image, save_bytes, sniff_mime


class UploadStore:
    def __init__(self, public_dir: Path, quota_bytes: int, max_pixels: int):
        self.folder = public_dir / KIND_DIRS["upload"]
        self.public_dir = public_dir
        self.quota_bytes = quota_bytes
        self.max_pixels = max_pixels
        self._lock = threading.Lock()  # two uploads at once must not both fit the last free space

    def _exclusive(self):
        """One upload at a time checks the quota and writes: in this process and across the worker processes
        of the server."""
        return locked_folder(self.folder, self._lock)

    def used_bytes(self) -> int:
        if not self.folder.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file() and not p.is_symlink())

    def store(self, data: bytes, filename: str) -> tuple[str, str]:
        """Check, decode and keep one file; returns (public path, "image" | "audio")."""
        if not data:
            raise BadRequest("the uploaded file is empty")
        mime = sniff_mime(data, filename)
        if mime not in UPLOAD_TYPES:
            raise BadRequest(f"unsupported file type {mime}; upload an image (png, jpeg, gif, webp) "
                             "or audio (wav, flac, ogg, mp3)")
        kind = mime.split("/")[0]
        if kind == "image":
            decode_image(data, self.max_pixels, what="the uploaded image")
        else:
            _check_audio(data)
        with self._exclusive():
            if self.used_bytes() + len(data) > self.quota_bytes:
                raise StorageFull(f"the upload quota ({self.quota_bytes // (1024 * 1024)} MiB for public/uploads) "
                                  "is used up; remove old uploads or raise upload_quota_mb")
            path = save_bytes(self.public_dir, "upload", data, UPLOAD_TYPES[mime])
        return path, kind


def _check_audio(data: bytes) -> None:
    import soundfile as sf

    try:
        info = sf.info(io.BytesIO(data))
    except Exception:  # noqa: BLE001 - libsndfile raises its own types
        raise BadRequest("the uploaded file is not readable audio (wav, flac, ogg, mp3)") from None
    if info.frames <= 0 or info.samplerate <= 0:
        raise BadRequest("the uploaded audio holds no samples")
