"""What a video job costs, and what it will make, from the model's tables in the catalog.

A video model's `pricing` holds one base rate, and may add rules to it:

- `per_second`: USD per second of output;
- `per_second_by_resolution`: per second, by output resolution (`resolution` required);
- `per_megapixel_second`: per second per megapixel of output (`aspect_ratio` required);
- `per_generation`: one price per job (duration `1 gen`);
- `per_second_by_output_tier`: upscalers, per second, by the output tier the source height
  times `upscale_factor` falls in;
- `per_second_by_enhancement_model`: per second, by `enhancement_model` (the names the model
  lists in `constraints.<provider>.models`);
- `audio_per_second`: added per second when the job makes audio;
- `reference_per_megapixel_second`: with reference videos, replaces the base rate and bills
  the reference seconds and the output seconds together;
- `high_fps_multiplier` (with `high_fps_from`, default 48): upscalers, when the output rate
  (`target_fps`, or else the source's own) is that high;
- `fps_base`: interpolators, the price scales with `target_fps / fps_base` (without
  `target_fps`, with the source's rate over it when that is higher).

`constraints` says what the model accepts: `durations` (`1s`.. `30s`, `1 gen`, `auto`),
`resolutions`, `aspect_ratios` (with `adaptive`/`auto` for reference models), `audio`,
`audio_configurable`, `default_resolution`, `default_upscale_factor`, `fps`,
`max_source_seconds`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from serve_app.billing.pricing import Cost, PricedLine, nanos_of
from serve_app.errors import ApiError, invalid_request
from serve_app.models.catalog import CatalogModel
from serve_app.money import NANOS_PER_UNIT

BASE_RATES = ("per_second", "per_second_by_resolution", "per_megapixel_second",
              "per_generation", "per_second_by_output_tier", "per_second_by_enhancement_model")
SOURCE_MATCHED = ("-1", "auto", "Auto")
ADAPTIVE_RATIOS = ("adaptive", "auto")
MAX_REFERENCE_SECONDS = 150.0
# The spec's rule for source-matched durations: the source clip must be 4 to 30 s long.
SOURCE_MATCHED_RANGE = (4.0, 30.0)
RATIOS = ("1:1", "2:3", "3:2", "3:4", "4:3", "4:5", "5:4", "9:16", "9:21", "16:9", "21:9")
SLOWDOWN_FACTORS = (1, 2, 4, 8)
UPSCALE_FACTORS = (1, 2, 4)
DEFAULT_FPS = 24


@dataclass(frozen=True, slots=True)
class VideoAsk:
    """The pricing fields of a quote or queue body."""

    duration: str
    aspect_ratio: str | None = None
    resolution: str | None = None
    upscale_factor: int | None = None
    enhancement_model: str | None = None
    target_fps: int | None = None
    slowdown_factor: int | None = None
    audio: bool | None = None
    reference_video_total_duration: float | None = None


@dataclass(frozen=True, slots=True)
class SourceVideo:
    """What the job's source clip is (probed from `video_url`, or reference videos)."""

    seconds: float
    width: int
    height: int
    fps: float


@dataclass(frozen=True, slots=True)
class VideoPlan:
    """The price, and what the engine is to make for it."""

    cost: Cost
    seconds: float  # output length
    width: int
    height: int
    fps: float
    audio: bool

    @property
    def quote_usd(self) -> float:
        return round(self.cost.nanos / NANOS_PER_UNIT, 9)


def _usd(entry: Any, what: str) -> Decimal:
    if isinstance(entry, dict):
        entry = entry.get("usd")
    if entry is None:
        raise ApiError(500, f"the catalog has no price for {what}", code="UNKNOWN_ERROR")
    return Decimal(str(entry))


def _too(kind: str, message: str) -> ApiError:
    return ApiError(422, message, code=f"VIDEO_DURATION_TOO_{kind}")


def _seconds_of(value: str) -> int | None:
    if value.endswith("s") and value[:-1].isdigit():
        return int(value[:-1])
    return None


def _duration(model: CatalogModel, ask: VideoAsk, source: SourceVideo | None) -> float | None:
    """Output seconds; None for a per-generation job (`1 gen`)."""
    offered = model.video_constraints.durations
    value = ask.duration
    if value == "1 gen":
        if "1 gen" not in offered:
            raise invalid_request(f"duration '1 gen' is not offered by {model.id}; use one of "
                                  f"{', '.join(offered)}", "duration")
        return None
    if value in SOURCE_MATCHED:
        if not any(d in SOURCE_MATCHED for d in offered):
            raise invalid_request(f"{model.id} has no source-matched duration ({value!r}); "
                                  f"use one of {', '.join(offered)}", "duration")
        if source is None:
            raise invalid_request(
                f"duration {value!r} matches the source clip: give reference_video_total_"
                "duration (quote) or the source video (queue)", "duration")
        low, high = (SOURCE_MATCHED_RANGE if model.operation == "reference-to-video"
                     else (0.1, float(model.video_constraints.max_source_seconds)))
        if source.seconds < low:
            raise _too("SHORT", f"the source clip is {source.seconds:g} s; {model.id} needs "
                                f"at least {low:g} s to match its length")
        if source.seconds > high:
            raise _too("LONG", f"the source clip is {source.seconds:g} s; {model.id} matches "
                               f"at most {high:g} s")
        return source.seconds
    seconds = _seconds_of(value)
    if seconds is None or not 1 <= seconds <= 30:
        raise invalid_request("duration must be one of 1s to 30s, -1, '1 gen', auto or Auto",
                              "duration")
    fixed = sorted(s for s in (_seconds_of(d) for d in offered) if s is not None)
    if fixed and seconds > fixed[-1]:
        raise _too("LONG", f"duration {value} is longer than {model.id} makes (at most "
                           f"{fixed[-1]}s)")
    if fixed and seconds < fixed[0]:
        raise _too("SHORT", f"duration {value} is shorter than {model.id} makes (at least "
                            f"{fixed[0]}s)")
    if value not in offered:
        raise invalid_request(f"duration {value} is not offered by {model.id}; use one of "
                              f"{', '.join(offered)}", "duration")
    return float(seconds)


def _height_of(resolution: str) -> int:
    """`720p` -> 720; `4k`/`2160p` -> 2160; `2k`/`1440p` -> 1440; `true_1080p` -> 1080."""
    name = resolution.lower().removeprefix("true_")
    named = {"4k": 2160, "2k": 1440}
    if name in named:
        return named[name]
    if name.endswith("p") and name[:-1].isdigit():
        return int(name[:-1])
    raise invalid_request(f"resolution {resolution!r} names no height", "resolution")


def _ratio(value: str) -> tuple[int, int]:
    w, h = value.split(":")
    return int(w), int(h)


def frame_size(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    """Width and height of a resolution tier (its short side) at an aspect ratio, in
    multiples of 16 as video models need."""
    short = _height_of(resolution)
    w, h = _ratio(aspect_ratio)
    if w >= h:
        width, height = short * w / h, short
    else:
        width, height = short, short * h / w
    return round(width / 16) * 16, round(height / 16) * 16


def _pick(model: CatalogModel, field: str, value: str | None, offered: list[str],
          default: str | None = None) -> str | None:
    if value is None:
        return default
    if offered and value not in offered:
        raise invalid_request(f"{field} {value!r} is not offered by {model.id}; use one of "
                              f"{', '.join(offered)}", field)
    return value


def _aspect(model: CatalogModel, ask: VideoAsk, source: SourceVideo | None,
            required: bool) -> str | tuple[int, int]:
    """The output aspect: a ratio name, or the source's (width, height) for adaptive."""
    constraints = model.video_constraints
    value = _pick(model, "aspect_ratio", ask.aspect_ratio, constraints.aspect_ratios or [])
    if value is None:
        if required:
            offered = constraints.aspect_ratios or []
            raise invalid_request(f"aspect_ratio is required for {model.id} (priced by "
                                  f"megapixels); use one of {', '.join(offered)}",
                                  "aspect_ratio")
        return constraints.default_aspect_ratio
    if value in ADAPTIVE_RATIOS:
        if ask.reference_video_total_duration is None and source is None:
            raise invalid_request(f"aspect_ratio {value!r} matches the source clip: give "
                                  "reference_video_total_duration (quote) or the source "
                                  "video (queue)", "aspect_ratio")
        if source is not None and source.width and source.height:
            return source.width, source.height
        # quoting without the clip: the widest ratio the model offers bounds the price
        ratios = RATIOS if constraints.aspect_ratios is None else tuple(constraints.aspect_ratios)
        return max((r for r in ratios if r not in ADAPTIVE_RATIOS),
                   key=lambda r: frame_size("1080p", r)[0] * frame_size("1080p", r)[1])
    return value


def _size(resolution: str, aspect: str | tuple[int, int]) -> tuple[int, int]:
    if isinstance(aspect, tuple):
        short = _height_of(resolution)
        w, h = aspect
        scale = short / min(w, h)
        return round(w * scale / 16) * 16, round(h * scale / 16) * 16
    return frame_size(resolution, aspect)


def _output_tier(model: CatalogModel, tiers: dict[str, Any], height: int) -> str:
    ordered = sorted(tiers, key=_height_of)
    for tier in ordered:
        if height <= _height_of(tier):
            return tier
    raise invalid_request(f"the output would be {height}p; {model.id} makes at most "
                          f"{ordered[-1]}: use a smaller upscale_factor", "upscale_factor")


def plan_video(model: CatalogModel, ask: VideoAsk,
               source: SourceVideo | None = None) -> VideoPlan:
    """The price of `ask` on `model` (the quote), with the output it pays for. `source`: the
    source clip, when known (upscale and interpolation inputs, reference videos)."""
    pricing, constraints = model.pricing, model.video_constraints
    base = next((key for key in BASE_RATES if key in pricing), None)
    if base is None:
        raise ApiError(500, f"the catalog gives {model.id} no video price",
                       code="UNKNOWN_ERROR")
    op = model.operation
    if ask.reference_video_total_duration is not None:
        if op != "reference-to-video":
            raise invalid_request(f"{model.id} takes no reference videos",
                                  "reference_video_total_duration")
        if not 0 <= ask.reference_video_total_duration <= MAX_REFERENCE_SECONDS:
            raise invalid_request(f"reference_video_total_duration must be 0 to "
                                  f"{MAX_REFERENCE_SECONDS:g} seconds",
                                  "reference_video_total_duration")
        if source is None:
            source = SourceVideo(ask.reference_video_total_duration, 0, 0, 0)
    if op in ("video-upscale", "video-interpolate") and source is None:
        raise invalid_request(f"{model.id} prices by its source clip: give video_url",
                              "video_url")
    if ask.slowdown_factor not in (None, 1) and op != "video-interpolate":
        raise invalid_request("slowdown_factor applies to frame interpolation models only",
                              "slowdown_factor")
    if ask.slowdown_factor is not None and ask.slowdown_factor not in SLOWDOWN_FACTORS:
        raise invalid_request("slowdown_factor must be 1, 2, 4 or 8", "slowdown_factor")
    if ask.upscale_factor is not None and op != "video-upscale":
        raise invalid_request("upscale_factor applies to upscale models only",
                              "upscale_factor")
    if ask.target_fps is not None:
        if op not in ("video-upscale", "video-interpolate"):
            raise invalid_request("target_fps applies to enhancement models only",
                                  "target_fps")
        if not 16 <= ask.target_fps <= 120:
            raise invalid_request("target_fps must be 16 to 120", "target_fps")
    names = constraints.enhancement_models
    if ask.enhancement_model is not None and ask.enhancement_model not in names:
        raise invalid_request(
            f"enhancement_model {ask.enhancement_model!r} is not offered by {model.id}"
            + (f"; use one of {', '.join(names)}" if names else ""), "enhancement_model")

    seconds = _duration(model, ask, source)
    if (seconds is None) != (base == "per_generation"):
        raise invalid_request(f"duration {ask.duration!r} does not fit how {model.id} is "
                              "priced", "duration")
    if op in ("video-upscale", "video-interpolate") and source is not None \
            and seconds is not None and seconds > source.seconds + 0.5:
        raise invalid_request(f"duration {ask.duration} is longer than the source clip "
                              f"({source.seconds:g} s); use auto to match it", "duration")
    fps = float(DEFAULT_FPS if constraints.fps is None else constraints.fps)
    if source is not None and op in ("video-upscale", "video-interpolate"):
        fps = source.fps or fps
    slowdown = ask.slowdown_factor or 1
    billed = (seconds or 0.0) * slowdown
    rate: Decimal
    width = height = 0
    resolution = _pick(model, "resolution", ask.resolution, constraints.resolutions,
                       constraints.default_resolution)
    if op in ("video-upscale", "video-interpolate"):
        assert source is not None
        factor = ask.upscale_factor or constraints.default_upscale_factor \
            if op == "video-upscale" else 1
        if factor not in UPSCALE_FACTORS:
            raise invalid_request("upscale_factor must be 1, 2 or 4", "upscale_factor")
        width, height = source.width * factor, source.height * factor
    elif resolution is not None:
        aspect = _aspect(model, ask, source, required=base == "per_megapixel_second")
        width, height = _size(resolution, aspect)

    if base == "per_second":
        rate = _usd(pricing["per_second"], "a second")
    elif base == "per_second_by_resolution":
        table = pricing["per_second_by_resolution"]
        if ask.resolution is None and resolution is None:
            raise invalid_request(f"resolution is required for {model.id}; use one of "
                                  f"{', '.join(table)}", "resolution")
        if resolution not in table:
            raise invalid_request(f"resolution {resolution!r} is not priced for {model.id}; "
                                  f"use one of {', '.join(table)}", "resolution")
        rate = _usd(table[resolution], f"{resolution}")
    elif base == "per_megapixel_second":
        if resolution is None:
            raise invalid_request(f"resolution is required for {model.id}", "resolution")
        megapixels = Decimal(width * height) / Decimal(1_000_000)
        key = ("reference_per_megapixel_second"
               if ask.reference_video_total_duration is not None or
               (source is not None and op == "reference-to-video") else "per_megapixel_second")
        rate = _usd(pricing.get(key, pricing["per_megapixel_second"]), key) * megapixels
        if key == "reference_per_megapixel_second":
            billed += source.seconds if source is not None else 0.0
    elif base == "per_generation":
        rate = _usd(pricing["per_generation"], "a generation")
    elif base == "per_second_by_output_tier":
        tier = _output_tier(model, pricing["per_second_by_output_tier"], min(width, height))
        rate = _usd(pricing["per_second_by_output_tier"][tier], tier)
    else:
        table = pricing["per_second_by_enhancement_model"]
        chosen = ask.enhancement_model or (names[0] if names else next(iter(table)))
        rate = _usd(table.get(chosen), f"enhancement model {chosen}")

    # Enhancement works on every frame it delivers: at `target_fps`, or else at the source's
    # own rate (a 60 fps source upscaled is a high-rate output too). A target below the
    # source's rate is worked at the target: the upscaler drops frames to it first
    # (deployments/engines/video.py), so the lower rate's price is the work done.
    delivered_fps = ask.target_fps if ask.target_fps is not None else (
        source.fps if source is not None and op in ("video-upscale", "video-interpolate")
        else None)
    if delivered_fps:
        if op == "video-upscale" and delivered_fps >= int(pricing.get("high_fps_from", 48)):
            rate *= Decimal(str(pricing.get("high_fps_multiplier", 2)))
        elif op == "video-interpolate":
            scale = Decimal(str(delivered_fps)) / Decimal(str(pricing.get("fps_base",
                                                                          DEFAULT_FPS)))
            # asked: linear in target_fps; kept at the source rate: never below the base
            rate *= scale if ask.target_fps is not None else max(scale, Decimal(1))

    lines: list[PricedLine] = []
    if base == "per_generation":
        lines.append(PricedLine("video_generations", 1, nanos_of(rate), float(rate)))
    else:
        units = max(1, math.ceil(billed - 1e-9))
        lines.append(PricedLine("video_seconds", units,
                                nanos_of(rate * Decimal(str(billed))), float(rate)))
    makes_audio = constraints.audio and (
        ask.audio is not False or not constraints.audio_configurable)
    if makes_audio and "audio_per_second" in pricing and seconds:
        each = _usd(pricing["audio_per_second"], "audio")
        lines.append(PricedLine("video_audio_seconds", max(1, math.ceil(seconds)),
                                nanos_of(each * Decimal(str(seconds))), float(each)))
    out_seconds = (seconds or float(constraints.generation_seconds)) * slowdown
    out_fps = float(ask.target_fps or fps)
    return VideoPlan(Cost(model, tuple(lines)), out_seconds, width, height, out_fps,
                     makes_audio)


# The smallest source clip a floor is priced against: a square frame (the fewest pixels at a
# resolution, and the lowest output tier), one frame a second (never a high rate).
_LEAST_SIDE = 16
_LEAST_FPS = 1.0
# The shortest source clip an enhancement model matches (`_duration`'s lower bound for them).
_LEAST_SOURCE_SECONDS = 0.1


def floor_plan(model: CatalogModel, ask: VideoAsk, reference_seconds: float = 0.0
               ) -> VideoPlan:
    """The least `ask` can cost on `model` before its inputs are read: the job priced against
    the smallest source that would be accepted. `reference_seconds`: the least the job's
    reference clips can last together (each clip at its shortest). An account that cannot
    pay this is refused before anything is fetched; the real price (`plan_video` with the
    probed source) is never below it. Raises what `plan_video` raises for the ask itself."""
    op = model.operation
    if op not in ("video-upscale", "video-interpolate", "reference-to-video"):
        return plan_video(model, ask, None)
    matched = ask.duration in SOURCE_MATCHED
    if op == "reference-to-video":
        least = max(reference_seconds, SOURCE_MATCHED_RANGE[0] if matched else 0.0)
    else:
        asked = _seconds_of(ask.duration)
        least = float(asked) if asked is not None and not matched else _LEAST_SOURCE_SECONDS
    return plan_video(model, ask, SourceVideo(least, _LEAST_SIDE, _LEAST_SIDE, _LEAST_FPS))
