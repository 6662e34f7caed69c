"""The video family in process: the real `VideoDeployment` (deployments/video.py) and its MP4
encoding, with a fake engine behind it that makes plain frames of the job's size and length
(its params' width, height, seconds, fps), kept small: at most `MAX_SIDE` pixels a side and
`MAX_FRAMES` frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from deployments.engines.video import encode_mp4
from deployments.protocol import EngineError, MediaResult
from deployments.video import VideoDeployment
from tests.fakes.image import raised_for
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of

MAX_SIDE = 64
MAX_FRAMES = 8


def plain_frames(width: int, height: int, frames: int) -> list[np.ndarray]:
    """`frames` plain RGB frames, each a shade lighter, their sides made even."""
    width, height = max(2, width - width % 2), max(2, height - height % 2)
    return [np.full((height, width, 3), (i * 16) % 256, dtype=np.uint8) for i in range(frames)]


def plain_mp4(width: int, height: int, frames: int, fps: float) -> bytes:
    """A real H.264 MP4 of `frames` plain frames (sides made even), as the deployment
    encodes one."""
    return encode_mp4(plain_frames(width, height, frames), fps)


class FakeVideoEngine(FakeEngine):
    """A video engine (deployments/engines/video.py); a failure set on it is raised by `run`
    (`raised_for` a reported one)."""

    def run(self, params: dict[str, Any], inputs: dict[str, bytes]
            ) -> tuple[list[np.ndarray], float]:
        if isinstance(self.failure, EngineError):
            raise raised_for(self.failure)
        if self.failure is not None:
            raise self.failure
        width, height = int(params.get("width") or 64), int(params.get("height") or 64)
        shrink = max(1.0, max(width, height) / MAX_SIDE)
        fps = float(params.get("fps") or 8)
        frames = max(1, min(MAX_FRAMES, round(float(params.get("seconds") or 1) * fps)))
        return plain_frames(round(width / shrink), round(height / shrink), frames), fps


class FakeVideoDeployment(ServedDeployment):
    """A video-* deployment: the real `VideoDeployment`, its models on `FakeVideoEngine`s;
    `made`: the MP4s it answered, in order."""

    METHODS = ("generate",)
    DEPLOYMENT = class_of(VideoDeployment)
    ENGINE = FakeVideoEngine

    def __init__(self, deployment_name: str = "video-generation",
                 models: Sequence[str | ModelOptions] = ("video",)) -> None:
        super().__init__(deployment_name, models)
        self.made: list[bytes] = []

    def _answered(self, name: str, args: tuple[Any, ...], result: Any) -> Any:
        if isinstance(result, MediaResult):
            self.made.append(result.media)
        return result
