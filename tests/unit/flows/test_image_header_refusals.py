"""Images whose header would keep a parser busy: refused from a bounded walk of their structure,
inspected in a worker (never on the event loop) within a deadline, the hold released, and
each refusal counted toward the account's budget of refused images."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import pytest
from PIL import Image

from serve_app.errors import ApiError
from serve_app.images.header_scan import MAX_SEGMENTS, MAX_WASTED_BYTES
from serve_app.images.inputs import ImageInspector, inspect_image
from serve_app.images.rules import MAX_IMAGE_BYTES
from serve_app.limits.policy import REFUSED_IMAGES_MAX
from tests.unit.images.test_image_inputs import png_chunk

# The attack: a JPEG start and 0xFF fill up to just under 25 MB (Pillow walked it byte by
# byte, about 11 s on the event loop).
MARKER_PADDED_JPEG = b"\xff\xd8\xff" + b"\xff" * (MAX_IMAGE_BYTES - 4)
# The same, just past the bound: quick to send many times.
SMALL_PADDED_JPEG = b"\xff\xd8\xff" + b"\xff" * (MAX_WASTED_BYTES + 16)


def _image(fmt: str, size: tuple[int, int] = (256, 256)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (20, 120, 200)).save(out, format=fmt)
    return out.getvalue()


def _upscale(gateway, key: str, image: bytes):
    return gateway.client.post("/api/v1/image/upscale", headers=gateway.auth(key), json={
        "image": base64.b64encode(image).decode(), "scale": 2})


def test_the_marker_padded_jpeg_is_refused_by_the_bounded_walk():
    with pytest.raises(ApiError) as refused:
        inspect_image(MARKER_PADDED_JPEG, "image")
    assert refused.value.status == 400
    assert refused.value.body()["code"] == "CORRUPTED_IMAGE"
    # The walk's own reason: Pillow's marker walk never started.
    assert "fill or junk bytes" in refused.value.message


def test_junk_between_segments_and_endless_chunks_are_refused_alike():
    junk_jpeg = b"\xff\xd8\xff\xe0\x00\x02" + b"\x00" * (MAX_WASTED_BYTES + 16)
    endless_png = _image("PNG")[:33] + png_chunk(b"abCd", b"") * (MAX_SEGMENTS + 1)
    for data, reason in ((junk_jpeg, "fill or junk bytes"), (endless_png, "PNG chunks")):
        with pytest.raises(ApiError) as refused:
            inspect_image(data, "image")
        assert refused.value.status == 400 and reason in refused.value.message


def test_real_images_with_some_fill_and_metadata_still_pass():
    jpeg = _image("JPEG")
    # A few fill bytes before the second marker, as some encoders write.
    padded = jpeg[:2] + b"\xff" * 64 + jpeg[2:]
    text = png_chunk(b"tEXt", b"workflow\x00" + b"x" * 2_000_000)
    png = _image("PNG")
    with_text = png[:33] + text + png[33:]
    for data, fmt in ((padded, "JPEG"), (with_text, "PNG"), (_image("WEBP"), "WEBP")):
        checked = inspect_image(data, "image")
        assert (checked.format, checked.width, checked.height) == (fmt, 256, 256)


def test_the_inspection_runs_in_a_worker_within_its_deadline():
    """The only worker is held busy: the inspection cannot run inline, so the caller gets a
    400 at the deadline while the event loop goes on."""

    async def scenario() -> None:
        inspector = ImageInspector(None, timeout_s=0.2, workers=1)
        release = threading.Event()
        inspector._workers.submit(release.wait)
        try:
            with pytest.raises(ApiError) as refused:
                await inspector.inspect(_image("PNG"), "image", account_id="acct")
            assert refused.value.status == 400
            assert refused.value.body()["code"] == "CORRUPTED_IMAGE"
            assert "could not be read in 0.2 s" in refused.value.message
        finally:
            release.set()
        inspector.timeout_s = 120  # the worker is free again: the next image is read
        checked = await inspector.inspect(_image("PNG"), "image", account_id="acct")
        assert checked.width == 256
        inspector.close()

    asyncio.run(scenario())


def test_upscaling_the_attack_file_is_a_400_with_the_hold_released(fake_gateway, fakes, key,
                                                                   books):
    before = books.balance_nanos()

    resp = _upscale(fake_gateway, key, MARKER_PADDED_JPEG)

    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["code"] == "CORRUPTED_IMAGE"
    assert "error" in resp.json()
    assert fakes["image-upscale"].calls == []
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_refused_images_spend_the_accounts_budget_across_its_keys(fake_gateway, fakes,
                                                                  books):
    """Spread over keys (each has its own 20 a minute), the account's refusals still add up:
    past the budget its next image is refused before it is read, even a good one."""
    gw = fake_gateway
    keys = [gw.create_key()["apiKey"] for _ in range(3)]
    for n in range(REFUSED_IMAGES_MAX + 1):
        resp = _upscale(gw, keys[n % 2], SMALL_PADDED_JPEG)
        assert resp.status_code == 400, (n, resp.text)

    before = time.time()
    resp = _upscale(gw, keys[2], _image("PNG"))

    assert resp.status_code == 429, resp.text
    assert resp.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert "refused images" in resp.json()["error"]
    wait = int(resp.headers["retry-after"])  # seconds from now
    assert 0 < wait <= 30
    assert before < int(resp.headers["x-ratelimit-resets"]) <= time.time() + 31  # Unix seconds
    assert fakes["image-upscale"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
