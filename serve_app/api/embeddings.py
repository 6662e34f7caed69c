"""`POST /embeddings`: the steps of a billable request around one embedding call."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from serve_app.api.deps import InferenceCaller, JsonBody, State
from serve_app.billing.admission import admit_and_hold
from serve_app.billing.pricing import price
from serve_app.embeddings.service import encode, max_tokens, shape
from serve_app.errors import invalid_request
from serve_app.responses import add_model_headers, json_response
from serve_app.schemas.embeddings import EmbeddingRequest
from serve_app.timing import step_times, timed

router = APIRouter(tags=["Embeddings"])


@router.post("/embeddings", dependencies=[JsonBody], summary="Create embeddings")
async def create_embeddings(body: EmbeddingRequest, request: Request, key: InferenceCaller,
                            state: State) -> Response:
    routed = state.router.resolve(body.model, "embedding")
    model = routed.model
    texts = body.texts
    estimate = sum(len(t) for t in texts) // 4 + 1
    if body.dimensions is not None and model.dimensions and body.dimensions > model.dimensions:
        await state.limits.admit(request, key, model, estimate)  # counted, as any request
        raise invalid_request(f"dimensions must be at most {model.dimensions} for {model.id}",
                              "dimensions")
    ticket, hold = await admit_and_hold(request, state, key, model, estimate,
                                        lambda _m: {"input": max_tokens(texts)})
    try:
        state.router.handle(model)  # 503 before anything else when the model is offline
        add_model_headers(request, model, routed.router)
        with timed(request, "model"):
            embedded = await state.embedder.embed(model, texts)
        step_times(request).record("replica", embedded.replica_ms)
    except BaseException:
        await hold.finish(None)
        raise
    if ticket is not None:
        ticket.correct(embedded.tokens)
    with timed(request, "settle"):
        await hold.finish(price(model, {"input": embedded.tokens}))
    with timed(request, "respond"):
        vectors = shape(embedded.vectors, body.dimensions)
        payload = {
            "object": "list",
            "data": [{"object": "embedding", "index": i,
                      "embedding": encode(v, body.encoding_format)}
                     for i, v in enumerate(vectors)],
            "model": model.id,
            "usage": {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens},
        }
        return json_response(request, payload, compress=True)
