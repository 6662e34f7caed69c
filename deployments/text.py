"""Text deployments, one per size class (text-xs, text-s, text-m, text-l): each replica holds
the engines of the catalog models assigned to its class and streams their chunks."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from deployments.engines.text import ENGINES, TextEngine
from deployments.errors import engine_error
from deployments.streaming import coalesce, merge
from deployments.weights import model_specs, prepare_weights

logger = logging.getLogger("deployments.text")

# Settings for the CPU build of vLLM (ignored by the GPU build); the configs override them.
CPU_ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    # The engine core's model worker runs in the engine core process instead of a third
    # process: one fewer vLLM import at start (~8 s on 2 cores), the same speed. Its OpenMP
    # threads are then Ray's OMP_NUM_THREADS, which follows the replica's `num_cpus` (one
    # thread for a fraction of a CPU): give the deployment more CPUs for more threads.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",
}


@serve.deployment(
    ray_actor_options={"num_cpus": 0.5, "runtime_env": {"env_vars": CPU_ENGINE_ENV}},
    max_ongoing_requests=16,
    max_queued_requests=64,
    autoscaling_config={"min_replicas": 1, "max_replicas": 1},
    request_router_config={
        "request_router_class": "deployments.routing:CacheKeyAffinityRouter"},
    health_check_period_s=10,
    graceful_shutdown_timeout_s=20,
)
class TextDeployment:
    def __init__(self, models: list[dict[str, Any]]) -> None:
        self.engines: dict[str, TextEngine] = {}
        for model in models:
            path = prepare_weights(model["weights"], model["engine_options"])
            options = {k: v for k, v in model["engine_options"].items() if k != "build"}
            self.engines[model["id"]] = ENGINES[model["engine"]](str(path), options)
            logger.info("text model %s loaded from %s", model["id"], path)

    async def generate(self, model_id: str, request: dict[str, Any]
                       ) -> AsyncIterator[dict[str, Any]]:
        engine = self.engines.get(model_id)
        if engine is None:
            yield _not_served(model_id)
            return
        # Lists of chunks: what a fast engine produced since the last list travels together.
        async for chunks in coalesce(engine.generate(request)):
            yield chunks

    async def complete(self, model_id: str, request: dict[str, Any]) -> list[dict[str, Any]]:
        """The whole answer in one reply, for a unary request: one message back instead of a
        stream's pieces and its end, and no wait between pieces."""
        engine = self.engines.get(model_id)
        if engine is None:
            return [_not_served(model_id)]
        return merge([chunk async for chunk in engine.generate(request)])

    async def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: requests in progress, and tokens of requests cancelled mid-stream."""
        return {model_id: engine.stats() for model_id, engine in self.engines.items()}

    def __del__(self) -> None:
        for engine in getattr(self, "engines", {}).values():
            with contextlib.suppress(Exception):  # shutting down: nothing left to tell
                engine.shutdown()


def _not_served(model_id: str) -> dict[str, Any]:
    return engine_error(404, f"Model {model_id!r} is not served here", code="MODEL_NOT_FOUND")


def bind(name: str, models: list, settings: dict[str, Any]):
    return TextDeployment.options(name=name).bind(model_specs(models, settings))
