"""The vision model's side of a chat's images and videos: the tiny test weights (built the same
on every run, in the layout vLLM loads), the frames read from a clip, and the conversation
the chat template renders (placeholders in the order of the multimodal data)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from deployments.engines.video import encode_mp4
from deployments.engines.vision import (
    MediaError,
    picture,
    video_frames,
    vision_conversation,
    vllm_vision_args,
)
from deployments.protocol import ChatImage, ChatVideo
from deployments.weights.registry import BUILDERS
from deployments.weights.store import WEIGHTS_LABEL


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _grey_clip(count: int = 24, fps: float = 8.0, size: tuple[int, int] = (96, 64)) -> bytes:
    """Frame i is grey level 10 * i: which frame was read shows in its mean."""
    width, height = size
    return encode_mp4([np.full((height, width, 3), 10 * i, np.uint8) for i in range(count)],
                      fps)


def test_tiny_vision_weights_are_deterministic_labelled_and_in_smolvlm_layout(tmp_path):
    from transformers import AutoProcessor

    folder = BUILDERS["tiny-smolvlm"](tmp_path / "tiny-vl")
    again = BUILDERS["tiny-smolvlm"](tmp_path / "again")

    for name in ("model.safetensors", "tokenizer.json", "config.json", "processor_config.json"):
        assert (folder / name).read_bytes() == (again / name).read_bytes(), name
    assert WEIGHTS_LABEL in (folder / "README.md").read_text()
    assert sum(f.stat().st_size for f in folder.iterdir()) < 50 * 1024 * 1024
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    processor = AutoProcessor.from_pretrained(folder)
    assert config["image_token_id"] == processor.tokenizer.convert_tokens_to_ids("<image>")
    rendered = processor.apply_chat_template(
        [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
        tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>System: Be brief.<end_of_utterance>\n"
                        "User:<image>What?<end_of_utterance>\nAssistant:")


def test_frames_are_read_evenly_over_the_clip_and_scaled_to_fit():
    clip = ChatVideo(_grey_clip(), seconds=3.0, width=96, height=64, frames=4)

    frames = video_frames(clip, side=48)

    # the middles of four 0.75 s slices: 0.375, 1.125, 1.875, 2.625 s, at 8 frames a second
    levels = [round(float(frame.mean())) for frame in frames]
    assert levels == pytest.approx([30, 90, 150, 210], abs=6)
    assert all(frame.shape == (32, 48, 3) for frame in frames)


def test_a_clip_shorter_than_probed_repeats_its_last_frame():
    clip = ChatVideo(_grey_clip(count=8), seconds=4.0, width=96, height=64, frames=4)

    frames = video_frames(clip)

    assert len(frames) == 4
    assert round(float(frames[-1].mean())) == pytest.approx(70, abs=6)
    assert np.array_equal(frames[-1], frames[-2])


def test_undecodable_media_are_the_clients_errors_with_the_spec_codes():
    with pytest.raises(MediaError) as video:
        video_frames(ChatVideo(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, 1.0, 8, 8, 2))
    assert video.value.code == "INVALID_VIDEO_FORMAT"
    truncated = _png(Image.new("RGB", (64, 64), (200, 10, 10)))[:80]
    with pytest.raises(MediaError) as image:
        picture(ChatImage(truncated, 64, 64))
    assert image.value.code == "CORRUPTED_IMAGE"


def test_a_transparent_image_reaches_the_model_in_rgb_over_white():
    image = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    image.putpixel((0, 0), (0, 0, 255, 255))

    decoded = picture(ChatImage(_png(image), 4, 4))

    assert decoded.mode == "RGB"
    assert decoded.getpixel((0, 0)) == (0, 0, 255)
    assert decoded.getpixel((3, 3)) == (255, 255, 255)


def test_the_conversation_holds_one_image_placeholder_per_image_and_frame_in_order():
    first, second = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    clip = ChatVideo(b"", seconds=2.0, width=8, height=8, frames=2)
    frames = [np.full((8, 8, 3), 10, np.uint8), np.full((8, 8, 3), 20, np.uint8)]
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image"}, {"type": "video"},
                                             {"type": "text", "text": "Compare."},
                                             {"type": "image"}]}]

    laid_out, ordered = vision_conversation(messages, [first, second], [(clip, frames)])

    assert laid_out[0]["content"] == [{"type": "text", "text": "Be brief."}]
    kinds = [part["type"] for part in laid_out[1]["content"]]
    assert kinds == ["image", "text", "text", "image", "text", "image", "text", "image"]
    labels = [part["text"] for part in laid_out[1]["content"] if part["type"] == "text"]
    assert labels[:3] == ["Video of 2.0 s, 2 frames:", "\nFrame at 0.5 s: ",
                          "\nFrame at 1.5 s: "]
    assert [np.asarray(image)[0, 0, 0] for image in ordered] == [255, 10, 20, 0]


def test_vllm_takes_every_image_and_frame_and_the_resize_the_hold_assumes():
    tiles = vllm_vision_args({"layout": "tiles", "longest_edge": 128, "tile": 64, "images": 2,
                              "videos": 1, "video_frames": 4})
    patches = vllm_vision_args({"layout": "patches", "min_pixels": 3136,
                                "max_pixels": 1003520, "images": 4, "videos": 2,
                                "video_frames": 8})

    assert tiles == {"limit_mm_per_prompt": {"image": 6},
                     "mm_processor_kwargs": {"size": {"longest_edge": 128}}}
    assert patches == {"limit_mm_per_prompt": {"image": 20},
                       "mm_processor_kwargs": {"min_pixels": 3136, "max_pixels": 1003520}}

