"""The embedding family in process: the real `EmbeddingDeployment` (deployments/embedding.py),
its fair forward passes and its limit on an input's tokens, with a fake engine behind it.

The fake engine answers unit vectors of its dimensions, the same for the same text, and each
input's tokens: one per word, plus the two special tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from deployments.embedding import EmbeddingDeployment
from deployments.engines.embedding import Encoded
from deployments.fair_share import AtCapacity
from deployments.protocol import EngineError
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of
from tests.fakes.text import words

DEFAULT_DIMENSIONS = 384


class FakeEmbeddingEngine(FakeEngine):
    """An embedding engine (deployments/engines/embedding.py `EmbeddingEngine`) of
    `options["dimensions"]`. A failure set on it is raised by its forward pass; a reported
    503 at capacity as the pass's `AtCapacity` (what the deployment turns into that answer),
    the only report the embedding deployment makes."""

    max_seq_length = 256

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(weights, options)
        self.dimensions = int(self.options.get("dimensions", DEFAULT_DIMENSIONS))

    @staticmethod
    def tokens_of(text: str) -> int:
        return len(words(text)) + 2

    def vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
        v = np.random.default_rng(seed).standard_normal(self.dimensions)
        return (v / np.linalg.norm(v)).astype(np.float32)

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [self.tokens_of(t) for t in texts]

    def embed(self, texts: list[str]) -> Encoded:
        failure = self.failure
        if isinstance(failure, EngineError):
            assert failure.code == "MODEL_AT_CAPACITY" and failure.retry_after, failure
            raise AtCapacity(failure.retry_after, len(texts))
        if failure is not None:
            raise failure
        return Encoded(np.stack([self.vector(t) for t in texts]), self.count_tokens(texts))


class FakeEmbeddingDeployment(ServedDeployment):
    """The embedding deployment: the real `EmbeddingDeployment`, its models on
    `FakeEmbeddingEngine`s of their dimensions (`dimensions`: one for all, or by model id)."""

    METHODS = ("embed", "dimensions")
    DEPLOYMENT = class_of(EmbeddingDeployment)
    ENGINE = FakeEmbeddingEngine
    tokens_of = staticmethod(FakeEmbeddingEngine.tokens_of)

    def __init__(self, deployment_name: str = "embedding",
                 models: Sequence[str | ModelOptions] = ("embed",), *,
                 dimensions: dict[str, int] | int = DEFAULT_DIMENSIONS) -> None:
        super().__init__(deployment_name, models)
        for model_id, engine in self.engines.items():
            engine.dimensions = dimensions if isinstance(dimensions, int) \
                else dimensions[model_id]

    @property
    def max_seq_length(self) -> int:
        return FakeEmbeddingEngine.max_seq_length

    def vector(self, model_id: str, text: str) -> np.ndarray:
        """The vector the model `model_id` makes of `text`."""
        return self.engines[model_id].vector(text)
