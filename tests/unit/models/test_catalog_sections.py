"""A catalog model's `constraints` (one typed section per family) and `engine_options` (typed
settings, engine arguments passed through): a typo fails at load, and both give back the
mapping as the catalog wrote it (the public record, the replicas' specs)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serve_app.models.catalog import CatalogModel
from serve_app.models.constraints import (
    AudioConstraints,
    ImageConstraints,
    NoConstraints,
    TextConstraints,
    VideoConstraints,
)


def model(model_type: str, **fields: Any) -> CatalogModel:
    base: dict[str, Any] = {"id": "m", "type": model_type, "name": "M", "deployment": "d",
                            "engine": "fake", "pricing": {}}
    if model_type == "text":
        base["size_class"] = "XS"
    return CatalogModel.model_validate({**base, **fields})


@pytest.mark.parametrize(("model_type", "section"), [
    ("text", TextConstraints), ("image", ImageConstraints), ("inpaint", ImageConstraints),
    ("upscale", ImageConstraints), ("video", VideoConstraints), ("music", AudioConstraints),
    ("embedding", NoConstraints), ("tts", NoConstraints), ("asr", NoConstraints)])
def test_the_section_follows_the_type(model_type: str, section: type) -> None:
    assert type(model(model_type).constraints) is section
    assert model(model_type).constraints.given() == {}


@pytest.mark.parametrize(("model_type", "constraints"), [
    ("video", {"duraions": ["1s"]}),  # a typo
    ("image", {"aspect_ratios": ["1:1"]}),  # the video family's name on an image model
    ("video", {"aspectRatios": ["1:1"]}),  # and the image family's on a video model
    ("music", {"durations": ["1s"]}),
    ("tts", {"prompt_character_limit": 10}),
    ("video", {"consent": {"flow": "seedance", "version": "1"}}),  # no policy_text
    ("video", {"durations": "4s"}),  # not a list
    ("text", {"temperature": 0.2}),  # not {default: ...}
])
def test_a_constraint_the_family_does_not_know_fails_at_load(
        model_type: str, constraints: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model(model_type, constraints=constraints)


def test_constraints_are_given_back_as_written() -> None:
    written = {"resolutions": ["256p"], "durations": ["4s", "1s"], "fps": 8,
               "max_source_seconds": 12.5, "opencv": {"models": ["dis-fast"]},
               "consent": {"policy_text": "ok", "flow": "f", "version": "v"}}
    video = model("video", constraints=written)
    assert video.constraints.given() == written
    assert list(video.constraints.given()) == list(written)  # the catalog's order
    assert list(video.constraints.given()["consent"]) == ["policy_text", "flow", "version"]
    assert type(video.constraints.given()["fps"]) is int
    image = model("image", constraints={"widthHeightDivisor": 8, "steps": {"max": 4}})
    assert image.image_constraints.width_height_divisor == 8
    assert image.constraints.given() == {"widthHeightDivisor": 8, "steps": {"max": 4}}


def test_typed_reads_and_defaults() -> None:
    video = model("video", constraints={"realesrgan": {"models": ["x4"]},
                                        "opencv": {"models": ["dis-fast"]}})
    assert video.video_constraints.enhancement_models == ["x4", "dis-fast"]
    assert video.video_constraints.default_upscale_factor == 2
    assert video.video_constraints.default_aspect_ratio == "16:9"
    text = model("text", constraints={"temperature": {"default": 0.3}})
    assert text.text_constraints.default_temperature == 0.3
    assert text.text_constraints.default_top_p is None
    # another family's section: nothing given, its defaults
    assert text.video_constraints.durations == [] and text.image_constraints.steps is None
    music = model("music", constraints={"supports_speed": True, "max_speed": 4})
    assert music.audio_constraints.supports_speed and not music.audio_constraints.supports_loop


def test_engine_options_type_what_the_platform_reads() -> None:
    written = {"build": "tiny", "max_model_len": 4096, "enforce_eager": True,
               "vision": {"layout": "patches", "images": 2}, "dtype": "bfloat16"}
    options = model("text", engine_options=written).engine_options
    assert options.build == "tiny" and options.enforce_eager is True
    assert options.vision is not None and options.vision.images == 2
    assert options.engine_arguments == {"max_model_len": 4096, "dtype": "bfloat16"}
    assert options.given() == written and list(options.given()) == list(written)
    assert model("asr", engine_options={"max_seconds": 60}).engine_options.max_seconds == 60
    assert model("tts").engine_options.given() == {}


@pytest.mark.parametrize("options", [
    {"build": 3}, {"enforce_eager": "sometimes"}, {"vision": {"layuot": "tiles"}},
    {"vision": {"layout": "grid"}}, {"max_seconds": "long"}])
def test_a_typed_engine_option_of_the_wrong_shape_fails_at_load(options: dict[str, Any]
                                                                 ) -> None:
    with pytest.raises(ValidationError):
        model("text", engine_options=options)
