"""The embedding replica encodes no input over the per-input token limit: such an input is
only counted (its count comes back, and the Gateway refuses the request before anything is
charged), while the other inputs of the same call are encoded as usual."""

from __future__ import annotations

import asyncio

import numpy as np

from deployments.engines.embedding import Encoded
from deployments.protocol import MAX_INPUT_TOKENS, Embeddings, Tenant


class CountingEngine:
    """One token per character, plus two; remembers what its forward passes read."""

    dimensions = 4
    max_seq_length = 16

    def __init__(self) -> None:
        self.encoded: list[str] = []
        self.counted: list[str] = []

    def count_tokens(self, texts: list[str]) -> list[int]:
        self.counted += texts
        return [len(text) + 2 for text in texts]

    def embed(self, texts: list[str]) -> Encoded:
        self.encoded += texts
        vectors = np.ones((len(texts), self.dimensions), dtype=np.float32) / 2
        return Encoded(vectors, [min(len(t) + 2, self.max_seq_length) for t in texts])


def test_an_input_over_the_limit_is_counted_and_never_encoded() -> None:
    from deployments.embedding import EmbeddingDeployment

    deployment = EmbeddingDeployment.func_or_class([])
    engine = deployment.engines["e"] = CountingEngine()
    too_long = "x" * MAX_INPUT_TOKENS  # 8194 tokens for this tokenizer
    long_but_within = "y" * (MAX_INPUT_TOKENS - 2)
    texts = ["short", too_long, long_but_within]

    out = asyncio.run(deployment.embed("e", texts, [(Tenant("t"), 3)]))

    assert isinstance(out, Embeddings)
    assert out.tokens[1] == MAX_INPUT_TOKENS + 2  # counted whole, for the Gateway's 400
    assert not out.vectors[1].any()
    assert engine.encoded == ["short", long_but_within]  # the forward pass skipped it
    # Whole, only an input with enough bytes to be over; before it, the fair share's count
    # of each input's cost, on as much of it as the model can read.
    assert engine.counted[-1:] == [too_long]
    assert [len(text) for text in engine.counted[:-1]] == [5, 16 * 8, 16 * 8]
    assert out.vectors[0].any() and out.vectors[2].any()
