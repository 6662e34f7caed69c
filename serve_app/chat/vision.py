"""What a vision model takes (its catalog `engine_options.vision`, which the vLLM engine reads
too: deployments/engines/vision.py) and the most tokens an image or a video can become on it,
from the pixels, for the hold. vLLM counts the real tokens; the charge follows them.

Two layouts of the model's processor:

- `patches` (Qwen2-VL, Qwen2.5-VL): the image is resized (`smart_resize`) to multiples of
  `patch` pixels (14 x a 2x2 merge = 28) with its area between `min_pixels` and
  `max_pixels`; one token per patch, and two around the image.
- `tiles` (Idefics3, SmolVLM): the image is resized to `longest_edge` on its long side and cut
  into `tile`-pixel tiles, each `tile_tokens` tokens plus a global view of the whole; a tile
  and the global view carry two marker tokens each, and each row ends in a newline.

A video reaches the model as `frames` images read evenly over the clip (at most
`video_frames`, one a second), each scaled to fit `frame_side` and introduced by a short text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from serve_app.models.catalog import CatalogModel

# Tokens of the text the engine puts before a video and before each of its frames ("Video of
# 12.0 s, 8 frames:", "Frame at 1.5 s: "), generously: tokenizers differ.
VIDEO_TEXT_TOKENS = 16
FRAME_TEXT_TOKENS = 12


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """A vision model's bounds and its processor's layout (defaults: Qwen2-VL's processor,
    four images and one video of eight frames a request)."""

    layout: str = "patches"
    images: int = 4  # image parts a request may hold
    videos: int = 1  # video parts a request may hold
    video_frames: int = 8  # the most frames read from a video
    video_seconds: float = 60.0  # the longest video accepted
    frame_side: int = 448  # frames are scaled down to fit this side
    patch: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    longest_edge: int = 4 * 364
    tile: int = 364
    tile_tokens: int = 169

    @classmethod
    def of(cls, model: CatalogModel) -> VisionSpec:
        vision = model.engine_options.vision
        given: dict[str, Any] = vision.given() if vision else {}
        known = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in given.items():
            if name in known:
                values[name] = value if name == "layout" else (
                    float(value) if name == "video_seconds" else int(value))
        return cls(**values)

    # ---- images ----------------------------------------------------------------------

    def image_tokens(self, width: int, height: int) -> int:
        """The most tokens an image of this size becomes."""
        if self.layout == "tiles":
            return self._tile_tokens(width, height)
        resized_h, resized_w = smart_resize(height, width, self.patch, self.min_pixels,
                                            self.max_pixels)
        return (resized_h // self.patch) * (resized_w // self.patch) + 2

    def most_image_tokens(self) -> int:
        """The most tokens any image becomes (an image not yet fetched)."""
        if self.layout == "tiles":
            return self._tile_tokens(1, 1)  # a square: the most tiles
        return self.max_pixels // (self.patch * self.patch) + 2

    def _tile_tokens(self, width: int, height: int) -> int:
        long_side, short_side = max(width, height), max(1, min(width, height))
        resized_short = min(self.longest_edge,
                            math.floor(self.longest_edge * short_side / long_side) + 1)
        across = math.ceil(self.longest_edge / self.tile)
        down = math.ceil(resized_short / self.tile)
        if across * down == 1:
            return self.tile_tokens + 3
        return (across * down + 1) * (self.tile_tokens + 2) + max(across, down) + 2

    # ---- videos ----------------------------------------------------------------------

    def frames_for(self, seconds: float) -> int:
        """Frames read from a clip: one a second, at most `video_frames`, at least one."""
        return max(1, min(self.video_frames, math.ceil(seconds)))

    def frame_size(self, width: int, height: int) -> tuple[int, int]:
        scale = min(1.0, self.frame_side / max(width, height, 1))
        return max(1, round(width * scale)), max(1, round(height * scale))

    def video_tokens(self, width: int, height: int, frames: int) -> int:
        """The most tokens a video of this size becomes as `frames` frames."""
        per_frame = self.image_tokens(*self.frame_size(width, height)) + FRAME_TEXT_TOKENS
        return VIDEO_TEXT_TOKENS + frames * per_frame

    def most_video_tokens(self) -> int:
        """The most tokens any video becomes (one not yet fetched)."""
        square = self.frame_side
        return max(self.video_tokens(square, square, self.video_frames),
                   VIDEO_TEXT_TOKENS + self.video_frames * (self.most_image_tokens()
                                                            + FRAME_TEXT_TOKENS))


def smart_resize(height: int, width: int, factor: int, min_pixels: int,
                 max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize: sides rounded to multiples of `factor`, the area brought within
    `min_pixels`..`max_pixels` keeping the aspect ratio (transformers' `smart_resize`)."""
    resized_h = max(factor, round(height / factor) * factor)
    resized_w = max(factor, round(width / factor) * factor)
    if resized_h * resized_w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        resized_h = max(factor, math.floor(height / beta / factor) * factor)
        resized_w = max(factor, math.floor(width / beta / factor) * factor)
    elif resized_h * resized_w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        resized_h = math.ceil(height * beta / factor) * factor
        resized_w = math.ceil(width * beta / factor) * factor
    return resized_h, resized_w
