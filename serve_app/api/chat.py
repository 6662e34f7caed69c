"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from serve_app.api.deps import Context, InferenceCaller, JsonBody, State
from serve_app.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, unless_client_leaves
from serve_app.pipeline import respond
from serve_app.schemas.chat import ChatCompletionRequest

router = APIRouter(tags=["Chat"])


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Context,
                           key: InferenceCaller, state: State) -> Response:
    plan = await state.chat.plan(ctx, key, body)
    try:
        respond.content_headers(ctx)
        if body.stream:
            with ctx.step("first-token"):
                # a model queue can hold a stream for minutes: a client that leaves while it
                # waits is not charged for tokens it will never receive
                routed, events = await unless_client_leaves(request, state.chat.open_stream(plan))
            respond.model_headers(ctx, routed.model, plan.router_label)
            # The stream settles before its last event; should it never run (the client
            # left first), the background task settles or releases the hold instead.
            return StreamingResponse(events, media_type="text/event-stream",
                                     background=BackgroundTask(plan.finish_charge),
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        with ctx.step("model"):
            response = await state.chat.run_unary(plan)
        await plan.finish_charge()
    except ClientGone:
        await plan.release()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except BaseException as failure:
        await plan.release(failure)
        raise
    respond.model_headers(ctx, plan.answered_by.model, plan.router_label)
    return respond.json_response(ctx, response)
