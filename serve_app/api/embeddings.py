"""`POST /embeddings`: vectors from the embedding deployment, truncated and encoded here."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request, Response

from deployments.embedding import MAX_INPUT_TOKENS
from serve_app.api.deps import CurrentKey, JsonBody, State
from serve_app.billing.admission import hold_for
from serve_app.billing.pricing import price
from serve_app.errors import invalid_request
from serve_app.model_calls import call_model
from serve_app.responses import add_model_headers, json_response
from serve_app.schemas.embeddings import EmbeddingRequest

router = APIRouter(tags=["Embeddings"])


def _shape(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components and scale back to unit length."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.where(norms == 0, 1, norms)).astype(np.float32)


def _encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


def _max_tokens(texts: list[str]) -> int:
    """No input has more tokens than UTF-8 bytes plus its two special tokens, nor more than
    the per-input cap the engine enforces."""
    return sum(min(len(t.encode()) + 2, MAX_INPUT_TOKENS) for t in texts)


@router.post("/embeddings", dependencies=[JsonBody], summary="Create embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request, key: CurrentKey,
                            state: State) -> Response:
    routed = state.router.resolve(body.model, "embedding")
    model = routed.model
    texts = body.texts
    ticket = await state.limits.admit(request, key, model, sum(len(t) for t in texts) // 4 + 1)
    if body.dimensions is not None and model.dimensions and body.dimensions > model.dimensions:
        raise invalid_request(f"dimensions must be at most {model.dimensions} for {model.id}",
                              "dimensions")
    hold = await hold_for(request, state, key, [model], lambda _m: {"input": _max_tokens(texts)})
    try:
        handle = state.router.handle(model)
        add_model_headers(request, model, routed.router)
        result = await call_model(handle.embed, model.id, model.id, texts)
    except BaseException:
        await hold.finish(None)
        raise
    tokens = int(result["prompt_tokens"])
    await hold.finish(price(model, {"input": tokens}))
    if ticket is not None:
        await ticket.correct(tokens)
    vectors = _shape(result["vectors"], body.dimensions)
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": i,
                  "embedding": _encode(v, body.encoding_format)}
                 for i, v in enumerate(vectors)],
        "model": model.id,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return json_response(request, payload, compress=True)
