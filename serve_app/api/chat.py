"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from serve_app.api.deps import CurrentKey, JsonBody, State
from serve_app.auth.key_store import KeyRecord
from serve_app.billing.admission import hold_for
from serve_app.chat.service import Admit, ChatPlan, open_stream, plan_chat, run_unary
from serve_app.responses import add_model_headers, json_response
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.state import GatewayState

router = APIRouter(tags=["Chat"])


def chat_admission(request: Request, state: GatewayState, key: KeyRecord) -> Admit:
    """Privacy tier and the hold for the model and its fallbacks, before any work."""

    async def admit(plan: ChatPlan) -> None:
        plan.hold = await hold_for(request, state, key, [c.model for c in plan.candidates],
                                   plan.max_units)

    return admit


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, key: CurrentKey,
                           state: State) -> Response:
    plan = await plan_chat(body, state, request.state.request_id,
                           chat_admission(request, state, key))
    try:
        headers = request.state.response_headers
        headers["x-service-is-content-violation"] = "false"
        if body.stream:
            routed, events = await open_stream(plan, state)
            add_model_headers(request, routed.model, plan.router_label)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        response = await run_unary(plan, state)
        await plan.finish_charge()
    except BaseException:
        if plan.hold is not None:
            await plan.hold.finish(None)
        raise
    add_model_headers(request, plan.answered_by.model, plan.router_label)
    return json_response(request, response)
