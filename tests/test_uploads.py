"""Edge cases of hugginggpt/uploads.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

import io
import os
import sys
import threading
import wave
from types import SimpleNamespace

import pytest
import soundfile
from PIL import Image

from hugginggpt.errors import BadRequest, StorageFull
from hugginggpt.uploads import UploadStore

MiB = 1024 * 1024
UNSUPPORTED = ("; upload an image (png, jpeg, gif, webp) or audio (wav, flac, ogg, mp3)")


def image_bytes(fmt="PNG", size=(10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 128, 255)).save(buf, fmt)
    return buf.getvalue()


def wav_bytes(frames=8, rate=8000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x01\x00" * frames)
    return buf.getvalue()


def flac_bytes() -> bytes:
    buf = io.BytesIO()
    soundfile.write(buf, [0.0, 0.5, -0.5, 0.25], 8000, format="FLAC")
    return buf.getvalue()


@pytest.fixture
def public(tmp_path):
    return tmp_path / "public"


def stored(public, shown):
    return (public / shown.lstrip("/")).read_bytes()


@pytest.mark.parametrize("fmt, ext", [("PNG", "png"), ("JPEG", "jpg"), ("GIF", "gif"), ("WEBP", "webp"), ("BMP", "bmp")])
def test_an_image_is_kept_under_uploads_with_its_own_extension(public, fmt, ext):
    data = image_bytes(fmt)
    shown, kind = UploadStore(public, MiB, 1000).store(data, "whatever.bin")
    assert kind == "image"
    assert shown.startswith("/uploads/") and shown.endswith(f".{ext}")
    assert stored(public, shown) == data


@pytest.mark.parametrize("make, ext", [(wav_bytes, "wav"), (flac_bytes, "flac")])
def test_audio_is_kept_under_uploads_with_its_own_extension(public, make, ext):
    data = make()
    shown, kind = UploadStore(public, MiB, 1000).store(data, "clip")
    assert kind == "audio" and shown.startswith("/uploads/") and shown.endswith(f".{ext}")
    assert stored(public, shown) == data


def test_a_one_sample_one_hertz_wav_is_still_audio(public):
    assert UploadStore(public, MiB, 1000).store(wav_bytes(frames=1, rate=1), "a.wav")[1] == "audio"


def test_an_empty_file_is_refused(public):
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(b"", "a.png")
    assert str(err.value) == "the uploaded file is empty"


@pytest.mark.parametrize("data, name, mime", [
    (b"hello", "notes.txt", "text/plain"), (b"hello", "noext", "application/octet-stream"),
    (b"\x00\x00\x00\x18ftypmp42", "clip.mp4", "video/mp4"),
])
def test_an_unsupported_type_is_refused_and_nothing_is_kept(public, data, name, mime):
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(data, name)
    assert str(err.value) == f"unsupported file type {mime}" + UNSUPPORTED
    assert not (public / "uploads").exists() or not any((public / "uploads").iterdir())


def test_the_file_name_alone_can_name_a_supported_type(public):
    # no magic bytes for WAV here, only the name: decoding then decides
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(b"not audio at all", "a.mp3")
    assert str(err.value) == "the uploaded file is not readable audio (wav, flac, ogg, mp3)"


def test_an_image_over_the_pixel_limit_is_refused(public):
    store = UploadStore(public, MiB, 99)
    with pytest.raises(BadRequest) as err:
        store.store(image_bytes(), "a.png")
    assert str(err.value) == "the uploaded image is 10x10 pixels; at most 99 pixels are accepted"
    assert UploadStore(public, MiB, 100).store(image_bytes(), "a.png")[1] == "image"


def test_a_broken_image_is_refused(public):
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(b"\x89PNG\r\n\x1a\nbroken", "a.png")
    assert str(err.value) == "the uploaded image is not a readable image"


def test_broken_audio_is_refused(public):
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(b"RIFF\x00\x00\x00\x00WAVEjunk", "a.wav")
    assert str(err.value) == "the uploaded file is not readable audio (wav, flac, ogg, mp3)"


def test_audio_without_samples_is_refused(public):
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(wav_bytes(frames=0), "a.wav")
    assert str(err.value) == "the uploaded audio holds no samples"


def test_audio_whose_header_says_zero_hertz_is_refused(public, monkeypatch):
    monkeypatch.setattr(soundfile, "info", lambda f: SimpleNamespace(frames=8, samplerate=0))
    with pytest.raises(BadRequest) as err:
        UploadStore(public, MiB, 1000).store(wav_bytes(), "a.wav")
    assert str(err.value) == "the uploaded audio holds no samples"


def test_used_bytes_counts_the_regular_files_in_uploads_only(public, tmp_path):
    store = UploadStore(public, MiB, 1000)
    assert store.used_bytes() == 0
    (public / "uploads" / "sub").mkdir(parents=True)
    assert store.used_bytes() == 0
    (public / "uploads" / "a.png").write_bytes(b"x" * 10)
    (public / "uploads" / "b.wav").write_bytes(b"y" * 5)
    (public / "uploads" / "sub" / "deep.bin").write_bytes(b"z" * 100)
    (tmp_path / "big.bin").write_bytes(b"w" * 1000)
    (public / "uploads" / "link.bin").symlink_to(tmp_path / "big.bin")
    (public / "other.bin").write_bytes(b"v" * 50)
    assert store.used_bytes() == 15


def test_the_quota_admits_a_file_that_fills_it_exactly_and_refuses_one_byte_more(public):
    data = image_bytes()
    store = UploadStore(public, 3 * len(data), 1000)
    store.store(data, "a.png")
    store.store(data, "a.png")
    assert store.used_bytes() == 2 * len(data)
    store.store(data, "a.png")
    assert store.used_bytes() == 3 * len(data)
    with pytest.raises(StorageFull):
        store.store(data, "a.png")
    assert len(os.listdir(public / "uploads")) == 3
    other = UploadStore(public, 4 * len(data) - 1, 1000)
    with pytest.raises(StorageFull):
        other.store(data, "a.png")


def test_the_quota_message_names_the_limit_in_mib(public):
    (public / "uploads").mkdir(parents=True)
    (public / "uploads" / "old.bin").write_bytes(b"o" * (2 * MiB))
    with pytest.raises(StorageFull) as err:
        UploadStore(public, 2 * MiB + 10, 1000).store(image_bytes(), "a.png")
    assert str(err.value) == ("the upload quota (2 MiB for public/uploads) is used up; "
                              "remove old uploads or raise upload_quota_mb")
    assert sorted(os.listdir(public / "uploads")) == ["old.bin"]


def test_without_fcntl_as_on_windows_an_upload_waits_for_the_one_in_progress(public, monkeypatch):
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` fails: only the store's thread lock holds
    store = UploadStore(public, MiB, 1000)
    results = []
    second = threading.Thread(target=lambda: results.append(store.store(image_bytes(), "a.png")), daemon=True)
    with store._exclusive():  # an upload in progress: checking the quota, writing
        second.start()
        second.join(0.05)
        assert second.is_alive() and results == []
    second.join(5)
    assert [kind for _, kind in results] == ["image"]
