"""`POST /responses`: the response-object convention, on the same engines as chat."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from serve_app.api.deps import Context, InferenceCaller, JsonBody, State
from serve_app.chat.response_objects import respond as respond_with
from serve_app.chat.response_objects import stream_response, to_chat_request
from serve_app.pipeline import respond
from serve_app.schemas.responses import ResponsesRequest

router = APIRouter(tags=["Chat"])


@router.post("/responses", dependencies=[JsonBody], summary="Create a model response")
async def create_response(body: ResponsesRequest, ctx: Context, key: InferenceCaller,
                          state: State) -> Response:
    plan = await state.chat.plan(ctx, key, to_chat_request(body))
    try:
        if body.stream:
            _, events = await stream_response(plan, state.chat)
            respond.model_headers(ctx, plan.answered_by.model, plan.router_label)
            # The stream settles before its last event; should it never run (the client
            # left first), the background task settles or releases the hold instead.
            return StreamingResponse(events, media_type="text/event-stream",
                                     background=BackgroundTask(plan.finish_charge),
                                     headers={"Cache-Control": "no-cache"})
        response = await respond_with(plan, state.chat)
        await plan.finish_charge()
    except BaseException:
        await plan.release()
        raise
    respond.model_headers(ctx, plan.answered_by.model, plan.router_label)
    return respond.json_response(ctx, _published(response))


def _published(response: dict) -> dict:
    """The response object as the reference publishes it: `error` and `usage` are objects
    when present, never null, so a null one is left out."""
    return {name: value for name, value in response.items()
            if value is not None or name not in ("error", "usage")}
