"""Output sizes of image requests, from the spec's rules and the model's catalog constraints:
the upscale factor that keeps the result within its cap, the aspect ratio `auto` infers from
the base image, and the pixel size of a resolution tier (`1K`, `2K`, `4K`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from serve_app.errors import invalid_request
from serve_app.models.catalog import CatalogModel

UPSCALE_MIN_PIXELS = 65_536
UPSCALE_MAX_OUTPUT_PIXELS = 16_777_216
EDIT_MIN_PIXELS = 65_536
EDIT_MAX_PIXELS = 33_177_600
# The spec's multi-edit ratios; a model may publish fewer in `constraints.aspectRatios`.
ASPECT_RATIOS = ("1:1", "3:2", "16:9", "21:9", "9:16", "2:3", "3:4", "4:3", "4:5")
# Pixels of the long side of a resolution tier.
TIER_LONG_SIDE = {"1K": 1024, "2K": 2048, "4K": 4096}


def effective_scale(width: int, height: int, requested: float) -> float:
    """The requested scale, reduced so that the output stays within 16,777,216 pixels; a 400
    when even the smallest scale (2) would not fit."""
    pixels = width * height
    fitting = math.sqrt(UPSCALE_MAX_OUTPUT_PIXELS / pixels)
    scale = min(requested, math.floor(fitting * 1000) / 1000)
    while scale > 2 and round(width * scale) * round(height * scale) > UPSCALE_MAX_OUTPUT_PIXELS:
        scale = math.floor(scale * 1000 - 1) / 1000
    if scale < 2:
        raise invalid_request(
            f"image is {width}x{height} = {pixels} pixels; upscaled by 2 it would exceed "
            f"{UPSCALE_MAX_OUTPUT_PIXELS} pixels (at most {UPSCALE_MAX_OUTPUT_PIXELS // 4} "
            "pixels can be upscaled)", "image")
    return scale


def _ratio(name: str) -> float:
    w, h = name.split(":")
    return int(w) / int(h)


def supported_ratios(model: CatalogModel) -> list[str]:
    published = model.image_constraints.aspect_ratios or ASPECT_RATIOS
    return [r for r in published if r != "auto"]


def closest_ratio(model: CatalogModel, width: int, height: int) -> str:
    """`auto`: the supported ratio closest to the image's, compared on a log scale (so 2:1 is
    as far from 1:1 as 1:2)."""
    actual = math.log(width / height)
    return min(supported_ratios(model), key=lambda r: abs(math.log(_ratio(r)) - actual))


def resolution_of(model: CatalogModel, requested: str | None) -> str:
    constraints = model.image_constraints
    tiers = constraints.resolutions or ["1K"]
    tier = requested or constraints.default_resolution or "1K"
    if tier not in tiers:
        raise invalid_request(f"resolution {tier!r} is not offered by {model.id}; "
                              f"use one of {', '.join(tiers)}", "resolution")
    return tier


@dataclass(frozen=True, slots=True)
class OutputSize:
    aspect_ratio: str
    resolution: str
    width: int
    height: int


def output_size(model: CatalogModel, aspect_ratio: str | None, resolution: str | None,
                base_width: int, base_height: int) -> OutputSize:
    """The size of an edit's output: the tier's long side, the ratio's short side, both
    multiples of the model's `widthHeightDivisor`."""
    if aspect_ratio in (None, "auto"):
        ratio_name = closest_ratio(model, base_width, base_height)
    else:
        if aspect_ratio not in supported_ratios(model):
            raise invalid_request(f"aspect_ratio {aspect_ratio!r} is not offered by "
                                  f"{model.id}; use auto or one of "
                                  f"{', '.join(supported_ratios(model))}", "aspect_ratio")
        ratio_name = aspect_ratio
    tier = resolution_of(model, resolution)
    long_side = TIER_LONG_SIDE.get(tier.upper(), 1024)
    divisor = _divisor(model, 16)
    ratio = _ratio(ratio_name)
    width, height = (long_side, long_side / ratio) if ratio >= 1 else (long_side * ratio,
                                                                         long_side)
    return OutputSize(ratio_name, tier, max(divisor, round(width / divisor) * divisor),
                      max(divisor, round(height / divisor) * divisor))


def fit_divisor(value: int, model: CatalogModel) -> int:
    """A generation dimension rounded down to the model's `widthHeightDivisor`."""
    divisor = _divisor(model, 8)
    return max(divisor, value // divisor * divisor)


def _divisor(model: CatalogModel, default: int) -> int:
    given = model.image_constraints.width_height_divisor
    return default if given is None else given


def default_output_format(resolution: str) -> str:
    """The spec's rule when `output_format` is omitted: PNG for 1K, JPEG for 2K and 4K."""
    return "png" if resolution.upper() == "1K" else "jpeg"
