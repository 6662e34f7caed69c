"""The embedding deployment: sentence-transformers models, batched fairly.

Each call carries the texts of one or more requests (the gateway merges concurrent ones), with
whose texts they are; texts that arrive while the model runs are encoded together in the next
forward pass, filled least-served tenant first (deployments/fair_batches.py): one tenant's
batches of hundreds are spread over several passes, and another's single text rides in the
next one. Nothing waits for company: what queued while the previous pass ran forms the next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from ray import serve

from deployments.base import ModelDeployment
from deployments.engines.embedding import ENGINES, EmbeddingEngine, Encoded
from deployments.engines.openai_embeddings import ENGINES as UPSTREAM_ENGINES
from deployments.engines.openai_embeddings import OpenAIUpstreamEmbedder
from deployments.engines.openai_upstream import UpstreamFailed
from deployments.fair_batches import FairBatches
from deployments.fair_share import AtCapacity
from deployments.protocol import (
    MAX_INPUT_TOKENS,
    Embeddings,
    EngineError,
    Tenant,
    at_capacity,
    not_served,
)
from deployments.spec import ModelSpec, max_queue_wait_of

# A text's vector, its token count, and the ms of the forward pass that encoded it.
_Row = tuple[np.ndarray, int, float]
# Texts in one forward pass unless the catalog says otherwise (`max_batch_texts`).
DEFAULT_PASS_TEXTS = 64

logger = logging.getLogger("deployments.embedding")


@serve.deployment
class EmbeddingDeployment(ModelDeployment):
    # In process (sentence-transformers), or a server the operator runs (`engine: openai`).
    ENGINES = {**ENGINES, **UPSTREAM_ENGINES}
    engines: dict[str, EmbeddingEngine]

    def __init__(self, models: list[ModelSpec]) -> None:
        super().__init__(models)
        for model_id, engine in self.engines.items():
            if isinstance(engine, OpenAIUpstreamEmbedder):  # known from its first answer
                logger.info("embedding model %s: on a server the operator runs", model_id)
            else:
                logger.info("embedding model %s: %d dimensions", model_id, engine.dimensions)
        self.passes = _ModelPasses(models)

    async def embed(self, model_id: str, texts: list[str],
                    owners: Sequence[tuple[Tenant, int]] = ()) -> Embeddings | EngineError:
        """Unit vectors of `texts` with each input's token count (the model reads the first
        `max_seq_length`). The texts may come from several requests, which the gateway
        merges: it refuses the request of an input over its per-input limit. `owners`: whose
        texts they are, in runs (tenant, count), for the engine's fair share."""
        engine = self.engines.get(model_id)
        if engine is None:
            return not_served(model_id)
        started = time.perf_counter()
        try:
            rows = await self.passes.of(model_id, engine).encode(
                texts, owners if self.passes.fair(model_id) else ())
        except AtCapacity as full:
            return at_capacity(model_id, full.retry_after)
        except UpstreamFailed as failed:  # a server the operator runs refused or failed
            return failed.error
        vectors = np.stack([vector for vector, _, _ in rows])
        # The forward passes that carried the call (a large one is spread over several).
        engine_ms = sum({pass_ms for _, _, pass_ms in rows})
        return Embeddings(vectors, [tokens for _, tokens, _ in rows], engine.max_seq_length,
                          (time.perf_counter() - started) * 1000, engine_ms)

    def dimensions(self, model_id: str) -> int:
        return self.engines[model_id].dimensions

    async def stats(self) -> dict[str, dict[str, Any]]:
        """Per model: texts waiting, active tenants, texts a second, texts served; a model on
        a server the operator runs: that server's state too (`upstream`)."""
        stats: dict[str, dict[str, Any]] = dict(self.passes.stats())
        for model_id, engine in self.engines.items():
            if isinstance(engine, OpenAIUpstreamEmbedder):
                stats[model_id] = {**stats.get(model_id, {}), **engine.stats()}
        return stats


class _ModelPasses:
    """One `FairBatches` per model of the replica, made on its first call: each pass encodes
    up to `engine_options.max_batch_texts` texts (default 64) on a thread, so the replica
    keeps taking calls while the model runs."""

    def __init__(self, models: list[ModelSpec]) -> None:
        self._specs = {spec["id"]: spec for spec in models}
        self._passes: dict[str, FairBatches[_Row]] = {}

    def of(self, model_id: str, engine: EmbeddingEngine) -> FairBatches[_Row]:
        passes = self._passes.get(model_id)
        if passes is None:
            spec = self._specs.get(model_id)
            options = spec["engine_options"] if spec else {}

            async def run(texts: list[str]) -> list[_Row]:
                if isinstance(engine, OpenAIUpstreamEmbedder):
                    return await _encoded_upstream(engine, texts)
                return await asyncio.to_thread(_encoded_within_limit, engine, texts)

            async def measure(texts: list[str]) -> list[int]:
                if isinstance(engine, OpenAIUpstreamEmbedder):  # an estimate, no tokenizer
                    return tokens_read(engine, texts)
                return await asyncio.to_thread(tokens_read, engine, texts)

            passes = self._passes[model_id] = FairBatches(
                run, max_texts=int(options.get("max_batch_texts", DEFAULT_PASS_TEXTS)),
                max_wait_s=max_queue_wait_of(spec), measure=measure)
        return passes

    def fair(self, model_id: str) -> bool:
        """False where the catalog's `engine_options.fair_share: false` turns the order off:
        every text is then one tenant's, first come first served (to measure what the order
        costs and buys)."""
        spec = self._specs.get(model_id)
        return bool(spec["engine_options"].get("fair_share", True)) if spec else True

    def stats(self) -> dict[str, dict[str, float | int]]:
        return {model_id: passes.stats() for model_id, passes in self._passes.items()}


# A token is at least one character: a text's first this-many characters per token the model
# reads hold all it reads, so a long text's cost is counted on that much of it.
_CHARS_PER_TOKEN_COUNTED = 8


def tokens_read(engine: EmbeddingEngine, texts: list[str]) -> list[int]:
    """The tokens the model reads of each text (at most `max_seq_length`): each text's cost
    in the fair share, where a text of 256 tokens costs 256 times one of a single token."""
    limit = engine.max_seq_length
    prefix = limit * _CHARS_PER_TOKEN_COUNTED
    counts = engine.count_tokens([text[:prefix] for text in texts])
    return [max(1, min(count, limit)) for count in counts]


def _encoded_within_limit(engine: EmbeddingEngine, texts: list[str]) -> list[_Row]:
    """Each text's row of one forward pass, which skips the texts over MAX_INPUT_TOKENS: they
    are only counted (a zero vector, their token count), and the Gateway refuses their
    request. Only a text with more UTF-8 bytes than the limit (less its two special tokens)
    can hold that many tokens, so only such a text is tokenised first."""
    long = [i for i, text in enumerate(texts) if len(text.encode()) + 2 > MAX_INPUT_TOKENS]
    over = {i: count for i, count in zip(long, engine.count_tokens([texts[i] for i in long]),
                                         strict=True) if count > MAX_INPUT_TOKENS}
    kept = [text for i, text in enumerate(texts) if i not in over]
    done, engine_ms = _timed(engine, kept) if kept else (None, 0.0)
    rows: list[_Row] = []
    at = 0
    for i in range(len(texts)):
        if i in over:
            rows.append((np.zeros(engine.dimensions, dtype=np.float32), over[i], engine_ms))
        else:
            assert done is not None
            rows.append((done.vectors[at], done.tokens[at], engine_ms))
            at += 1
    return rows


async def _encoded_upstream(engine: OpenAIUpstreamEmbedder, texts: list[str]) -> list[_Row]:
    """Each text's row of one call to a server the operator runs (its time is the call's):
    the server refuses an input over its context itself."""
    started = time.perf_counter()
    done = await engine.embed(texts)
    call_ms = (time.perf_counter() - started) * 1000
    return [(vector, tokens, call_ms)
            for vector, tokens in zip(done.vectors, done.tokens, strict=True)]


def _timed(engine: EmbeddingEngine, texts: list[str]) -> tuple[Encoded, float]:
    started = time.perf_counter()
    done = engine.embed(texts)
    return done, (time.perf_counter() - started) * 1000
