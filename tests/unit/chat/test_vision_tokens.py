"""The hold's estimate of an image's tokens, from its pixels, against what the models'
processors make of it: Qwen2-VL's (patches) and the tiny SmolVLM test weights' (Idefics3
tiles). The estimate is never below, and at most a few tokens above."""

from __future__ import annotations

import pytest
import yaml
from PIL import Image

from deployments.weights.registry import BUILDERS
from serve_app.chat.vision import VisionSpec

SIZES = [(120, 90), (90, 120), (64, 64), (10, 300), (300, 10), (1000, 999), (65, 64),
         (128, 63), (20, 20), (4000, 3000)]


@pytest.fixture(scope="module")
def tiny_processor(tmp_path_factory):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(BUILDERS["tiny-smolvlm"](
        tmp_path_factory.mktemp("weights") / "tiny-vl"))


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_qwen2_vl_patches(width, height):
    from transformers import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 256)
    spec = VisionSpec(layout="patches", min_pixels=56 * 56, max_pixels=28 * 28 * 256)

    grid = processor(images=[Image.new("RGB", (width, height))])["image_grid_thw"][0]
    made = int(grid.prod()) // 4 + 2  # a token per 2x2 patches, and the two around them

    assert made <= spec.image_tokens(width, height) <= made + 4
    assert spec.image_tokens(width, height) <= spec.most_image_tokens()


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_idefics3_tiles_of_the_test_weights(tiny_processor, width, height):
    spec = VisionSpec(layout="tiles", longest_edge=128, tile=64, tile_tokens=4)

    made = len(tiny_processor(text=["<image>"],
                              images=[[Image.new("RGB", (width, height))]])["input_ids"][0])

    assert made <= spec.image_tokens(width, height) <= made + 4
    assert spec.image_tokens(width, height) <= spec.most_image_tokens()


def test_a_video_counts_its_frames_scaled_to_fit():
    spec = VisionSpec(layout="patches", max_pixels=28 * 28 * 1280, frame_side=448,
                      video_frames=8)

    assert spec.frames_for(0.2) == 1 and spec.frames_for(3.5) == 4 and spec.frames_for(90) == 8
    assert spec.frame_size(1920, 1080) == (448, 252)
    one = spec.video_tokens(1920, 1080, 1)
    assert spec.video_tokens(1920, 1080, 8) - one == 7 * (one - 16)
    assert spec.video_tokens(1920, 1080, 8) <= spec.most_video_tokens()


def test_the_production_catalog_adds_a_real_vision_model_to_the_common_one():
    from serve_app.models.catalog import load_catalog
    from serve_app.settings import PROJECT_ROOT

    configs = PROJECT_ROOT / "configs"
    default = load_catalog(configs / "models.common.yaml")
    production = load_catalog(configs / "models.production.yaml")

    assert [m for m in production.models if m.id in default.by_id] == default.models
    assert production.traits == default.traits
    vision = production.by_id["qwen2.5-vl-7b-instruct"]
    assert vision.weights.endswith("/Qwen2.5-VL-7B-Instruct")
    assert vision.capabilities["supportsVision"] and vision.capabilities["supportsVideoInput"]
    spec = VisionSpec.of(vision)
    assert spec.layout == "patches" and spec.most_image_tokens() == 1280 + 2
    # a request at every bound still fits the model's context
    assert spec.images * spec.most_image_tokens() + spec.videos * spec.most_video_tokens() \
        < vision.context_length
    served = yaml.safe_load((configs / "production.yaml").read_text())
    (app,) = served["applications"]
    gpus = {d["name"]: d["ray_actor_options"].get("num_gpus") for d in app["deployments"]
            if "ray_actor_options" in d}
    assert vision.deployment in app["args"]["model_deployments"] and gpus[vision.deployment]


def test_a_catalog_includes_another_and_replaces_or_adds_models(tmp_path):
    from serve_app.models.catalog import load_catalog

    model = {"type": "text", "deployment": "text-xs", "engine": "vllm", "size_class": "XS",
             "pricing": {"input": {"usd": 1, "diem": 1}}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "models": [{**model, "id": "a", "name": "A"}, {**model, "id": "b", "name": "B"}],
        "traits": {"text": {"default": "a"}}, "service_system_prompt": "base"}))
    (tmp_path / "top.yaml").write_text(yaml.safe_dump({
        "include": ["base.yaml"],
        "models": [{**model, "id": "b", "name": "B again"}, {**model, "id": "c", "name": "C"}],
        "traits": {"text": {"fastest": "c"}}}))

    catalog = load_catalog(tmp_path / "top.yaml")

    assert [(m.id, m.name) for m in catalog.models] == [("a", "A"), ("b", "B again"),
                                                        ("c", "C")]
    assert catalog.traits == {"text": {"default": "a", "fastest": "c"}}
    assert catalog.service_system_prompt == "base"
