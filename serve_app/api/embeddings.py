"""`POST /embeddings`: one embedding call on its bill (pipeline/bill.py)."""

from __future__ import annotations

from fastapi import Response

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.billing.pricing import price
from serve_app.embeddings.serving import encode, most_units, shape
from serve_app.http import render
from serve_app.schemas.embeddings import EmbeddingRequest

router = guarded_router(tags=["Embeddings"])

# Answers of more inputs than this are encoded and compressed in a worker thread: a vector of
# 384 floats takes about a quarter of a millisecond (50 ms for a batch of 256), which would
# hold up every other request of the replica; a few cost less than the hop to the thread.
INLINE_RENDER_TEXTS = 8


@router.post("/embeddings", dependencies=[JsonBody], summary="Create embeddings")
async def create_embeddings(body: EmbeddingRequest, ctx: Context, key: InferenceCaller,
                            services: Services) -> Response:
    routed = services.router.resolve(body.model, "embedding")
    model, texts = routed.model, body.texts
    estimate = sum(len(t) for t in texts) // 4 + 1
    async with services.runner.admit(ctx, key, routed, tokens=estimate) as bill:
        await bill.hold(price(model, most_units(model, texts, body.dimensions)))
        with ctx.step("model"):
            embedded = await services.embedder.embed(model, texts, services.admission.tenant(key))
        ctx.record("replica", embedded.replica_ms)
        if embedded.engine_ms:
            ctx.record("engine", embedded.engine_ms)
        bill.deliver(price(model, {"input": embedded.tokens}), tokens=embedded.tokens)
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
            return await render.json_response_off_loop(ctx, payload, compress=True)
        return render.json_response(ctx, payload, compress=True)
