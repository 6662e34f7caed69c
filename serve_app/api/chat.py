"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from serve_app.api.deps import CurrentKey, JsonBody, State
from serve_app.chat.service import open_stream, plan_chat, run_unary
from serve_app.responses import add_model_headers, json_response
from serve_app.schemas.chat import ChatCompletionRequest

router = APIRouter(tags=["Chat"])


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, key: CurrentKey,
                           state: State) -> Response:
    plan = await plan_chat(body, state, request.state.request_id)
    headers = request.state.response_headers
    headers["x-service-is-content-violation"] = "false"
    if body.stream:
        routed, events = await open_stream(plan, state)
        add_model_headers(request, routed.model, plan.router_label)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})
    response = await run_unary(plan, state)
    add_model_headers(request, plan.answered_by.model, plan.router_label)
    return json_response(request, response)

