"""A client's media whose header reads fine but whose pixels do not decode is the client's
mistake: when a model with a consent policy looks for faces in it, a truncated picture is a
400 CORRUPTED_IMAGE and a clip with corrupt frames a 400 INVALID_VIDEO_FORMAT (they were 500s),
with the hold given back, nothing charged and the inputs already kept deleted (issue 25,
item 2)."""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from tests.unit.video.api import post, stored
from tests.unit.video.clips import clip, data_url


def truncated_png() -> bytes:
    """A 256x256 PNG cut in half: its header (all `inspect_image` reads) is whole."""
    out = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    Image.fromarray(noise).save(out, "PNG")
    return out.getvalue()[: len(out.getvalue()) // 2]


def mp4_with_corrupt_frames(seconds: float = 2.0) -> bytes:
    """A real MP4 whose container (all the probe reads) is whole and whose H.264 data is
    overwritten with 0xff: it probes as a clip, its frames do not decode."""
    good = clip(seconds)
    at = good.index(b"mdat")
    (size,) = struct.unpack(">I", good[at - 4:at])
    start, end = at + 4, at - 4 + size
    return good[:start] + b"\xff" * (end - start) + good[end:]


def test_a_truncated_picture_to_image_to_video_is_a_400_and_nothing_is_held(
        gateway, fakes, key, books):
    before = books.balance_nanos()
    body = {"model": "face-animator", "prompt": "the wind picks up", "duration": "1s",
            "aspect_ratio": "1:1", "image_url": data_url(truncated_png(), "image/png")}

    resp = post(gateway, key, "queue", body)

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "CORRUPTED_IMAGE"
    assert "image_url" in resp.json()["error"]
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert stored(gateway) == []
    assert fakes["video-generation"].calls == []


def test_a_reference_clip_with_corrupt_frames_is_a_400_and_the_kept_clip_is_deleted(
        gateway, fakes, media, key, books):
    before = books.balance_nanos()
    good = media.publish("good.mp4", clip(2.0), "video/mp4")
    bad = media.publish("bad.mp4", mp4_with_corrupt_frames(), "video/mp4")
    body = {"model": "clip-follower", "prompt": "follow it", "duration": "1s",
            "aspect_ratio": "1:1", "reference_video_urls": [good, bad]}

    resp = post(gateway, key, "queue", body)

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_VIDEO_FORMAT"
    assert "reference_video_urls[1]" in resp.json()["error"]
    assert len(media.requests) == 2  # the good clip was fetched and kept before the bad one
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before
    assert stored(gateway) == []
    assert fakes["video-generation"].calls == []

