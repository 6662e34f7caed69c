"""An upscale is priced at the rate it delivers (`target_fps`, else the source's), so the
engine must not do more work than that rate: a 120 fps source asked at `target_fps: 24` is
quoted as a 24 fps clip, and the upscaler drops the source to 24 frames a second before
Real-ESRGAN sees it (issue 25, item 1: it upscaled all 120 and then interpolated down)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from deployments.engines.image import RealEsrganEngine
from deployments.engines.video import RealEsrganVideoEngine
from tests.unit.flows.books import nanos
from tests.unit.video.api import post
from tests.unit.video.clips import clip


class CountingUpscaler(RealEsrganEngine):
    """The real Real-ESRGAN engine, counting the frames it is given (the work an upscale
    does)."""

    def __init__(self) -> None:
        super().__init__(None, {})
        self.frames = 0

    def run(self, images: list, params: dict[str, Any]) -> list:
        self.frames += len(images)
        return super().run(images, params)


@pytest.fixture(scope="module")
def engine() -> RealEsrganVideoEngine:
    video = RealEsrganVideoEngine(None, {})
    video.upscaler = CountingUpscaler()
    return video


def _upscale(engine: RealEsrganVideoEngine, source: bytes, target_fps: int | None,
             seconds: float) -> tuple[list[np.ndarray], float, int]:
    engine.upscaler.frames = 0
    frames, fps = engine.run({"upscale_factor": 2, "seconds": seconds,
                              "target_fps": target_fps}, {"video": source})
    return frames, fps, engine.upscaler.frames


def test_a_120_fps_source_at_target_24_is_quoted_and_worked_as_24_fps(gateway, media, key,
                                                                       engine):
    fast = media.publish("fast.mp4", clip(2.0, fps=120, size=(32, 24)), "video/mp4")
    slow = media.publish("slow.mp4", clip(2.0, fps=24, size=(32, 24)), "video/mp4")
    quote = {}
    for name, url, target in (("fast@24", fast, 24), ("slow", slow, None),
                              ("fast", fast, None)):
        body = {"model": "clip-upscaler", "duration": "auto", "video_url": url}
        resp = post(gateway, key, "quote", body | ({"target_fps": target} if target else {}))
        assert resp.status_code == 200, (name, resp.text)
        quote[name] = nanos(resp.json()["quote"])
    # the source's own 120 fps is a high rate (doubled); asked down to 24 fps it is not
    assert quote["fast@24"] == quote["slow"]
    assert quote["fast"] == 2 * quote["slow"]

    frames, fps, upscaled = _upscale(engine, clip(2.0, fps=120, size=(32, 24)), 24, 2.0)

    assert (len(frames), fps) == (48, 24.0)
    assert upscaled == 48  # was 240: every source frame, then interpolated down
    assert frames[0].shape[:2] == (48, 64)
    # each delivered frame is the source frame at its instant (the source's frame i is grey
    # level 16 i; its neighbours are 16 levels away), not a blend
    for k in (1, 2, 3):
        assert abs(int(np.median(frames[k])) - (5 * k * 16) % 256) < 8, k


def test_a_target_above_the_source_rate_upscales_the_source_frames_once(engine):
    frames, fps, upscaled = _upscale(engine, clip(1.0, fps=24, size=(32, 24)), 48, 1.0)

    assert (len(frames), fps) == (48, 48.0)
    assert upscaled == 24
