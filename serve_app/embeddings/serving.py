"""Embeddings between the router and the model: concurrent requests share handle calls
(batcher.py), and each gets back its own vectors and token counts, shaped as asked."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from deployments.protocol import MAX_INPUT_TOKENS, PLATFORM_TENANT, Embeddings, Tenant
from serve_app.embeddings.batcher import CallBatcher
from serve_app.errors import invalid_request
from serve_app.models.calls import call_model
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: np.ndarray  # (inputs, dimensions), unit length
    tokens: int  # tokens the model read, summed over the inputs
    replica_ms: float  # the time the model replica spent on the call that carried them
    engine_ms: float  # of it, the forward pass that carried them


class _Row(NamedTuple):
    """One text of a handle call's answer."""

    vector: np.ndarray
    tokens: int  # its whole token count
    read: int  # of them, what the model read (at most its max_seq_length)
    replica_ms: float
    engine_ms: float


def max_tokens(texts: list[str]) -> int:
    """No input has more tokens than UTF-8 bytes plus its two special tokens, nor more than
    the per-input cap: the hold's bound."""
    return sum(min(len(t.encode()) + 2, MAX_INPUT_TOKENS) for t in texts)


def check_input_lengths(texts: list[str]) -> None:
    """A 400 for an input that has more than MAX_INPUT_TOKENS tokens whatever the tokenizer,
    before the model runs: more whitespace-separated words than that (every tokenizer makes
    at least one token of each; a cheap count that never says more than the model would).
    An input over the limit by fewer words is refused once the replica counted its tokens,
    which it does before its forward pass and instead of it (deployments/embedding.py)."""
    for index, text in enumerate(texts):
        if len(text) <= 2 * MAX_INPUT_TOKENS:  # too short to hold that many words
            continue
        if len(text.split(maxsplit=MAX_INPUT_TOKENS)) > MAX_INPUT_TOKENS:
            raise invalid_request(f"input[{index}] has more than {MAX_INPUT_TOKENS} tokens; "
                                  f"the limit is {MAX_INPUT_TOKENS} per input", "input")


def most_units(model: CatalogModel, texts: list[str], dimensions: int | None
               ) -> dict[str, int]:
    """The request's checks (400: asked dimensions within the model's, no input surely over
    the token limit), then the most its inputs may use of the model's priced units."""
    if dimensions is not None and model.dimensions and dimensions > model.dimensions:
        raise invalid_request(f"dimensions must be at most {model.dimensions} for "
                              f"{model.id}", "dimensions")
    check_input_lengths(texts)
    return {"input": max_tokens(texts)}


def shape(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components and scale back to unit length."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.where(norms == 0, 1, norms)).astype(np.float32)


def encode(vector: np.ndarray, encoding_format: str) -> np.ndarray | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


def owner_runs(items: list[tuple[Tenant | None, str]]) -> list[tuple[Tenant, int]]:
    """Whose texts a call carries, in runs of one tenant (a call merges several requests);
    texts of no tenant are the platform's."""
    runs: list[tuple[Tenant, int]] = []
    for tenant, _ in items:
        tenant = tenant or PLATFORM_TENANT
        if runs and runs[-1][0] == tenant:
            runs[-1] = (tenant, runs[-1][1] + 1)
        else:
            runs.append((tenant, 1))
    return runs


class Embedder:
    """One call batcher per embedding model of this replica."""

    def __init__(self, router: ModelRouter, calls_in_flight: int,
                 min_texts_beside: int) -> None:
        self._router = router
        self._calls_in_flight = calls_in_flight
        self._min_texts_beside = min_texts_beside
        self._batchers: dict[str, CallBatcher[tuple[Tenant | None, str], _Row]] = {}

    def _batcher(self, model: CatalogModel) -> CallBatcher:
        batcher = self._batchers.get(model.id)
        if batcher is None:
            handle = self._router.embedding(model)

            async def send(items: list[tuple[Tenant | None, str]]) -> list[_Row]:
                texts = [text for _, text in items]
                out: Embeddings = await call_model(handle.embed, model.id, model.id, texts,
                                                   owner_runs(items))
                cap = out.max_seq_length
                engine_ms = getattr(out, "engine_ms", 0.0)  # a replica of an older build: none
                return [_Row(vector, count, min(count, cap), out.replica_ms, engine_ms)
                        for vector, count in zip(out.vectors, out.tokens, strict=True)]

            batcher = CallBatcher(send, max_in_flight=self._calls_in_flight,
                                  min_items_beside=self._min_texts_beside)
            self._batchers[model.id] = batcher
        return batcher

    async def embed(self, model: CatalogModel, texts: list[str],
                    tenant: Tenant | None = None) -> Embedded:
        """Vectors of `texts` (`tenant`'s, for the engine's fair share); 400 when an input is
        over the per-input token limit."""
        rows = await self._batcher(model).submit([(tenant, text) for text in texts],
                                                 tenant.id if tenant else None)
        for index, row in enumerate(rows):
            if row.tokens > MAX_INPUT_TOKENS:
                raise invalid_request(f"input[{index}] has {row.tokens} tokens; the limit is "
                                      f"{MAX_INPUT_TOKENS} per input", "input")
        return Embedded(np.stack([row.vector for row in rows]), sum(row.read for row in rows),
                        rows[0].replica_ms, rows[0].engine_ms)
