"""The embedding deployment: sentence-transformers models with Serve's dynamic batching.

Concurrent requests' texts are encoded together: every text is one call of the batched
method, and Serve gathers up to `max_batch_size` of them (from any number of requests) into
one `encode`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
from ray import serve

from deployments.engines.embedding import ENGINES, EmbeddingEngine
from deployments.errors import engine_error
from deployments.weights import resolve_weights

logger = logging.getLogger("deployments.embedding")

MAX_INPUT_TOKENS = 8192


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
            self.engines[model["id"]] = engine_cls(str(resolve_weights(model["weights"])))
            logger.info("embedding model %s loaded (%d dimensions)", model["id"],
                        self.engines[model["id"]].dimensions)

    async def embed(self, model_id: str, texts: list[str]) -> dict[str, Any]:
        engine = self.engines.get(model_id)
        if engine is None:
            return engine_error(404, f"Model {model_id!r} is not served here",
                                code="MODEL_NOT_FOUND")
        counts = engine.count_tokens(texts)
        for index, count in enumerate(counts):
            if count > MAX_INPUT_TOKENS:
                return engine_error(400, f"input[{index}] has {count} tokens; the limit is "
                                         f"{MAX_INPUT_TOKENS} per input", field="input")
        vectors = await asyncio.gather(*(self._encode((model_id, t)) for t in texts))
        # The model reads at most max_seq_length tokens of each input: that is what it used.
        used = sum(min(c, engine.max_seq_length) for c in counts)
        return {"vectors": np.stack(vectors), "prompt_tokens": used}

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
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
    from pathlib import Path

    data_dir = Path(settings["data_dir"])
    specs = [{"id": m.id, "engine": m.engine, "weights": m.weights_spec(data_dir)}
             for m in models]
    return EmbeddingDeployment.bind(specs, settings)
