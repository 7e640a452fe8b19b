"""Edge cases of hugginggpt/resources.py, each pinned where a user would notice it broken (mutation audit: docs/TESTING.md)."""

import base64
import io
import os
import uuid

import pytest
from PIL import Image

from hugginggpt import resources
from hugginggpt.errors import ResourceError
from hugginggpt.resources import (
    OUTPUT_PATH,
    Resource,
    decode_data_uri,
    decode_image,
    extension_for,
    fetch_url,
    new_output_path,
    public_file,
    resolve,
    save_bytes,
    save_image,
    sniff_mime,
)
from hugginggpt.urlpolicy import Fetched, UrlPolicy

MiB = 1024 * 1024
HINT = "(paths are relative to public/, e.g. /examples/a.jpg)"


def png_bytes(size=(10, 10), mode="RGB", **save_args) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, "PNG", **save_args)
    return buf.getvalue()


@pytest.fixture
def public(tmp_path):
    root = tmp_path / "public"
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "a.jpg").write_bytes(b"\xff\xd8\xff" + b"jpeg")
    return root


class FakeFetch:
    def __init__(self, monkeypatch, content_type="", url=None, data=b"payload"):
        self.calls = []
        self.content_type, self.url, self.data = content_type, url, data
        monkeypatch.setattr(resources, "fetch", self)

    def __call__(self, url, policy, max_bytes, timeout, proxy=None):
        self.calls.append((url, policy, max_bytes, timeout, proxy))
        return Fetched(data=self.data, content_type=self.content_type, url=self.url or url)


# Resource / sniff_mime


def test_data_uri_is_the_mime_and_base64_of_the_bytes():
    assert Resource(b"\x00\xffab", "image/png", "x").data_uri() == "data:image/png;base64,AP9hYg=="


@pytest.mark.parametrize("head, mime", [
    (b"\x89PNG\r\n", "image/png"), (b"\xff\xd8\xff\xe0", "image/jpeg"), (b"GIF89a", "image/gif"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "audio/wav"), (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"ID3\x04", "audio/mpeg"), (b"fLaC\x00", "audio/flac"), (b"OggS\x00", "audio/ogg"), (b"BM\x00\x00", "image/bmp"),
])
def test_sniff_mime_reads_the_magic_bytes_whatever_the_name(head, mime):
    assert sniff_mime(head + b"rest", "file.txt") == mime


def test_sniff_mime_falls_back_to_the_name_then_to_octet_stream():
    assert sniff_mime(b"hello", "clip.mp4") == "video/mp4"
    assert sniff_mime(b"hello", "noext") == "application/octet-stream"
    assert sniff_mime(b"hello") == "application/octet-stream"


# decode_image


def test_decode_image_returns_an_rgb_image():
    image = decode_image(png_bytes(mode="L"))
    assert image.mode == "RGB" and image.size == (10, 10)


def test_decode_image_accepts_exactly_max_pixels_and_refuses_one_more():
    assert decode_image(png_bytes(), max_pixels=100).size == (10, 10)
    with pytest.raises(ResourceError) as err:
        decode_image(png_bytes(), max_pixels=99, what="the photo")
    assert str(err.value) == "the photo is 10x10 pixels; at most 99 pixels are accepted"
    with pytest.raises(ResourceError) as err:
        decode_image(png_bytes((100, 20)), max_pixels=1999)
    assert str(err.value) == "the image is 100x20 pixels; at most 1,999 pixels are accepted"


def test_decode_image_turns_pillows_bomb_warning_into_a_refusal(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 60)  # 100 pixels: a warning from Pillow, not yet its error
    with pytest.raises(ResourceError) as err:
        decode_image(png_bytes(), max_pixels=5000)
    assert str(err.value) == ("the image is too large to decode (a decompression bomb?); "
                              "at most 5,000 pixels are accepted")


def test_decode_image_turns_pillows_bomb_error_into_a_refusal(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)  # 100 pixels > twice the limit: Pillow's own error
    with pytest.raises(ResourceError) as err:
        decode_image(png_bytes(), max_pixels=5000, what="the upload")
    assert str(err.value) == ("the upload is too large to decode (a decompression bomb?); "
                              "at most 5,000 pixels are accepted")


def test_decode_image_is_not_stopped_by_other_pillow_warnings():
    palette = Image.new("P", (2, 2))
    palette.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    buf = io.BytesIO()
    palette.save(buf, "PNG", transparency=bytes([0, 128]))  # Pillow warns when converting this to RGB
    with pytest.warns(UserWarning, match="Transparency expressed in bytes"):
        image = decode_image(buf.getvalue())
    assert image.mode == "RGB" and image.size == (2, 2)


@pytest.mark.parametrize("data", [b"not an image", b"\x89PNG\r\n\x1a\ngarbage", b""])
def test_decode_image_refuses_unreadable_bytes(data):
    with pytest.raises(ResourceError) as err:
        decode_image(data)
    assert str(err.value) == "the image is not a readable image"
    with pytest.raises(ResourceError) as err:
        decode_image(data, what="the mask")
    assert str(err.value) == "the mask is not a readable image"


# public_file / public_path_of


@pytest.mark.parametrize("value", [
    "/examples/a.jpg", "examples/a.jpg", "public/examples/a.jpg", "/public/examples/a.jpg", "  /examples/a.jpg \n",
    "examples\\a.jpg", "\\examples\\a.jpg", "/examples/%61.jpg", "examples/./a.jpg", "examples/../examples/a.jpg",
])
def test_public_file_accepts_the_documented_ways_of_naming_a_file(public, value):
    assert public_file(value, public) == (public / "examples" / "a.jpg").resolve()


def test_public_file_keeps_every_character_of_a_name_after_the_leading_slashes(public):
    (public / "Xmas.png").write_bytes(b"x")
    assert public_file("//Xmas.png", public).name == "Xmas.png"


def test_public_file_decodes_percent_escapes(public):
    (public / "examples" / "a b.jpg").write_bytes(b"x")
    assert public_file("examples/a%20b.jpg", public).name == "a b.jpg"


def test_public_file_refuses_a_nul_byte(public):
    with pytest.raises(ResourceError) as err:
        public_file("examples/a.jpg%00.png", public)
    assert str(err.value) == "invalid path 'examples/a.jpg%00.png'"


@pytest.mark.parametrize("value", ["../secret.txt", "/../secret.txt", "public/../secret.txt", "examples/../../secret.txt",
                                   "%2e%2e/secret.txt", "..\\secret.txt"])
def test_public_file_refuses_paths_outside_public(public, value):
    (public.parent / "secret.txt").write_text("secret")
    with pytest.raises(ResourceError) as err:
        public_file(value, public)
    assert str(err.value) == f"path {value!r} points outside public/; use a path like /examples/a.jpg"


def test_public_file_refuses_a_link_out_of_public(public):
    (public.parent / "secret.txt").write_text("secret")
    (public / "examples" / "link.jpg").symlink_to(public.parent / "secret.txt")
    with pytest.raises(ResourceError, match="points outside public/"):
        public_file("/examples/link.jpg", public)


@pytest.mark.parametrize("value", ["/", "", "public/", "/examples", "/examples/missing.jpg"])
def test_public_file_reports_a_missing_file_or_a_folder(public, value):
    with pytest.raises(ResourceError) as err:
        public_file(value, public)
    assert str(err.value) == f"file not found: {value!r} {HINT}"


def test_public_file_shows_at_most_200_characters_of_the_path(public):
    exact = "/" + "x" * 199
    with pytest.raises(ResourceError) as err:
        public_file(exact, public)
    assert str(err.value) == f"file not found: {exact!r} {HINT}"
    longer = "/" + "y" * 200
    with pytest.raises(ResourceError) as err:
        public_file(longer, public)
    assert str(err.value) == f"file not found: {longer[:200] + '...'!r} {HINT}"


def test_public_file_reports_a_name_too_long_for_the_file_system_without_server_paths(public):
    value = "/" + "n" * 300
    with pytest.raises(ResourceError) as err:
        public_file(value, public)
    assert str(err.value) == f"not a usable path: {value[:200] + '...'!r} {HINT}"


def test_public_file_reports_a_loop_of_links_as_a_bad_request(public):
    (public / "a").symlink_to(public / "b")
    (public / "b").symlink_to(public / "a")
    with pytest.raises(ResourceError) as err:
        public_file("/a", public)
    assert str(err.value) == f"not a usable path: '/a' {HINT}"


# fetch_url


def test_fetch_url_passes_its_limits_and_a_strict_default_policy(monkeypatch):
    fake = FakeFetch(monkeypatch, content_type="image/jpeg")
    got = fetch_url("https://h.example/a", 123, 4.5)
    assert got == Resource(data=b"payload", mime="image/jpeg", source="https://h.example/a")
    [(url, policy, max_bytes, timeout, proxy)] = fake.calls
    assert (url, max_bytes, timeout, proxy) == ("https://h.example/a", 123, 4.5, None)
    assert isinstance(policy, UrlPolicy) and policy == UrlPolicy()


def test_fetch_url_uses_the_given_policy_and_proxy(monkeypatch):
    fake = FakeFetch(monkeypatch, content_type="image/png")
    policy = UrlPolicy(allow_hosts=frozenset({"h.example"}))
    fetch_url("http://h.example/a", 9, 1.0, "http://proxy:3128", policy)
    assert fake.calls == [("http://h.example/a", policy, 9, 1.0, "http://proxy:3128")]


@pytest.mark.parametrize("content_type", ["", "application/octet-stream"])
def test_fetch_url_sniffs_a_missing_or_generic_type_from_the_bytes(monkeypatch, content_type):
    FakeFetch(monkeypatch, content_type=content_type, data=b"GIF89a...")
    assert fetch_url("https://h.example/x.png", 100, 1.0).mime == "image/gif"


@pytest.mark.parametrize("content_type", ["", "application/octet-stream"])
def test_fetch_url_guesses_from_the_final_urls_path_without_its_query(monkeypatch, content_type):
    FakeFetch(monkeypatch, content_type=content_type, url="https://cdn.example/clip.mp3?v=2.png")
    got = fetch_url("https://h.example/go", 100, 1.0)
    assert got.mime == "audio/mpeg" and got.source == "https://h.example/go"


# decode_data_uri


def test_decode_data_uri_base64():
    png = png_bytes()
    got = decode_data_uri("data:image/png;base64," + base64.b64encode(png).decode(), 10_000)
    assert got == Resource(data=png, mime="image/png", source="data:image/png")


def test_decode_data_uri_base64_tolerates_line_breaks_and_sniffs_a_missing_type():
    encoded = base64.b64encode(b"GIF89a-some-gif-bytes").decode()
    got = decode_data_uri(f"data:;charset=x;base64,{encoded[:8]}\n{encoded[8:]}", 10_000)
    assert got == Resource(data=b"GIF89a-some-gif-bytes", mime="image/gif", source="data:image/gif")


def test_decode_data_uri_percent_encoded_text():
    assert decode_data_uri("data:,a%20b%E4%B8%AD\n", 100) == Resource(
        data="a b中\n".encode(), mime="application/octet-stream", source="data:application/octet-stream")
    assert decode_data_uri("data:text/plain;charset=utf-8,hi", 100) == Resource(
        data=b"hi", mime="text/plain", source="data:text/plain")


@pytest.mark.parametrize("value", ["data:image/png;base64", "data:image png,xx", "dat:,x", " data:,x"])
def test_decode_data_uri_refuses_a_malformed_uri(value):
    with pytest.raises(ResourceError) as err:
        decode_data_uri(value, 100)
    assert str(err.value) == "malformed data URI"


def test_decode_data_uri_refuses_invalid_base64():
    with pytest.raises(ResourceError) as err:
        decode_data_uri("data:image/png;base64,abcde", 100)
    assert str(err.value) == "data URI is not valid base64"


# max_bytes -> the longest payload accepted: its base64 length (4 characters per 3 bytes) and 4 spare characters
@pytest.mark.parametrize("max_bytes, longest", [(0, 4), (1, 5), (2, 6), (3, 8), (4, 9), (5, 10), (6, 12), (7, 13),
                                                (8, 14), (9, 16), (300, 404)])
def test_decode_data_uri_size_limit_allows_base64_of_max_bytes_and_padding(max_bytes, longest):
    assert decode_data_uri("data:," + "a" * longest, max_bytes).data == b"a" * longest
    with pytest.raises(ResourceError) as err:
        decode_data_uri("data:," + "a" * (longest + 1), max_bytes)
    assert str(err.value) == "data URI is larger than the 0 MiB limit"


def test_decode_data_uri_size_limit_names_the_limit_in_mib():
    with pytest.raises(ResourceError) as err:
        decode_data_uri("data:;base64," + "A" * (2 * MiB * 4 // 3 + 8), 2 * MiB)
    assert str(err.value) == "data URI is larger than the 2 MiB limit"


# resolve


@pytest.mark.parametrize("value", [None, 5, b"/examples/a.jpg", "", "  \n"])
def test_resolve_refuses_an_empty_or_non_text_reference(public, value):
    with pytest.raises(ResourceError) as err:
        resolve(value, public, 100, 1.0)
    assert str(err.value) == "empty resource reference"


def test_resolve_a_public_file(public):
    got = resolve("  public/examples/a.jpg ", public, 100, 1.0)
    assert got == Resource(data=b"\xff\xd8\xffjpeg", mime="image/jpeg", source="public/examples/a.jpg",
                           public_path="/examples/a.jpg")


def test_resolve_guesses_a_public_files_type_from_its_name(public):
    (public / "clip.mp4").write_bytes(b"....ftyp")
    got = resolve("/clip.mp4", public, 100, 1.0)
    assert (got.mime, got.public_path) == ("video/mp4", "/clip.mp4")


def test_resolve_reports_the_public_path_through_a_linked_public_folder(tmp_path, public):
    link = tmp_path / "served"
    link.symlink_to(public)
    assert resolve("examples/a.jpg", link, 100, 1.0).public_path == "/examples/a.jpg"


def test_resolve_a_public_file_at_the_size_limit_and_over_it(public):
    (public / "big.bin").write_bytes(b"z" * (MiB + 1))
    assert len(resolve("/big.bin", public, MiB + 1, 1.0).data) == MiB + 1
    with pytest.raises(ResourceError) as err:
        resolve("/big.bin", public, MiB, 1.0)
    assert str(err.value) == "'/big.bin' is larger than the 1 MiB limit"


def test_resolve_a_data_uri_with_its_size_limit(public):
    assert resolve(" data:,abc ", public, 100, 1.0).data == b"abc"
    with pytest.raises(ResourceError, match="data URI is larger"):
        resolve("data:,123456789", public, 3, 1.0)


@pytest.mark.parametrize("url", ["http://h.example/a.png", "https://h.example/a.png", "HTTPS://h.example/a.png"])
def test_resolve_fetches_http_urls_with_its_limits(monkeypatch, public, url):
    fake = FakeFetch(monkeypatch, content_type="image/png")
    policy = UrlPolicy(allow_hosts=frozenset({"h.example"}))
    got = resolve(f" {url} ", public, 77, 2.5, "http://proxy:1", policy)
    assert got == Resource(data=b"payload", mime="image/png", source=url)
    assert fake.calls == [(url, policy, 77, 2.5, "http://proxy:1")]


def test_resolve_reports_an_invalid_url():
    with pytest.raises(ResourceError) as err:
        resolve("http://[::1/a.png", None, 100, 1.0)
    assert str(err.value) == "not a valid URL (Invalid IPv6 URL): 'http://[::1/a.png'"
    value = "http://[::1/" + "p" * 200
    with pytest.raises(ResourceError) as err:
        resolve(value, None, 100, 1.0)
    assert str(err.value) == f"not a valid URL (Invalid IPv6 URL): {value[:100]!r}"


@pytest.mark.parametrize("value, scheme", [("ftp://h.example/a.png", "ftp"), ("FILE:///etc/passwd", "file"),
                                           ("ab:c.png", "ab")])
def test_resolve_refuses_other_schemes(public, value, scheme):
    with pytest.raises(ResourceError) as err:
        resolve(value, public, 100, 1.0)
    assert str(err.value) == (f"unsupported URL scheme {scheme!r} in {value!r}; "
                              "use http(s), data: or a public/ path")


def test_resolve_treats_a_one_letter_scheme_as_a_file_name(public):
    (public / "c:a.png").write_bytes(b"\x89PNG....")
    assert resolve("c:a.png", public, 100, 1.0).mime == "image/png"


# new_output_path / save_bytes / save_image / extension_for


def test_new_output_path_creates_an_empty_file_with_a_random_name(tmp_path):
    public = tmp_path / "new" / "public"
    old = os.umask(0o022)
    try:
        path, shown = new_output_path(public, "audio", ".wav")
    finally:
        os.umask(old)
    assert path.parent == public / "audios" and path.read_bytes() == b""
    assert (path.stat().st_mode & 0o777) == 0o644
    assert shown == f"/audios/{path.name}" and OUTPUT_PATH.match(shown)
    stem, ext = path.name.split(".")
    assert ext == "wav" and len(stem) == 32 and int(stem, 16) >= 0
    again, shown_again = new_output_path(public, "audio", "wav")
    assert again != path and shown_again != shown


def test_new_output_path_never_reuses_an_existing_name(tmp_path, monkeypatch):
    taken = uuid.UUID(int=1)
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / f"{taken.hex}.mp4").write_bytes(b"kept")
    ids = iter([taken, taken, uuid.UUID(int=2)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    path, shown = new_output_path(tmp_path, "video", "mp4")
    assert shown == f"/videos/{uuid.UUID(int=2).hex}.mp4"
    assert (tmp_path / "videos" / f"{taken.hex}.mp4").read_bytes() == b"kept"


def test_new_output_path_keeps_the_extension_as_given_less_its_dot(tmp_path):
    assert new_output_path(tmp_path, "image", ".XPM")[1].endswith(".XPM")
    assert new_output_path(tmp_path, "image", "Xbm")[1].endswith(".Xbm")


def test_save_bytes_writes_the_data_under_its_kind(tmp_path):
    shown = save_bytes(tmp_path, "upload", b"\x00data", "bin")
    assert shown.startswith("/uploads/") and shown.endswith(".bin")
    assert (tmp_path / shown.lstrip("/")).read_bytes() == b"\x00data"


def test_save_image_writes_a_png(tmp_path):
    shown = save_image(tmp_path, Image.new("RGB", (3, 2), (255, 0, 0)))
    assert shown.startswith("/images/") and shown.endswith(".png")
    data = (tmp_path / shown.lstrip("/")).read_bytes()
    assert data.startswith(b"\x89PNG")
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (3, 2) and image.convert("RGB").getpixel((0, 0)) == (255, 0, 0)


@pytest.mark.parametrize("mime, ext", [("image/png", "png"), ("audio/mpeg", "mp3"), ("video/mp4", "mp4"),
                                       ("", "dflt"), (None, "dflt"), ("application/x-no-such-type", "dflt")])
def test_extension_for(mime, ext):
    assert extension_for(mime, "dflt") == ext


@pytest.mark.parametrize("guessed, ext", [(".jpe", "jpg"), (".jpeg", "jpg"), (".jpg", "jpg"), (".XLS", "XLS"),
                                          (".X.Y", "X.Y"), (None, "dflt")])
def test_extension_for_follows_the_systems_table_but_names_jpeg_jpg(monkeypatch, guessed, ext):
    monkeypatch.setattr(resources.mimetypes, "guess_extension", lambda mime: guessed)
    assert extension_for("some/type", "dflt") == ext
