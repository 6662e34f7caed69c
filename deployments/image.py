"""The image deployments: one Serve deployment per engine family (image-upscale: Real-ESRGAN,
image-matting: background removal, image-diffusion: diffusers edit and generation), each
with its own autoscaling bounds and a bounded queue (configs/deployments.yaml).

The gateway checks every input from its header and sends the bytes; decoding, the engine and
encoding all run here, in a worker thread, so neither the gateway's event loop nor this
replica's stops answering while a picture is computed. A full queue refuses (Serve's
`max_queued_requests`), which the gateway answers as 503 `MODEL_AT_CAPACITY`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ray import serve

from deployments.base import ModelDeployment, not_served
from deployments.engines.image import ENGINES
from deployments.engines.image_io import ImageDecodeError, decode_image, encode_image
from deployments.errors import engine_error
from deployments.spec import ModelSpec

logger = logging.getLogger("deployments.image")


@serve.deployment
class ImageDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        # One picture at a time per replica: the engines use every thread they are given.
        self._busy = threading.Lock()

    def _work(self, engine: Any, images: list[bytes], params: dict[str, Any],
              fmt: str) -> dict[str, Any]:
        fields = params.pop("_fields", None) or ["image"] * len(images)
        decoded = [decode_image(data, field) for data, field in zip(images, fields, strict=True)]
        with self._busy:
            outputs = engine.run(decoded, params)
        return {
            "images": [encode_image(image, fmt) for image in outputs],
            "width": outputs[0].width,
            "height": outputs[0].height,
            "blurred": any(image.info.get("blurred") for image in outputs),
        }

    async def run(self, model_id: str, images: list[bytes], params: dict[str, Any],
                  fmt: str) -> dict[str, Any]:
        """Decode `images`, run the model's engine with `params`, encode each output as
        `fmt` (png, jpeg, webp). A bad input is reported as data (a 400 for the client)."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()
        try:
            out = await asyncio.to_thread(self._work, engine, images, dict(params), fmt)
        except ImageDecodeError as exc:
            return engine_error(exc.status, str(exc), code=exc.code, field=exc.field)
        except ValueError as exc:  # a parameter the engine cannot honour
            return engine_error(400, str(exc))
        except MemoryError:
            logger.exception("image model %s ran out of memory", model_id)
            return engine_error(503, f"Model {model_id} is at capacity; try again later",
                                code="MODEL_AT_CAPACITY")
        out["replica_ms"] = (time.perf_counter() - started) * 1000
        return out
