"""The pricing rules of queued video and audio, from the shipped catalog's tables: each rule
with its figure, and each refusal naming what to change."""

from __future__ import annotations

from decimal import Decimal

import pytest

from serve_app.billing.pricing.audio import audio_cost, parse_seconds, voice_change_cost
from serve_app.billing.pricing.video import SourceVideo, VideoAsk, frame_size, plan_video
from serve_app.errors import ApiError
from serve_app.models.catalog import CatalogModel, load_catalog
from serve_app.settings import PROJECT_ROOT

CATALOG = load_catalog(PROJECT_ROOT / "configs" / "models.yaml")
TEST_CATALOG = load_catalog(PROJECT_ROOT / "tests" / "integration" / "catalog.yaml")


def _usd(value: str) -> int:
    return int(Decimal(value) * 10**9)


def _plan(model_id: str, source: SourceVideo | None = None, **ask):
    return plan_video(CATALOG.by_id[model_id], VideoAsk(**ask), source)


@pytest.mark.parametrize(("resolution", "ratio", "size"), [
    ("256p", "16:9", (448, 256)), ("256p", "9:16", (256, 448)), ("480p", "1:1", (480, 480)),
    ("720p", "16:9", (1280, 720)), ("1080p", "4:3", (1440, 1088)), ("4k", "16:9", (3840, 2160)),
    ("true_1080p", "16:9", (1920, 1088)),
])
def test_frame_sizes_are_the_tier_at_the_ratio_in_multiples_of_16(resolution, ratio, size):
    assert frame_size(resolution, ratio) == size


def test_duration_resolution_rate():
    plan = _plan("wan-text-to-video-test", duration="4s", resolution="480p",
                 aspect_ratio="16:9")
    assert plan.cost.nanos == _usd("0.16")  # 0.04/s x 4 s
    assert (plan.width, plan.height, plan.fps, plan.seconds) == (848, 480, 8.0, 4.0)
    with pytest.raises(ApiError, match="resolution is required"):
        _plan("wan-text-to-video-test", duration="4s")


def test_durations_outside_the_models_range_are_422_and_unknown_ones_400():
    for duration, code in (("5s", "VIDEO_DURATION_TOO_LONG"), ("30s", "VIDEO_DURATION_TOO_LONG")):
        with pytest.raises(ApiError) as err:
            _plan("wan-text-to-video-test", duration=duration, resolution="256p")
        assert (err.value.status, err.value.code) == (422, code)
    with pytest.raises(ApiError) as err:
        _plan("video-upscaler", SourceVideo(2.0, 320, 240, 24), duration="31s")
    assert err.value.status == 400
    with pytest.raises(ApiError, match="1 gen"):
        _plan("wan-text-to-video-test", duration="1 gen", resolution="256p")


def test_megapixel_rate_needs_an_aspect_ratio_and_follows_the_pixels():
    with pytest.raises(ApiError, match="aspect_ratio is required"):
        _plan("wan-image-to-video-test", duration="2s")
    wide = _plan("wan-image-to-video-test", duration="2s", aspect_ratio="16:9")
    square = _plan("wan-image-to-video-test", duration="2s", aspect_ratio="1:1")
    assert wide.cost.nanos == _usd("0.0458752")  # 448x256 = 0.114688 MP x 0.2 x 2 s
    assert square.cost.nanos == _usd("0.0262144")  # 256x256


def test_reference_videos_bill_input_and_output_at_the_reference_rate():
    baseline = _plan("wan-reference-to-video-test", duration="2s", aspect_ratio="1:1")
    assert baseline.cost.nanos == _usd("0.0262144")
    quoted = _plan("wan-reference-to-video-test", duration="2s", aspect_ratio="1:1",
                   reference_video_total_duration=6)
    assert quoted.cost.nanos == _usd("0.0524288")  # (6 + 2) s x 0.065536 MP x 0.1
    # source-matched: as long as the source, at the source's own aspect when it is known
    clip = SourceVideo(8.0, 640, 480, 24)
    matched = _plan("wan-reference-to-video-test", clip, duration="auto",
                    aspect_ratio="adaptive")
    assert (matched.seconds, matched.width, matched.height) == (8.0, 336, 256)
    assert matched.cost.nanos == _usd(str(Decimal(336 * 256) / 10**6 * Decimal("0.1") * 16))
    for seconds, code in ((3.5, "VIDEO_DURATION_TOO_SHORT"), (31, "VIDEO_DURATION_TOO_LONG")):
        with pytest.raises(ApiError) as err:
            _plan("wan-reference-to-video-test", duration="-1", aspect_ratio="1:1",
                  reference_video_total_duration=seconds)
        assert err.value.code == code


def test_upscale_bills_the_output_tier_and_doubles_at_high_frame_rates():
    clip = SourceVideo(5.0, 960, 540, 30)
    assert _plan("video-upscaler", clip, duration="auto").cost.nanos == _usd("0.2")  # 1080p
    assert _plan("video-upscaler", clip, duration="auto",
                 upscale_factor=1).cost.nanos == _usd("0.1")  # 540p -> 720p tier
    assert _plan("video-upscaler", clip, duration="auto", upscale_factor=4,
                 target_fps=47).cost.nanos == _usd("0.4")  # 2160p, not doubled under 48
    assert _plan("video-upscaler", clip, duration="auto", upscale_factor=4,
                 target_fps=48).cost.nanos == _usd("0.8")
    assert _plan("video-upscaler", clip, duration="2s").cost.nanos == _usd("0.08")
    with pytest.raises(ApiError, match="video_url"):
        _plan("video-upscaler", duration="auto")


def test_interpolation_scales_with_fps_and_slowdown():
    clip = SourceVideo(3.0, 320, 240, 24)
    default = _plan("video-interpolator", clip, duration="auto")
    assert default.cost.nanos == _usd("0.012")  # dis-fast 0.004/s x 3 s at the base rate
    slow = _plan("video-interpolator", clip, duration="auto", slowdown_factor=8,
                 target_fps=60, enhancement_model="dis-ultrafast")
    assert slow.cost.nanos == _usd("0.12")  # 0.002 x 60/24 x (3 x 8) s
    assert (slow.seconds, slow.fps) == (24.0, 60.0)
    with pytest.raises(ApiError, match="dis-ultrafast"):
        _plan("video-interpolator", clip, duration="auto", enhancement_model="rife")
    with pytest.raises(ApiError, match="frame interpolation"):
        _plan("video-upscaler", clip, duration="auto", slowdown_factor=2)


def test_audio_track_and_per_generation_tables():
    model = TEST_CATALOG.by_id["video-with-audio-test"]
    assert plan_video(model, VideoAsk("5s")).cost.nanos == _usd("0.3")
    assert plan_video(model, VideoAsk("5s", audio=False)).cost.nanos == _usd("0.25")
    flat = CatalogModel(id="flat", type="video", name="flat", deployment="x", engine="x",
                        operation="text-to-video", pricing={"per_generation": {"usd": 0.5}},
                        constraints={"durations": ["1 gen"], "generation_seconds": 6})
    plan = plan_video(flat, VideoAsk("1 gen"))
    assert plan.cost.nanos == _usd("0.5") and plan.seconds == 6
    assert plan.cost.lines[0].line_type == "video_generations"


def test_audio_quotes_per_table():
    narrator, changer = CATALOG.by_id["piper-narrator"], CATALOG.by_id["voice-changer"]
    assert audio_cost(narrator, duration_seconds=None,
                      character_count=1500).nanos == _usd("0.0225")
    tiers = TEST_CATALOG.by_id["music-tiers-test"]
    assert audio_cost(tiers, duration_seconds=61, character_count=None).nanos == _usd("0.05")
    assert audio_cost(tiers, duration_seconds=None, character_count=None).nanos == _usd("0.03")
    # whole minutes of the source, rounded up: one tier per number of minutes
    assert voice_change_cost(changer, 10.5).nanos == _usd("0.03")
    assert voice_change_cost(changer, 60).nanos == _usd("0.03")
    assert voice_change_cost(changer, 60.2).nanos == _usd("0.06")
    assert voice_change_cost(changer, 60.2).units == {"audio_minutes": 2}
    with pytest.raises(ApiError, match="at most 300"):
        voice_change_cost(changer, 300.5)
    with pytest.raises(ApiError, match="voice-changer/quote"):
        audio_cost(changer, duration_seconds=10, character_count=None)
    assert parse_seconds("42") == 42.0 and parse_seconds(7) == 7.0
    for bad in ("0", "-1", "1e999", "seven", True):
        with pytest.raises(ApiError):
            parse_seconds(bad)
