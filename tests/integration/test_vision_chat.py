"""Image and video chat on vLLM through the real Serve app and the `openai` SDK: tiny-vl (test
weights: a tiny random SmolVLM, tests/integration/catalog.yaml) reads an image sent as a data
URL and a short MP4 as its frames; vLLM counts their tokens in the prompt and the usage
history bills them at tiny-vl's input price (0.02 USD per million tokens, output 0.04). A text
model refuses the same image."""

from __future__ import annotations

import base64
import io
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from deployments.engines.video import encode_mp4
from serve_app.chat.vision import VisionSpec

pytestmark = pytest.mark.integration

MODEL = "tiny-vl"
NANOS_PER_TOKEN = {"input": 20, "output": 40}
# tests/integration/catalog.yaml's tiny-vl
SPEC = VisionSpec(layout="tiles", longest_edge=128, tile=64, tile_tokens=4, images=2,
                  videos=1, video_frames=4, video_seconds=30, frame_side=128)


def _data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def _picture() -> bytes:
    out = io.BytesIO()
    pixels = (np.random.default_rng(7).random((90, 120, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _clip() -> bytes:
    """Three seconds at 8 frames a second: tiny-vl reads 3 frames (one a second)."""
    return encode_mp4([np.full((64, 96, 3), 25 * (i % 8), np.uint8) for i in range(24)], 8.0)


def test_an_image_and_a_video_reach_the_vision_model_and_their_tokens_are_billed(client,
                                                                                  platform):
    question = {"type": "text", "text": "What is in the picture and the clip?"}
    # the history lists the oldest lines first: read from this test's start on
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()

    text_only = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [question]}], max_tokens=4,
        temperature=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, temperature=0, messages=[{"role": "user", "content": [
            question,
            {"type": "image_url", "image_url": {"url": _data_url(_picture(), "image/png")}},
            {"type": "video_url", "video_url": {"url": _data_url(_clip(), "video/mp4")}}]}])
    reply, request_id = raw.parse(), raw.headers["cf-ray"]

    assert reply.model == MODEL and reply.choices[0].message.content is not None
    usage = reply.usage
    # vLLM counted each image's tiles (and the three frames as images) in the prompt: at
    # least the tile tokens of four pictures beyond the text, at most the hold's estimate
    media = usage.prompt_tokens - text_only.usage.prompt_tokens
    assert 4 * (SPEC.tile_tokens + 2) < media
    assert media <= SPEC.image_tokens(120, 90) + SPEC.video_tokens(96, 64, 3)
    history = httpx.get(f"{platform.base_url}/billing/usage-history",
                        params={"startTimestamp": since}, headers=platform.auth()).json()["data"]
    units: dict[str, int] = {}
    charged = 0.0  # USD
    for line in history:
        if (line["inferenceDetails"] or {}).get("requestId") != request_id:
            continue
        kind = line["sku"].removeprefix(f"{MODEL}-llm-").removesuffix("-mtoken")
        units[kind] = round(line["units"] * 1_000_000)
        charged -= line["amount"]
    assert units == {"input": usage.prompt_tokens, "output": usage.completion_tokens}
    assert round(charged * 1e9) == sum(units[kind] * NANOS_PER_TOKEN[kind] for kind in units)


def test_a_text_model_refuses_an_image(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="tiny-chat", max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": _data_url(_picture(),
                                                                     "image/png")}}]}])

    assert refused.value.response.json()["code"] == "INVALID_MODEL"
