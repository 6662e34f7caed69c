"""Images and videos of a chat made ready for a vision-language model on vLLM: each image
decoded upright in RGB, each video read as a few frames spread evenly over the clip (PyAV, as
the video routes read clips), and the conversation laid out for the model's own chat template,
with the multimodal data in the order of its placeholders.

A video reaches the model as its frames, each an image after a short text naming its time:
every vision model takes images (vLLM's video inputs need torchvision, which its CPU build
lacks), and the Gateway sizes the hold from the same layout.

The Gateway checked every input before sending it (images from their header: format, mode,
pixels; videos probed: container, length, size, rate); what only decoding finds (truncated or
corrupt data) is a `MediaError`, reported to the client as a 400.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from deployments.engines.image_io import ImageDecodeError, decode_image
from deployments.protocol import ChatImage, ChatVideo, Message

# Frames are scaled down to fit this side before the model's processor sees them (the
# catalog's `vision.frame_side` may change it; the Gateway's hold uses the same number).
DEFAULT_FRAME_SIDE = 448
_FIELD = "messages"


class MediaError(ValueError):
    """An image or video that cannot be decoded: the client's 400, with the spec's code."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self), self.code)


def picture(image: ChatImage) -> Image.Image:
    """The image decoded upright, in RGB (transparent pixels over white)."""
    try:
        decoded = decode_image(image.data, _FIELD)
    except ImageDecodeError as exc:
        raise MediaError(f"an image part could not be decoded: {exc}", exc.code) from exc
    if decoded.mode == "RGB":
        return decoded
    background = Image.new("RGB", decoded.size, (255, 255, 255))
    background.paste(decoded, mask=decoded.getchannel("A"))
    return background


def frame_times(seconds: float, count: int) -> list[float]:
    """The middles of `count` equal slices of the clip: where its frames are read."""
    return [seconds * (index + 0.5) / count for index in range(count)]


def _fitted(frame: Any, side: int) -> np.ndarray:
    image = frame.to_image()
    if max(image.size) > side:
        image.thumbnail((side, side), Image.Resampling.BICUBIC)
    return np.asarray(image.convert("RGB"))


def video_frames(video: ChatVideo, side: int = DEFAULT_FRAME_SIDE) -> list[np.ndarray]:
    """`video.frames` frames (HxWx3 uint8 RGB, at most `side` pixels a side) spread evenly over
    the clip, decoded in order; only the frames picked are kept. A clip shorter than probed
    repeats its last frame."""
    import av

    wanted = frame_times(video.seconds, video.frames)
    picked: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(video.data), mode="r") as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            rate = float(stream.average_rate or 24)
            start = last = None
            for index, frame in enumerate(container.decode(stream)):
                at = frame.time if frame.time is not None else index / rate
                start = at if start is None else start
                last = frame
                while wanted and at - start >= wanted[0] - 1e-6:
                    picked.append(_fitted(frame, side))
                    wanted.pop(0)
                if not wanted:
                    break
            if wanted and last is not None:
                tail = _fitted(last, side)
                picked.extend(tail for _ in wanted)
    except (av.FFmpegError, ValueError, OSError, IndexError) as exc:
        raise MediaError("a video part could not be decoded", "INVALID_VIDEO_FORMAT") from exc
    if not picked:
        raise MediaError("a video part has no frames", "INVALID_VIDEO_FORMAT")
    return picked


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content or ""}]


def vision_conversation(messages: list[Message], images: list[Image.Image],
                        videos: list[tuple[ChatVideo, list[np.ndarray]]],
                        ) -> tuple[list[Message], list[Image.Image]]:
    """The conversation as the chat template reads it (every content a list of parts, as
    vLLM gives templates) with each video part replaced by its frames, and the images in the
    order of their `{"type": "image"}` placeholders."""
    pending_images = iter(images)
    pending_videos = iter(videos)
    ordered: list[Image.Image] = []
    laid_out: list[Message] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        for part in _parts(message.get("content")):
            kind = part.get("type")
            if kind == "image":
                ordered.append(next(pending_images))
                parts.append({"type": "image"})
            elif kind == "video":
                video, frames = next(pending_videos)
                times = frame_times(video.seconds, len(frames))
                parts.append({"type": "text",
                              "text": f"Video of {video.seconds:.1f} s, {len(frames)} frames:"})
                for at, frame in zip(times, frames, strict=True):
                    parts.append({"type": "text", "text": f"\nFrame at {at:.1f} s: "})
                    parts.append({"type": "image"})
                    ordered.append(Image.fromarray(frame))
            else:
                parts.append(part)
        laid_out.append({**message, "content": parts})
    return laid_out, ordered


def decoded_media(images: tuple[ChatImage, ...], videos: tuple[ChatVideo, ...],
                  frame_side: int = DEFAULT_FRAME_SIDE,
                  ) -> tuple[list[Image.Image], list[tuple[ChatVideo, list[np.ndarray]]]]:
    """Every image and every video's frames, decoded (CPU-bound: run it in a thread)."""
    return ([picture(image) for image in images],
            [(video, video_frames(video, frame_side)) for video in videos])


def vllm_vision_args(vision: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine arguments for a vision model's catalog `vision` block: how many images a
    prompt may hold (its images and every video's frames), and the resize its processor
    applies (the numbers the Gateway sizes the hold with).

    `layout: patches` (Qwen2-VL, Qwen2.5-VL): resized within `min_pixels`..`max_pixels`;
    `layout: tiles` (Idefics3, SmolVLM): resized to `longest_edge`, then cut into tiles.
    """
    images = int(vision.get("images", 4)) + int(vision.get("videos", 1)) * int(
        vision.get("video_frames", 8))
    processor: dict[str, Any] = {}
    if vision.get("layout") == "patches":
        processor = {key: int(vision[key]) for key in ("min_pixels", "max_pixels")
                     if key in vision}
    elif vision.get("layout") == "tiles" and "longest_edge" in vision:
        processor = {"size": {"longest_edge": int(vision["longest_edge"])}}
    return {"limit_mm_per_prompt": {"image": images},
            **({"mm_processor_kwargs": processor} if processor else {})}
