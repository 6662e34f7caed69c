"""`POST /responses`: the response-object convention, on the same engines as chat."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from serve_app.api.chat import admitted_plan
from serve_app.api.deps import InferenceCaller, JsonBody, State
from serve_app.chat.responses_api import respond, stream_response, to_chat_request
from serve_app.responses import add_model_headers, json_response
from serve_app.schemas.responses import ResponsesRequest

router = APIRouter(tags=["Chat"])


@router.post("/responses", dependencies=[JsonBody], summary="Create a model response")
async def create_response(body: ResponsesRequest, request: Request, key: InferenceCaller,
                          state: State) -> Response:
    plan = await admitted_plan(request, state, key, to_chat_request(body))
    try:
        if body.stream:
            _, events = await stream_response(plan, state)
            add_model_headers(request, plan.answered_by.model, plan.router_label)
            # The stream settles before its last event; should it never run (the client
            # left first), the background task settles or releases the hold instead.
            return StreamingResponse(events, media_type="text/event-stream",
                                     background=BackgroundTask(plan.finish_charge),
                                     headers={"Cache-Control": "no-cache"})
        response = await respond(plan, state)
        await plan.finish_charge()
    except BaseException:
        await plan.release()
        raise
    add_model_headers(request, plan.answered_by.model, plan.router_label)
    return json_response(request, response)
