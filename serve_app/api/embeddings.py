"""`POST /embeddings`: the steps of a billable request around one embedding call."""

from __future__ import annotations

from fastapi import APIRouter, Response

from serve_app.api.deps import Context, InferenceCaller, JsonBody, State
from serve_app.billing.pricing import price
from serve_app.embeddings.serving import check_input_lengths, encode, max_tokens, shape
from serve_app.errors import ApiError, invalid_request, refused_for_capacity
from serve_app.pipeline import respond
from serve_app.schemas.embeddings import EmbeddingRequest

router = APIRouter(tags=["Embeddings"])

# Answers of more inputs than this are encoded and compressed in a worker thread: a vector of
# 384 floats takes about a quarter of a millisecond (50 ms for a batch of 256), which would
# hold up every other request of the replica; a few cost less than the hop to the thread.
INLINE_RENDER_TEXTS = 8


@router.post("/embeddings", dependencies=[JsonBody], summary="Create embeddings")
async def create_embeddings(body: EmbeddingRequest, ctx: Context, key: InferenceCaller,
                            state: State) -> Response:
    routed = state.router.resolve(body.model, "embedding")
    model = routed.model
    texts = body.texts
    estimate = sum(len(t) for t in texts) // 4 + 1
    pending = state.admission.start(ctx, key, model, estimate)
    try:
        if body.dimensions is not None and model.dimensions and \
                body.dimensions > model.dimensions:
            raise invalid_request(f"dimensions must be at most {model.dimensions} for "
                                  f"{model.id}", "dimensions")
        check_input_lengths(texts)  # inputs surely over the token limit: before the model
    except ApiError as error:
        await pending.abandon(error)  # counted, as any request; nothing held or charged
        raise
    charge = await pending.hold([model], lambda _m: {"input": max_tokens(texts)})
    try:
        state.router.require_online(model)  # 503 before anything else
        respond.model_headers(ctx, model, routed.router)
        with ctx.step("model"):
            embedded = await state.embedder.embed(model, texts, state.admission.tenant(key))
        ctx.record("replica", embedded.replica_ms)
        if embedded.engine_ms:
            ctx.record("engine", embedded.engine_ms)
    except BaseException as failure:
        await charge.release(tokens=0 if refused_for_capacity(failure) else None)
        raise
    await charge.settle(price(model, {"input": embedded.tokens}), tokens=embedded.tokens)
    with ctx.step("respond"):
        vectors = shape(embedded.vectors, body.dimensions)
        payload = {
            "object": "list",
            "data": [{"object": "embedding", "index": i,
                      "embedding": encode(v, body.encoding_format)}
                     for i, v in enumerate(vectors)],
            "model": model.id,
            "usage": {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens},
        }
        if len(texts) > INLINE_RENDER_TEXTS:
            return await respond.json_response_off_loop(ctx, payload, compress=True)
        return respond.json_response(ctx, payload, compress=True)
