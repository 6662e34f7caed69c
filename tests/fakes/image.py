"""The image family in process: the real `ImageDeployment` (deployments/image.py), its decoding,
its one-at-a-time gate and its encoding in the asked format, with a fake engine behind it.

The fake engine makes plain pictures: the input scaled by `params["scale"]` (upscale), the
input's size with an alpha channel (no prompt: background removal), or `params` width x
height (edits and generation), `variants` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PIL import Image

from deployments.engines.image_io import ImageDecodeError
from deployments.engines.stop import StopSignal
from deployments.image import ImageDeployment
from deployments.protocol import EngineError
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of


def raised_for(report: EngineError) -> Exception:
    """What an image or video engine raises for the deployment to report `report`: out of
    memory for a 503, a parameter it cannot honour for a plain 400, an input it cannot read
    for a 400 with its code and field."""
    if report.status == 503:
        return MemoryError(report.message)
    if report.code is None and report.field is None:
        return ValueError(report.message)
    return ImageDecodeError(report.message, report.field or "image", report.status,
                            report.code or "CORRUPTED_IMAGE")


class FakeImageEngine(FakeEngine):
    """An image engine (deployments/engines/image.py `ImageEngine`); a failure set on it is
    raised by `run` (`raised_for` a reported one)."""

    COLOUR = (40, 120, 200)
    blurred = False

    def _output_size(self, inputs: list[Image.Image], params: dict[str, Any]
                     ) -> tuple[int, int]:
        if "scale" in params and inputs:
            w, h = inputs[0].size
            return round(w * params["scale"]), round(h * params["scale"])
        if params.get("width") and params.get("height"):
            return int(params["width"]), int(params["height"])
        if inputs:
            return inputs[0].size
        return 64, 64

    def run(self, images: list[Image.Image], params: dict[str, Any],
            stop: StopSignal | None = None) -> list[Image.Image]:
        if isinstance(self.failure, EngineError):
            raise raised_for(self.failure)
        if self.failure is not None:
            raise self.failure
        width, height = self._output_size(images, params)
        mode = "RGBA" if images and "prompt" not in params and "scale" not in params else "RGB"
        colour = (*self.COLOUR, 255) if mode == "RGBA" else self.COLOUR
        made = []
        for _ in range(int(params.get("variants") or 1)):
            image = Image.new(mode, (width, height), colour)
            image.info["blurred"] = self.blurred
            made.append(image)
        return made


class FakeImageDeployment(ServedDeployment):
    """An image-* deployment: the real `ImageDeployment`, its models on `FakeImageEngine`s
    (`blurred`: as if safe mode blurred every picture)."""

    METHODS = ("run",)
    DEPLOYMENT = class_of(ImageDeployment)
    ENGINE = FakeImageEngine

    def __init__(self, deployment_name: str = "image-upscale",
                 models: Sequence[str | ModelOptions] = ("upscaler",), *,
                 blurred: bool = False) -> None:
        super().__init__(deployment_name, models)
        for engine in self.engines.values():
            engine.blurred = blurred
