"""The embedding deployment: sentence-transformers models with Serve's dynamic batching.

Concurrent calls' texts are encoded together: every text is one call of the batched method,
and Serve gathers what has queued (up to `max_batch_size`, from any number of calls and
gateway replicas) into one `encode`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from ray import serve

from deployments.engines.embedding import ENGINES, EmbeddingEngine
from deployments.errors import engine_error
from deployments.weights import model_specs, resolve_weights

logger = logging.getLogger("deployments.embedding")


@serve.deployment(
    name="embedding",
    ray_actor_options={"num_cpus": 0.25},
    max_ongoing_requests=64,
    max_queued_requests=256,
    autoscaling_config={"min_replicas": 1, "max_replicas": 1},
)
class EmbeddingDeployment:
    def __init__(self, models: list[dict[str, Any]], settings: dict[str, Any]) -> None:
        self.engines: dict[str, EmbeddingEngine] = {}
        for model in models:
            engine_cls = ENGINES[model["engine"]]
            self.engines[model["id"]] = engine_cls(str(resolve_weights(model["weights"])),
                                                   model.get("engine_options", {}))
            logger.info("embedding model %s loaded (%d dimensions)", model["id"],
                        self.engines[model["id"]].dimensions)

    async def embed(self, model_id: str, texts: list[str]) -> dict[str, Any]:
        """Unit vectors of `texts` with each input's token count (the model reads the first
        `max_seq_length`). The texts may come from several requests, which the gateway
        merges: it refuses the request of an input over its per-input limit."""
        engine = self.engines.get(model_id)
        if engine is None:
            return engine_error(404, f"Model {model_id!r} is not served here",
                                code="MODEL_NOT_FOUND")
        started = time.perf_counter()
        counts = engine.count_tokens(texts)
        vectors = await asyncio.gather(*(self._encode((model_id, t)) for t in texts))
        return {"vectors": np.stack(vectors), "tokens": counts,
                "max_seq_length": engine.max_seq_length,
                "replica_ms": (time.perf_counter() - started) * 1000}

    # No wait for company: what queued while the previous batch ran forms the next one (the
    # gateway already sends concurrent requests together; a wait would only add latency).
    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0)
    async def _encode(self, items: list[tuple[str, str]]) -> list[np.ndarray]:
        out: list[np.ndarray | None] = [None] * len(items)
        by_model: dict[str, list[int]] = {}
        for position, (model_id, _) in enumerate(items):
            by_model.setdefault(model_id, []).append(position)
        for model_id, positions in by_model.items():
            vectors = await asyncio.to_thread(
                self.engines[model_id].embed, [items[p][1] for p in positions])
            for p, vector in zip(positions, vectors, strict=True):
                out[p] = vector
        return out  # type: ignore[return-value]

    def dimensions(self, model_id: str) -> int:
        return self.engines[model_id].dimensions


def bind(models: list, settings: dict[str, Any]):
    return EmbeddingDeployment.bind(model_specs(models, settings), settings)
