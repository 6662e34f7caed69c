"""The video deployments: one per engine family, `video-generation` (Wan: text, image and
reference to video) and `video-enhance` (upscaling and frame interpolation of a source clip),
each with its own autoscaling bounds and a bounded queue (configs/deployments.yaml). Their work
comes from the job worker (serve_app/jobs/worker.py), never straight from a client: a job waits
in the job table, not in a replica's queue.

The engine and the MP4 encoding run in a worker thread, so the replica keeps answering its
health checks while a clip is made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.video import ENGINES, encode_mp4
from deployments.protocol import EngineError, MediaJob, MediaResult, not_served
from deployments.spec import ModelSpec

logger = logging.getLogger("deployments.video")


@serve.deployment
class VideoDeployment(ModelDeployment):
    ENGINES = ENGINES

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        self._busy = threading.Lock()  # one clip at a time: the engines use every thread

    def _work(self, engine: Any, params: dict[str, Any], inputs: dict[str, bytes]) -> bytes:
        with self._busy:
            frames, fps = engine.run(params, inputs)
        return encode_mp4(frames, fps)

    async def generate(self, model_id: str, job: MediaJob) -> MediaResult | EngineError:
        """One video job: its params (from the quote's plan and the body) and input files by
        name; the MP4, or an EngineError."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()
        try:
            media = await asyncio.to_thread(self._work, engine, job.params, job.inputs)
        except ValueError as exc:  # an input the engine cannot use
            return EngineError(400, str(exc), code="INVALID_VIDEO_FORMAT")
        except MemoryError:
            logger.exception("video model %s ran out of memory", model_id)
            return EngineError(500, f"Model {model_id} ran out of memory making this clip",
                               code="INFERENCE_FAILED")
        return MediaResult(media, "video/mp4", (time.perf_counter() - started) * 1000)

