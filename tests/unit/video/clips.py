"""Media the video tests send: real H.264 MP4 clips and PNG pictures, built in memory."""

from __future__ import annotations

import base64
import io

from PIL import Image

from tests.fakes.deployments import encode_mp4


def clip(seconds: float, fps: float = 8, size: tuple[int, int] = (160, 120)) -> bytes:
    """An MP4 of `seconds` at `fps` (round(seconds x fps) frames)."""
    return encode_mp4(size[0], size[1], max(1, round(seconds * fps)), fps)


def png(size: tuple[int, int] = (256, 256), colour: tuple[int, int, int] = (135, 206, 235)
        ) -> bytes:
    """A plain picture (sky blue by default)."""
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"
