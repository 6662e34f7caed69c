"""The embedding deployment: sentence-transformers models with Serve's dynamic batching.

Each call carries the texts of one or more requests (the gateway merges concurrent ones);
calls that arrive while the model runs are encoded together in the next forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.embedding import ENGINES, EmbeddingEngine, Encoded
from deployments.protocol import Embeddings, EngineError, not_served
from deployments.spec import ModelSpec

logger = logging.getLogger("deployments.embedding")


@serve.deployment
class EmbeddingDeployment(ModelDeployment):
    ENGINES = ENGINES
    engines: dict[str, EmbeddingEngine]

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        for model_id, engine in self.engines.items():
            logger.info("embedding model %s: %d dimensions", model_id, engine.dimensions)

    async def embed(self, model_id: str, texts: list[str]) -> Embeddings | EngineError:
        """Unit vectors of `texts` with each input's token count (the model reads the first
        `max_seq_length`). The texts may come from several requests, which the gateway
        merges: it refuses the request of an input over its per-input limit."""
        if model_id not in self.engines:
            return not_served(model_id)
        started = time.perf_counter()
        (vectors, tokens), engine_ms = await self._encode((model_id, texts))
        return Embeddings(vectors, tokens, self.engines[model_id].max_seq_length,
                          (time.perf_counter() - started) * 1000, engine_ms)

    # Whole calls are batched (the gateway already puts concurrent requests in one call; calls
    # from several gateway replicas meet here), and nothing waits for company: what queued
    # while the previous forward pass ran forms the next one.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0)
    async def _encode(self, calls: list[tuple[str, list[str]]]) -> list[tuple[Encoded, float]]:
        """Each call's part of the forward pass of its model's texts, and that pass's ms."""
        out: list[tuple[Encoded, float] | None] = [None] * len(calls)
        by_model: dict[str, list[int]] = {}
        for position, (model_id, _) in enumerate(calls):
            by_model.setdefault(model_id, []).append(position)
        for model_id, positions in by_model.items():
            texts = [text for p in positions for text in calls[p][1]]
            # On a thread: the replica keeps taking calls while the model runs.
            done, engine_ms = await asyncio.to_thread(_timed, self.engines[model_id], texts)
            start = 0
            for p in positions:
                end = start + len(calls[p][1])
                out[p] = Encoded(done.vectors[start:end], done.tokens[start:end]), engine_ms
                start = end
        return out  # type: ignore[return-value]

    def dimensions(self, model_id: str) -> int:
        return self.engines[model_id].dimensions


def _timed(engine: EmbeddingEngine, texts: list[str]) -> tuple[Encoded, float]:
    started = time.perf_counter()
    done = engine.embed(texts)
    return done, (time.perf_counter() - started) * 1000
