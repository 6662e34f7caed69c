"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from functools import partial

from fastapi import Request, Response

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, unless_client_leaves
from serve_app.http import render
from serve_app.http.billed_stream import BilledStream
from serve_app.schemas.chat import ChatCompletionRequest

router = guarded_router(tags=["Chat"])


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Context,
                           key: InferenceCaller, services: Services) -> Response:
    if not body.stream:
        return render.json_response(ctx, await services.chat.completion(ctx, key, body))
    try:
        stream = await services.chat.completion_stream(ctx, key, body,
                                                       partial(unless_client_leaves, request))
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return BilledStream(stream, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
