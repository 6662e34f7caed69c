"""An embedding engine that is a server the operator already runs (`engine: openai` on an
embedding model): `POST /embeddings` of the chat-completion convention, over the same pooled
client, health and error mapping as the text engine (deployments/engines/openai_upstream.py).

The embedding deployment runs it as it runs an engine in process (deployments/embedding.py):
one call to the server at a time per replica, the texts that arrived meanwhile (up to
`max_batch_texts`) in the next, filled least-served tenant first. Its refusals are the text
engine's: a 429 or 503 is a 503 with Retry-After, a 400 or 422 a 400 with the server's
message (a call merges several requests: all of them get it), anything else a 500; a server
that fails `failures_to_offline` calls in a row is offline until a probe of `/models` answers.

Billing is the server's usage. The convention reports one figure for a call (`prompt_tokens`),
not one per input, and a call may carry the texts of several requests: the figure is shared
among the inputs in proportion to their length (largest remainders, so the shares add up to
the report exactly), and a server that reports nothing is billed the estimate (about four
bytes a token), with a log line.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import httpx
import numpy as np

from deployments.engines.embedding import Encoded
from deployments.engines.openai_upstream import (
    UpstreamFailed,
    UpstreamHealth,
    UpstreamSettings,
    offline,
    post_answer,
    upstream_client,
)
from deployments.protocol import MAX_INPUT_TOKENS, EngineError

logger = logging.getLogger("deployments.openai_upstream")


class OpenAIUpstreamEmbedder:
    """An `EmbeddingEngine` (deployments/engines/embedding.py) whose `embed` is a coroutine:
    the deployment awaits it on its loop instead of a worker thread."""

    def __init__(self, weights: str | None, options: dict[str, Any]) -> None:
        self.settings = settings = UpstreamSettings.of(options)
        self.client = upstream_client(settings)
        self.health = UpstreamHealth(settings)
        # Known from the first answer (the catalog's `dimensions` is what clients are told).
        self.dimensions = 0
        # The server refuses an input over its own context: what it reads is all of it.
        self.max_seq_length = MAX_INPUT_TOKENS

    def count_tokens(self, texts: list[str]) -> list[int]:
        """An estimate of each text's tokens (the fair share's cost), never more than its
        UTF-8 bytes."""
        return [estimate(text) for text in texts]

    async def embed(self, texts: list[str]) -> Encoded:
        """Unit vectors of `texts` from the server, and each text's share of its usage;
        raises `UpstreamFailed` with the answer for the callers."""
        if not self.health.online:
            raise UpstreamFailed(offline(self.settings), counts=False)
        try:
            encoded = await self._call(texts)
        except UpstreamFailed as failed:
            if failed.counts:
                self.health.failed(self.client)
            raise
        self.health.succeeded()
        return encoded

    async def _call(self, texts: list[str]) -> Encoded:
        body = {"model": self.settings.upstream_model, "input": texts,
                "encoding_format": "float"}
        answer = await post_answer(self.client, self.settings, "embeddings", body)
        vectors = _vectors(answer, len(texts))
        if vectors is None:
            logger.warning("upstream %s answered something else than embeddings",
                           self.settings.upstream_model)
            raise UpstreamFailed(EngineError(500, "The model's server answered something "
                                                  "else than embeddings",
                                             code="INFERENCE_FAILED"), counts=True)
        self.dimensions = int(vectors.shape[1])
        return Encoded(vectors, shares(_reported(answer), texts, self.settings.upstream_model))

    def stats(self) -> dict[str, Any]:
        return {"upstream": self.health.stats()}


def estimate(text: str) -> int:
    """About four bytes a token, at least one, at most one a byte (the Gateway's hold counts
    one a byte plus two)."""
    size = len(text.encode())
    return max(1, min(size, size // 4 + 1))


def shares(reported: int | None, texts: list[str], upstream_model: str) -> list[int]:
    """Each text's tokens: the server's `reported` total shared in proportion to the texts'
    estimates (largest remainders: they add up to the report), or the estimates."""
    estimates = [estimate(text) for text in texts]
    if reported is None:
        logger.info("upstream %s reported no usage: billing an estimate of %d tokens",
                    upstream_model, sum(estimates))
        return estimates
    whole = sum(estimates)
    exact = [reported * e / whole for e in estimates]
    counts = [math.floor(x) for x in exact]
    left = reported - sum(counts)
    for i in sorted(range(len(texts)), key=lambda i: counts[i] - exact[i])[:left]:
        counts[i] += 1
    return counts


def _reported(answer: httpx.Response) -> int | None:
    usage = answer.json().get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return int(tokens) if isinstance(tokens, int | float) and tokens >= 0 else None


def _vectors(answer: httpx.Response, count: int) -> np.ndarray | None:
    """The answer's vectors in input order, scaled to unit length; None when it is not an
    embeddings answer for `count` inputs of one size."""
    try:
        data = answer.json()["data"]
        rows = sorted(data, key=lambda row: int(row["index"]))
        if [int(row["index"]) for row in rows] != list(range(count)):
            return None
        vectors = np.asarray([row["embedding"] for row in rows], dtype=np.float32)
    except (ValueError, KeyError, TypeError):
        return None
    if vectors.ndim != 2 or vectors.shape[1] == 0:
        return None
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


ENGINES: dict[str, type] = {"openai": OpenAIUpstreamEmbedder}
