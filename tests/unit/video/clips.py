"""Media the video tests send: real H.264 MP4 clips and PNG pictures, built in memory."""

from __future__ import annotations

import base64
import io
from fractions import Fraction

from PIL import Image

from tests.fakes import plain_mp4


def clip(seconds: float, fps: float = 8, size: tuple[int, int] = (160, 120)) -> bytes:
    """An MP4 of `seconds` at `fps` (round(seconds x fps) frames)."""
    return plain_mp4(size[0], size[1], max(1, round(seconds * fps)), fps)


def png(size: tuple[int, int] = (256, 256), colour: tuple[int, int, int] = (135, 206, 235)
        ) -> bytes:
    """A plain picture (sky blue by default)."""
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def webm_understating_its_rate(frames: int, seconds: float, declared_fps: int = 24) -> bytes:
    """A WebM whose header declares `declared_fps` while it holds `frames` frames over
    `seconds` (each frame's timestamp says when it shows)."""
    import av
    import numpy as np

    out = io.BytesIO()
    with av.open(out, mode="w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=declared_fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 1000)
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i % 256, np.uint8),
                                               format="rgb24")
            frame.pts, frame.time_base = int(i * seconds * 1000 / frames), Fraction(1, 1000)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
