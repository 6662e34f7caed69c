"""What is delivered is charged: enhancement works on every frame but is priced per second of
the clip, so a source clip may hold at most 120 frames a second, whether its header declares
more or its packets hold more than the header says (400 INVALID_VIDEO_FORMAT, nothing held or
fetched twice); within that, an upscale delivered at 48 fps or more is priced at the high-rate
multiplier whether the rate was asked for or is the source's own."""

from __future__ import annotations

import pytest

from tests.unit.flows.books import nanos
from tests.unit.video.api import post
from tests.unit.video.clips import clip, data_url, webm_understating_its_rate

UPSCALE = {"model": "clip-upscaler", "prompt": "sharper", "duration": "auto"}


@pytest.mark.parametrize("model", ["clip-upscaler", "clip-interpolator"])
def test_a_one_second_clip_of_700_frames_is_refused_and_nothing_is_charged(
        gateway, fakes, media, key, books, model):
    before = books.balance_nanos()
    video_url = media.publish("fast.mp4", clip(1.0, fps=700, size=(64, 48)), "video/mp4")
    body = {**UPSCALE, "model": model, "video_url": video_url}
    for path in ("quote", "queue"):
        resp = post(gateway, key, path, body)

        assert resp.status_code == 400, (path, resp.text)
        assert resp.json()["code"] == "INVALID_VIDEO_FORMAT"
        assert "700 frames a second; at most 120" in resp.json()["error"]
    assert fakes["video-enhance"].calls == []
    assert books.open_holds() == 0 and books.entries() == 0
    assert books.balance_nanos() == before


def test_a_clip_whose_header_understates_its_rate_is_refused_by_its_frames(gateway, fakes,
                                                                         key, books):
    liar = webm_understating_its_rate(frames=700, seconds=1.0, declared_fps=24)

    resp = post(gateway, key, "queue", {**UPSCALE, "video_url": data_url(liar, "video/webm")})

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_VIDEO_FORMAT"
    assert "more than 120 frames a second" in resp.json()["error"]
    assert fakes["video-enhance"].calls == []
    assert books.open_holds() == 0 and books.entries() == 0


def test_an_upscale_at_the_sources_high_rate_is_priced_as_high_rate(gateway, media, key):
    """160x120 x2 = the 480p tier, 0.01 USD/s, over 1 s; doubled at 48 fps or more."""
    quotes = {}
    for fps in (30, 60, 120):
        url = media.publish(f"clip-{fps}.mp4", clip(1.0, fps=fps), "video/mp4")
        resp = post(gateway, key, "quote", {"model": "clip-upscaler", "duration": "auto",
                                             "video_url": url})
        assert resp.status_code == 200, (fps, resp.text)
        quotes[fps] = nanos(resp.json()["quote"])
    assert quotes == {30: nanos("0.01"), 60: nanos("0.02"), 120: nanos("0.02")}
