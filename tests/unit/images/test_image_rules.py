"""The image endpoints' size and price rules, with their figures: the upscale factor that keeps
the output within 16,777,216 pixels, `auto` aspect ratios, resolution tiers, the default
output format, and the catalog's image prices (tiers, quality, extra inputs, enhancement)."""

from __future__ import annotations

import pytest

from serve_app.billing.pricing.images import image_cost, upscale_tier
from serve_app.errors import ApiError
from serve_app.images import sizing
from serve_app.models.catalog import CatalogModel
from serve_app.money import NANOS_PER_UNIT


def _model(**fields) -> CatalogModel:
    base = {"id": "m", "name": "M", "deployment": "image-diffusion", "engine": "e"}
    return CatalogModel.model_validate({**base, **fields})


UPSCALER = _model(type="upscale", pricing={"upscale": {"2x": {"usd": 0.02},
                                                       "4x": {"usd": 0.08}}})
EDITOR = _model(
    type="inpaint",
    pricing={"inpaint": {"usd": 0.04},
             "resolutions": {"1K": {"usd": 0.04}, "2K": {"usd": 0.06}},
             "inputImages": {"included": 1, "additional": {"usd": 0.005}},
             "quality": {"1K": {"low": {"usd": 0.03}, "high": {"usd": 0.34}}},
             "enhancePrompt": {"usd": 0.002}},
    constraints={"resolutions": ["1K", "2K"], "aspectRatios": ["auto", "1:1", "16:9", "9:16"],
                 "widthHeightDivisor": 16})


def usd(cost) -> float:
    return cost.nanos / NANOS_PER_UNIT


@pytest.mark.parametrize(("size", "requested", "expected"), [
    ((256, 256), 4, 4),          # 1024x1024 output: well within the cap
    ((1024, 1024), 4, 4),        # 4096x4096 = 16,777,216: exactly the cap
    ((1500, 1500), 4, 2.730),    # reduced: 4095x4095
    ((2048, 2048), 2, 2),        # 4096x4096 again at x2
    ((1024, 768), 3, 3),
])
def test_upscale_scale_is_reduced_to_fit_the_output_cap(size, requested, expected):
    width, height = size
    scale = sizing.effective_scale(width, height, requested)
    assert scale == pytest.approx(expected, abs=0.001)
    assert round(width * scale) * round(height * scale) <= sizing.UPSCALE_MAX_OUTPUT_PIXELS


def test_an_image_too_large_to_double_is_a_400_naming_the_limit():
    with pytest.raises(ApiError) as caught:
        sizing.effective_scale(3000, 3000, 2)
    assert caught.value.status == 400
    assert "16777216" in caught.value.message and "4194304" in caught.value.message


def test_upscale_is_priced_by_the_tier_of_the_effective_scale():
    assert upscale_tier(UPSCALER, 2) == "2x"
    assert upscale_tier(UPSCALER, 2.5) == "4x"
    assert upscale_tier(UPSCALER, 4) == "4x"
    assert usd(image_cost(UPSCALER, scale=2)) == pytest.approx(0.02)
    assert usd(image_cost(UPSCALER, scale=2.73)) == pytest.approx(0.08)


def test_edit_prices_follow_resolution_quality_extra_inputs_and_enhancement():
    assert usd(image_cost(EDITOR)) == pytest.approx(0.04)
    assert usd(image_cost(EDITOR, resolution="2K")) == pytest.approx(0.06)
    assert usd(image_cost(EDITOR, resolution="1K", quality="low")) == pytest.approx(0.03)
    three = image_cost(EDITOR, input_images=3)
    assert usd(three) == pytest.approx(0.04 + 2 * 0.005)
    assert three.units == {"image": 1, "input_images": 2}
    assert usd(image_cost(EDITOR, enhanced=True)) == pytest.approx(0.042)


@pytest.mark.parametrize(("base", "expected"), [
    ((1600, 900), "16:9"), ((900, 1600), "9:16"), ((1000, 1000), "1:1"), ((1300, 1000), "1:1"),
])
def test_auto_aspect_ratio_is_the_closest_the_model_offers(base, expected):
    assert sizing.output_size(EDITOR, "auto", None, *base).aspect_ratio == expected
    assert sizing.output_size(EDITOR, None, None, *base).aspect_ratio == expected


def test_resolution_tiers_set_the_output_size_in_multiples_of_the_divisor():
    square = sizing.output_size(EDITOR, "1:1", "1K", 500, 500)
    assert (square.width, square.height) == (1024, 1024)
    wide = sizing.output_size(EDITOR, "16:9", "2K", 500, 500)
    assert (wide.width, wide.height) == (2048, 1152)
    tall = sizing.output_size(EDITOR, "9:16", None, 500, 500)
    assert (tall.width, tall.height) == (576, 1024)


def test_unoffered_ratio_or_resolution_is_a_400_listing_the_choices():
    with pytest.raises(ApiError) as ratio:
        sizing.output_size(EDITOR, "21:9", None, 500, 500)
    assert ratio.value.status == 400 and "16:9" in ratio.value.message
    with pytest.raises(ApiError) as tier:
        sizing.output_size(EDITOR, "1:1", "4K", 500, 500)
    assert tier.value.status == 400 and "1K, 2K" in tier.value.message


def test_default_output_format_is_png_for_1k_and_jpeg_above():
    assert sizing.default_output_format("1K") == "png"
    assert sizing.default_output_format("2K") == "jpeg"
    assert sizing.default_output_format("4K") == "jpeg"
