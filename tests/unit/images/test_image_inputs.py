"""Image inputs as a client sees them: what is accepted, and the error each refusal gives."""

from __future__ import annotations

import base64
import pickle
import struct
import threading
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from PIL import Image, ImageFile

from serve_app.error_handlers import install_error_handlers
from serve_app.errors import ApiError
from serve_app.images import inputs, rules
from serve_app.images.inputs import (
    MediaSourceReader,
    check_anon_user_id,
    image_fetcher,
    inspect_image,
    read_image_body,
)
from serve_app.images.rules import MAX_IMAGE_BYTES, ImageInputError, decode_image

# ------------------------------------------------------------------------------------------
# Test images, built in memory


def encode(image: Image.Image, fmt: str, **params: Any) -> bytes:
    out = BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def noise(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """Incompressible pixels, so that truncating the file loses pixel data."""
    channels = len(mode)
    return Image.frombytes(mode, size, bytes((i * 7919 + i // 3) % 251
                                            for i in range(size[0] * size[1] * channels)))


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


def png_declaring(width: int, height: int, raw_rows: bytes) -> bytes:
    """A PNG (8-bit RGB) whose IHDR declares `width`x`height` over the given raw data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr)
            + png_chunk(b"IDAT", zlib.compress(raw_rows, 9)) + png_chunk(b"IEND", b""))


PNG = encode(noise((64, 64)), "PNG")


def api_error(excinfo: pytest.ExceptionInfo[ApiError]) -> tuple[int, dict[str, Any]]:
    return excinfo.value.status, excinfo.value.body()


def field_errors(body: dict[str, Any], field: str) -> list[str]:
    return body["details"][field]["_errors"]


IMAGE_CODES = {"INVALID_REQUEST", "IMAGE_TOO_SMALL", "IMAGE_TOO_LARGE", "CORRUPTED_IMAGE"}


def test_refusals_carry_the_published_image_codes() -> None:
    small = encode(Image.new("RGB", (200, 200)), "PNG")
    with pytest.raises(ApiError) as too_small:
        inspect_image(small, "image", min_pixels=65536)
    assert too_small.value.code == "IMAGE_TOO_SMALL"
    with pytest.raises(ApiError) as too_large:
        inspect_image(small, "image", max_pixels=1000)
    assert too_large.value.code == "IMAGE_TOO_LARGE" and too_large.value.status == 400
    with pytest.raises(ApiError) as garbage:
        inspect_image(b"definitely not an image", "image")
    assert garbage.value.code == "CORRUPTED_IMAGE"
    with pytest.raises(ImageInputError) as truncated:
        decode_image(small[: len(small) // 2], "image")
    assert truncated.value.code == "CORRUPTED_IMAGE"


def assert_refused(data: bytes, message: str, field: str = "image", **bounds: int) -> None:
    """inspect_image answers 400 with `message` under `field`; decode_image refuses alike."""
    with pytest.raises(ApiError) as excinfo:
        inspect_image(data, field, **bounds)
    status, body = api_error(excinfo)
    assert status == 400
    assert body["error"] == message
    assert body["code"] in IMAGE_CODES
    assert field_errors(body, field) == [message]
    if "min_pixels" not in bounds:
        with pytest.raises(ImageInputError) as decode_err:
            decode_image(data, field, max_pixels=bounds.get("max_pixels"))
        assert str(decode_err.value) == message
        assert decode_err.value.field == field


# ------------------------------------------------------------------------------------------
# Formats, sizes, frames and modes


@pytest.mark.parametrize(("fmt", "mode", "params"), [
    ("PNG", "RGB", {}), ("PNG", "RGBA", {}), ("JPEG", "RGB", {"quality": 90}),
    ("JPEG", "L", {}), ("WEBP", "RGB", {}), ("WEBP", "RGBA", {"lossless": True}),
])
def test_accepted_formats_are_inspected_then_decoded(fmt: str, mode: str, params: dict) -> None:
    data = encode(noise((40, 30), mode), fmt, **params)
    checked = inspect_image(data, "image", min_pixels=1000, max_pixels=1200)
    assert (checked.width, checked.height, checked.pixels) == (40, 30, 1200)
    assert checked.format == fmt and checked.field == "image" and checked.data is data
    image = decode_image(data, "image")
    assert image.size == (40, 30)
    assert image.mode == ("RGBA" if "A" in mode else "RGB")


def test_a_jpeg_with_extra_pictures_is_a_jpeg() -> None:
    frames = [Image.new("RGB", (32, 32), "red"), Image.new("RGB", (32, 32), "blue")]
    data = encode(frames[0], "MPO", save_all=True, append_images=frames[1:])
    assert Image.open(BytesIO(data)).format == "MPO"
    assert inspect_image(data, "image").format == "JPEG"
    assert decode_image(data, "image").getpixel((5, 5))[0] > 200  # the first picture


@pytest.mark.parametrize(("mode", "expected"), [
    ("1", "RGB"), ("L", "RGB"), ("LA", "RGBA"), ("P", "RGB"), ("RGBA", "RGBA"),
])
def test_modes_decode_to_rgb_or_rgba_keeping_alpha(mode: str, expected: str) -> None:
    data = encode(Image.new(mode, (16, 16)), "PNG")
    assert decode_image(data, "image").mode == expected


def test_palette_with_transparency_decodes_to_rgba() -> None:
    image = Image.new("P", (16, 16), 0)
    image.putpalette([255, 0, 0, 0, 255, 0])
    image.putpixel((1, 1), 1)
    data = encode(image, "PNG", transparency=0)
    decoded = decode_image(data, "image")
    assert decoded.mode == "RGBA"
    assert decoded.getpixel((0, 0))[3] == 0 and decoded.getpixel((1, 1)) == (0, 255, 0, 255)


def test_exif_orientation_is_applied_and_reported() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: displayed rotated by 90 degrees
    data = encode(Image.new("RGB", (40, 20)), "JPEG", exif=exif.tobytes())
    checked = inspect_image(data, "image")
    assert (checked.width, checked.height) == (20, 40)
    assert decode_image(data, "image").size == (20, 40)


def test_too_few_and_too_many_pixels_name_the_numbers() -> None:
    data = encode(Image.new("RGB", (200, 200)), "PNG")
    assert_refused(data, "image is 200x200 = 40000 pixels; at least 65536 are required",
                   min_pixels=65536)
    assert_refused(data, "image is 200x200 = 40000 pixels; at most 10000 are allowed",
                   field="mask", max_pixels=10000)
    assert inspect_image(data, "image", min_pixels=40000, max_pixels=40000).pixels == 40000


@pytest.fixture
def no_decoding(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails the test if any image is decoded (Pillow decodes in ImageFile.load)."""
    decoded: list[tuple[int, int]] = []

    def refuse(self: ImageFile.ImageFile) -> None:
        decoded.append(self.size)
        raise AssertionError(f"{self.size} pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    yield
    assert decoded == []


def test_decompression_bomb_is_refused_from_its_header(no_decoding: None) -> None:
    bomb = png_declaring(60000, 60000, bytes(10_000_000))  # 3.6 gigapixels in ~10 kB
    assert len(bomb) < 50_000
    message = f"image has too many pixels; at most {rules.ABSOLUTE_MAX_PIXELS} are allowed"
    assert_refused(bomb, message)  # from its header: not a pixel decoded (`no_decoding`)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_image_over_the_absolute_bound_is_refused_with_its_numbers(no_decoding: None) -> None:
    # Above Pillow's warning threshold but below its error: our own check refuses it.
    data = png_declaring(9000, 9000, bytes(1000))
    assert_refused(data, "image is 9000x9000 = 81000000 pixels; at most "
                         f"{rules.ABSOLUTE_MAX_PIXELS} are allowed")
    # The caller's bound cannot lift the absolute one.
    assert_refused(data, "image is 9000x9000 = 81000000 pixels; at most "
                         f"{rules.ABSOLUTE_MAX_PIXELS} are allowed", max_pixels=10**9)


def test_zero_sized_image_is_refused() -> None:
    with pytest.raises(ApiError) as excinfo:
        inspect_image(png_declaring(0, 10, b""), "image")
    status, body = api_error(excinfo)
    assert status == 400  # Pillow may not even open it
    assert body["error"] in (rules.UNREADABLE, "image has no pixels (0x10)")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_truncated_image_passes_the_header_check_but_does_not_decode(fmt: str) -> None:
    data = encode(noise((128, 128)), fmt)
    truncated = data[: len(data) * 6 // 10]
    assert inspect_image(truncated, "image").pixels == 128 * 128
    with pytest.raises(ImageInputError) as excinfo:
        decode_image(truncated, "image")
    assert str(excinfo.value) == "image data is truncated or corrupt"
    assert isinstance(excinfo.value, ValueError) and excinfo.value.field == "image"


def test_png_whose_header_lies_about_its_size_does_not_decode() -> None:
    lying = png_declaring(2000, 2000, b"\x00" + bytes(16 * 3) * 16)
    assert inspect_image(lying, "image").pixels == 4_000_000
    with pytest.raises(ImageInputError, match="truncated or corrupt"):
        decode_image(lying, "image")


def animated_png() -> bytes:
    frames = [Image.new("RGB", (16, 16), color) for color in ("red", "green", "blue")]
    return encode(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=100)


def animated_webp() -> bytes:
    frames = [Image.new("RGB", (16, 16), color) for color in ("red", "green", "blue")]
    return encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100)


@pytest.mark.parametrize("make", [animated_png, animated_webp])
def test_animated_images_are_refused(make) -> None:
    assert_refused(make(), "animated images are not supported")


def test_gif_animated_or_not_is_not_an_accepted_format() -> None:
    frames = [Image.new("P", (16, 16), color) for color in (1, 2)]
    animated = encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    still = encode(frames[0], "GIF")
    for data in (animated, still):
        assert_refused(data, "image must be a PNG, JPEG or WebP file, not GIF")


def test_cmyk_and_16_bit_images_are_refused_with_their_messages() -> None:
    assert_refused(encode(Image.new("CMYK", (16, 16)), "JPEG"),
                   "CMYK images are not supported; convert to RGB")
    sixteen_bit = encode(Image.new("I;16", (16, 16)), "PNG")
    assert_refused(sixteen_bit, "16-bit images are not supported; use 8 bits per channel")


@pytest.mark.parametrize("data", [
    b"", b"hello, world", bytes(1000), PNG[:20], b"\x89PNG\r\n\x1a\n" + bytes(100),
    b"%PDF-1.7\n" + bytes(100),
])
def test_garbage_is_refused(data: bytes) -> None:
    assert_refused(data, "image could not be read: not a PNG, JPEG or WebP file")


# ------------------------------------------------------------------------------------------
# Size: 25 MB or more is refused with the payload-too-large body


def assert_payload_too_large(excinfo: pytest.ExceptionInfo[ApiError]) -> None:
    status, body = api_error(excinfo)
    assert status == 413
    assert set(body) == {"code", "error"} and body["code"] == "PAYLOAD_TOO_LARGE"
    assert "25 MB" in body["error"]


def test_25_mb_exactly_is_refused_and_just_under_is_accepted() -> None:
    exactly = PNG + bytes(MAX_IMAGE_BYTES - len(PNG))
    with pytest.raises(ApiError) as excinfo:
        inspect_image(exactly, "image")
    assert_payload_too_large(excinfo)
    with pytest.raises(ImageInputError) as decode_err:
        decode_image(exactly, "image")
    assert decode_err.value.status == 413
    assert inspect_image(exactly[:-1], "image").pixels == 64 * 64  # trailing bytes ignored


@pytest.fixture
def reader() -> MediaSourceReader:
    return MediaSourceReader(image_fetcher())


async def test_base64_size_is_checked_from_its_length_before_decoding(
        reader: MediaSourceReader, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("decoded")

    monkeypatch.setattr(inputs.base64, "b64decode", no_decoding)
    exactly = "A" * (MAX_IMAGE_BYTES // 3 * 4 + 2) + "=="  # decodes to exactly 25 MB
    for value in (exactly, "data:image/png;base64," + exactly):
        with pytest.raises(ApiError) as excinfo:
            await reader.read(value, "image", allow_urls=False)
        assert_payload_too_large(excinfo)
    monkeypatch.undo()
    just_under = "A" * ((MAX_IMAGE_BYTES - 1) // 3 * 4)  # 25 MB - 1 byte of zeros
    assert len(await reader.read(just_under, "image", allow_urls=False)) == MAX_IMAGE_BYTES - 1


# ------------------------------------------------------------------------------------------
# Reading JSON strings: base64, data URLs, URLs


async def test_raw_base64_and_data_urls_are_read(reader: MediaSourceReader) -> None:
    encoded = base64.b64encode(PNG).decode()
    assert await reader.read(encoded, "image", allow_urls=False) == PNG
    assert await reader.read(f"data:image/png;base64,{encoded}", "image",
                             allow_urls=False) == PNG
    assert await reader.read(f"DATA:image/webp;BASE64,{encoded}", "image",
                             allow_urls=False) == PNG
    wrapped = "\n".join(encoded[i:i + 76] for i in range(0, len(encoded), 76))
    assert await reader.read(wrapped + "\n", "image", allow_urls=True) == PNG
    assert await reader.read(encoded.rstrip("="), "image", allow_urls=True) == PNG


@pytest.mark.parametrize(("value", "allow_urls", "message"), [
    ("", True, "must be a non-empty base64 string or image URL"),
    ("   ", True, "must be a non-empty base64 string or image URL"),
    ("not base64!", False, "is not valid base64"),
    ("ab\u00e9cd", False, "is not valid base64"),
    ("data:text/plain;base64,aGVsbG8=", False,
     "data URL media type 'text/plain' is not an image type"),
    ("data:image/png,rawbytes", False,
     "data URLs must be base64-encoded (data:image/png;base64,...)"),
    ("data:image/png;base64", False, "is not a valid data URL (data:image/png;base64,...)"),
    ("data:image/png;base64,", False, "must be a non-empty base64 string"),
    ("https://example.com/cat.png", False,
     "image URLs are not accepted here; send the image as base64 or a data URL"),
    ("ftp://example.com/cat.png", True, "only http and https image URLs are supported"),
    ("http://example.com:99999/cat.png", True, "is not a valid URL"),
])
async def test_bad_strings_are_400_naming_the_field(
        reader: MediaSourceReader, value: str, allow_urls: bool, message: str) -> None:
    with pytest.raises(ApiError) as excinfo:
        await reader.read(value, "images", allow_urls=allow_urls)
    status, body = api_error(excinfo)
    assert status == 400 and body["error"] == message
    assert field_errors(body, "images") == [message]


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/cat.png":
            self._send(200, PNG)
        elif self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/big":
            self._send(200, bytes(MAX_IMAGE_BYTES))
        elif self.path == "/slow":  # answers only once the test is over
            self.server.release.wait()  # type: ignore[attr-defined]
            self._send(200, PNG)
        else:
            self._send(404, b"not found")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for start in range(0, len(body), 1 << 20):
                self.wfile.write(body[start:start + (1 << 20)])
        except OSError:  # the client stopped reading (the size cap)
            pass

    def log_message(self, *args: Any) -> None:
        pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _Handler)
    server.release = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.release.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


@pytest.fixture
def url_reader(image_server: str) -> MediaSourceReader:
    return MediaSourceReader(image_fetcher(allowed_hosts=frozenset({image_server})))


async def test_url_is_fetched_and_redirects_followed(url_reader: MediaSourceReader,
                                                     image_server: str) -> None:
    assert await url_reader.read(f"http://{image_server}/cat.png", "image",
                                 allow_urls=True) == PNG
    assert await url_reader.read(f"http://{image_server}/moved", "image",
                                 allow_urls=True) == PNG


async def test_private_address_is_refused_without_leaking_why(image_server: str) -> None:
    reader = MediaSourceReader(image_fetcher())
    with pytest.raises(ApiError) as excinfo:
        await reader.read(f"http://{image_server}/cat.png", "image", allow_urls=True)
    status, body = api_error(excinfo)
    assert status == 400
    assert body["error"] == "image URL host 127.0.0.1 is not reachable from here"
    assert field_errors(body, "image") == [body["error"]]


async def test_missing_image_url_names_the_status(url_reader: MediaSourceReader,
                                                  image_server: str) -> None:
    with pytest.raises(ApiError) as excinfo:
        await url_reader.read(f"http://{image_server}/nothing", "image", allow_urls=True)
    assert api_error(excinfo) == (400, {
        "error": "could not fetch image URL: the server answered HTTP 404",
        "code": "INVALID_REQUEST",
        "details": {"_errors": [], "image": {
            "_errors": ["could not fetch image URL: the server answered HTTP 404"]}}})


async def test_image_url_of_25_mb_is_413(url_reader: MediaSourceReader,
                                         image_server: str) -> None:
    with pytest.raises(ApiError) as excinfo:
        await url_reader.read(f"http://{image_server}/big", "image", allow_urls=True)
    assert_payload_too_large(excinfo)


async def test_unreachable_and_slow_urls_are_400(image_server: str) -> None:
    closed = MediaSourceReader(image_fetcher(allowed_hosts=frozenset({"127.0.0.1:9"})))
    with pytest.raises(ApiError) as excinfo:
        await closed.read("http://127.0.0.1:9/cat.png", "image", allow_urls=True)
    assert api_error(excinfo)[1]["error"] == "could not fetch image URL"
    slow = MediaSourceReader(image_fetcher(allowed_hosts=frozenset({image_server}),
                                           timeout_s=0.3))
    with pytest.raises(ApiError) as excinfo:
        await slow.read(f"http://{image_server}/slow", "image", allow_urls=True)
    assert api_error(excinfo)[1]["error"] == "could not fetch image URL: timed out"


# ------------------------------------------------------------------------------------------
# Request bodies: JSON, multipart, other content types


MAX_BODY = 40 * 1024 * 1024


def body_app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    async def answer(request: Request, multipart: bool) -> dict[str, Any]:
        fields, files = await read_image_body(
            request, file_fields=frozenset({"image", "images", "mask"}), multipart=multipart,
            max_body_bytes=MAX_BODY, max_files=4)
        return {"fields": fields,
                "files": {name: [len(data) for data in parts] for name, parts in files.items()}}

    @app.post("/edit")
    async def edit(request: Request) -> dict[str, Any]:
        return await answer(request, multipart=True)

    @app.post("/json-only")
    async def json_only(request: Request) -> dict[str, Any]:
        return await answer(request, multipart=False)

    return app


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(body_app()) as test_client:
        yield test_client


def test_json_body_is_returned_as_is(client: TestClient) -> None:
    body = {"image": "aGVsbG8=", "prompt": "a cat", "n": 2}
    resp = client.post("/edit", json=body)
    assert resp.status_code == 200
    assert resp.json() == {"fields": body, "files": {}}


@pytest.mark.parametrize(("content", "error"), [
    (b'{"image": ', "Malformed JSON in request body"),
    (b"[1, 2]", "Request body must be a JSON object"),
])
def test_bad_json_is_400(client: TestClient, content: bytes, error: str) -> None:
    resp = client.post("/edit", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["error"] == error and resp.json()["code"] == "INVALID_REQUEST"


def test_multipart_returns_text_fields_and_uploaded_files(client: TestClient) -> None:
    resp = client.post("/edit", data={"prompt": "a cat", "tags": ["a", "b"], "mask": "aGk="},
                       files=[("image", ("cat.png", PNG, "image/png")),
                              ("images[]", ("a.png", PNG[:100], "image/png")),
                              ("images[]", ("b.png", PNG[:50], "image/png"))])
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "fields": {"prompt": "a cat", "tags": ["a", "b"], "mask": "aGk="},
        "files": {"image": [len(PNG)], "images": [100, 50]},
    }


def test_multipart_text_array_field_is_a_list_and_empty_file_inputs_are_skipped(
        client: TestClient) -> None:
    # As a browser sends a form whose file input was left empty.
    content = (b'--b\r\nContent-Disposition: form-data; name="images[]"\r\n\r\naGk=\r\n'
               b'--b\r\nContent-Disposition: form-data; name="prompt"; filename=""\r\n'
               b"Content-Type: application/octet-stream\r\n\r\n\r\n--b--\r\n")
    resp = client.post("/edit", content=content,
                       headers={"content-type": "multipart/form-data; boundary=b"})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"fields": {"images": ["aGk="]}, "files": {}}


def test_file_in_a_field_that_takes_none_is_400(client: TestClient) -> None:
    resp = client.post("/edit", files={"prompt": ("p.png", PNG, "image/png")})
    assert resp.status_code == 400
    assert resp.json()["details"]["prompt"]["_errors"] == [
        "field 'prompt' does not take a file upload"]


def test_too_many_files_is_400(client: TestClient) -> None:
    resp = client.post("/edit", files=[("images", (f"{i}.png", PNG, "image/png"))
                                       for i in range(5)])
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("Invalid multipart body: Too many files")


def test_uploaded_file_of_25_mb_is_413_and_just_under_is_accepted(client: TestClient) -> None:
    resp = client.post("/edit", files={"image": ("big.png", bytes(MAX_IMAGE_BYTES), "image/png")})
    assert resp.status_code == 413
    body = resp.json()
    assert set(body) == {"code", "error"} and body["code"] == "PAYLOAD_TOO_LARGE"
    resp = client.post("/edit", files={"image": ("ok.png", bytes(MAX_IMAGE_BYTES - 1),
                                                 "image/png")})
    assert resp.status_code == 200
    assert resp.json()["files"] == {"image": [MAX_IMAGE_BYTES - 1]}


@pytest.mark.parametrize(("path", "content_type", "accepted"), [
    ("/edit", "text/plain", "application/json or multipart/form-data"),
    ("/edit", "application/x-www-form-urlencoded", "application/json or multipart/form-data"),
    ("/json-only", "multipart/form-data; boundary=x", "application/json"),
])
def test_other_content_types_are_415(client: TestClient, path: str, content_type: str,
                                     accepted: str) -> None:
    resp = client.post(path, content=b"image=abc", headers={"content-type": content_type})
    assert resp.status_code == 415
    assert resp.json() == {
        "error": f"Invalid content type {content_type!r}; use {accepted}",
        "code": "INVALID_CONTENT_TYPE"}


def test_no_body_at_all_is_an_empty_object(client: TestClient) -> None:
    resp = client.post("/edit")
    assert resp.status_code == 200
    assert resp.json() == {"fields": {}, "files": {}}


def http_request(headers: dict[str, str], chunks: list[bytes]) -> Request:
    """A request whose body arrives in `chunks`; reading past them fails the test."""
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if not pending:
            raise AssertionError("the body was read")
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    scope = {"type": "http", "method": "POST", "path": "/edit", "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    return Request(scope, receive)


async def test_declared_length_over_the_cap_is_413_before_reading() -> None:
    request = http_request({"content-type": "application/json",
                            "content-length": str(MAX_BODY + 1)}, [])
    with pytest.raises(ApiError) as excinfo:
        await read_image_body(request, file_fields=frozenset({"image"}),
                              max_body_bytes=MAX_BODY, max_files=1)
    status, body = api_error(excinfo)
    assert status == 413
    assert body == {"code": "PAYLOAD_TOO_LARGE", "error": f"Request body exceeds {MAX_BODY} bytes"}


async def test_chunked_body_over_the_cap_is_413_while_streaming() -> None:
    request = http_request({"content-type": "application/json",
                            "transfer-encoding": "chunked"}, [b"x" * 600, b"x" * 600])
    with pytest.raises(ApiError) as excinfo:
        await read_image_body(request, file_fields=frozenset({"image"}),
                              max_body_bytes=1000, max_files=1)
    assert api_error(excinfo)[0] == 413


# ------------------------------------------------------------------------------------------
# anon_user_id, and errors crossing process boundaries


@pytest.mark.parametrize("value", [None, "a", "x" * 128, " ~ printable | ascii ~ "])
def test_accepted_anon_user_ids(value: str | None) -> None:
    assert check_anon_user_id(value) == value


@pytest.mark.parametrize(("value", "message"), [
    ("", "anon_user_id must be 1 to 128 characters long"),
    ("x" * 129, "anon_user_id must be 1 to 128 characters long"),
    ("tab\there", "anon_user_id must contain printable ASCII characters only (0x20 to 0x7E)"),
    ("caf\u00e9", "anon_user_id must contain printable ASCII characters only (0x20 to 0x7E)"),
    ("a||b", "anon_user_id must not contain '||'"),
    (42, "anon_user_id must be a string"),
])
def test_refused_anon_user_ids(value: Any, message: str) -> None:
    with pytest.raises(ApiError) as excinfo:
        check_anon_user_id(value)
    status, body = api_error(excinfo)
    assert status == 400 and body["error"] == message
    assert field_errors(body, "anon_user_id") == [message]


def test_image_input_error_survives_pickling() -> None:
    err = pickle.loads(pickle.dumps(ImageInputError("image data is truncated or corrupt",
                                                    "mask", 413)))
    assert (str(err), err.field, err.status) == ("image data is truncated or corrupt", "mask", 413)
    assert inputs.to_api_error(err).status == 413
