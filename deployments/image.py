"""The image deployments: one Serve deployment per engine family (image-upscale: Real-ESRGAN,
image-matting: background removal, image-diffusion: diffusers edit and generation), each
with its own autoscaling bounds and a bounded queue (configs/deployments.yaml).

The gateway checks every input from its header and sends the bytes; decoding, the engine and
encoding all run here, in a worker thread, so neither the gateway's event loop nor this
replica's stops answering while a picture is computed. One picture at a time per replica:
the waiting requests are served least-served account first (engine seconds), and one that
would wait past MAX_QUEUE_WAIT_S, or find Serve's queue (`max_queued_requests`) full, is
answered 503 `MODEL_AT_CAPACITY` (deployments/fair_share.py). A call cancelled on the way (its
client left) stops at the engine's next check (between diffusion steps, before a one-pass
upscale or matting), its turn held until the engine is free (engines/stop.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.image import ENGINES
from deployments.engines.image_io import ImageDecodeError, decode_image, encode_image
from deployments.engines.stop import Stopped, StopSignal, check, until_stopped
from deployments.fair_share import AtCapacity, one_at_a_time, timed_turn
from deployments.protocol import EngineError, ImageRequest, ImageResult, at_capacity, not_served
from deployments.spec import ModelSpec

logger = logging.getLogger("deployments.image")


@serve.deployment
class ImageDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        # One picture at a time per replica: the engines use every thread they are given. The
        # gate orders the waiting requests; the lock also holds off a thread still finishing
        # for a client that left.
        self.gate = one_at_a_time(models)
        self._busy = threading.Lock()
        self.stopped_early = 0  # pictures stopped because their call was cancelled

    def _work(self, engine: Any, request: ImageRequest,
              stop: StopSignal) -> tuple[list[bytes], int, int, bool]:
        fields = request.fields or ["image"] * len(request.images)
        decoded = [decode_image(data, field)
                   for data, field in zip(request.images, fields, strict=True)]
        with self._busy:
            try:
                check(stop)
                outputs = engine.run(decoded, dict(request.params), stop=stop)
            except Stopped:
                self.stopped_early += 1
                raise
        return ([encode_image(image, request.format) for image in outputs], outputs[0].width,
                outputs[0].height, any(image.info.get("blurred") for image in outputs))

    async def run(self, model_id: str, request: ImageRequest) -> ImageResult | EngineError:
        """Decode the request's images, run the model's engine with its params, encode each
        output in its format (png, jpeg, webp). A bad input is reported as an EngineError (a
        400 for the client)."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()
        try:
            async with timed_turn(self.gate, request.tenant, model_id):
                images, width, height, blurred = await until_stopped(
                    lambda stop: self._work(engine, request, stop))
        except AtCapacity as full:
            return at_capacity(model_id, full.retry_after)
        except ImageDecodeError as exc:
            return EngineError(exc.status, str(exc), code=exc.code, field=exc.field)
        except ValueError as exc:  # a parameter the engine cannot honour
            return EngineError(400, str(exc))
        except MemoryError:
            logger.exception("image model %s ran out of memory", model_id)
            return EngineError(503, f"Model {model_id} is at capacity; try again later",
                               code="MODEL_AT_CAPACITY")
        return ImageResult(images, width, height, blurred,
                           (time.perf_counter() - started) * 1000)
