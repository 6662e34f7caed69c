"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from serve_app.api.deps import InferenceCaller, JsonBody, State
from serve_app.auth.key_store import KeyRecord
from serve_app.billing.admission import hold_for
from serve_app.billing.service import Hold
from serve_app.chat.prompt import UnsupportedFeature
from serve_app.chat.service import ChatPlan, open_stream, plan_chat, run_unary
from serve_app.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, unless_client_leaves
from serve_app.responses import add_model_headers, json_response
from serve_app.routing import RoutedModel
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.state import GatewayState
from serve_app.timing import timed

router = APIRouter(tags=["Chat"])


def prompt_estimate(req: ChatCompletionRequest) -> int:
    """Tokens of a prompt before it is tokenised: about four bytes per token."""
    return len(req.model_dump_json(include={"messages"}).encode()) // 4 + 1


async def admitted_plan(request: Request, state: GatewayState, key: KeyRecord,
                        req: ChatCompletionRequest) -> ChatPlan:
    """Plan a chat request with the steps before the work: rate limits and error budgets as
    soon as the model is known; the privacy tier and the hold for the model and its fallbacks
    once the request is valid, beside the limits when the key's last count left it well
    inside them (see `admit_and_hold`). An unsupported feature counts toward its own error
    budget."""
    estimate = prompt_estimate(req)

    async def limit(routed: RoutedModel):
        with timed(request, "limits"):
            return await state.limits.admit(request, key, routed.model, estimate,
                                            feature_budget=True)

    async def admit(plan: ChatPlan) -> Hold:
        with timed(request, "hold"):
            return await hold_for(request, state, key, [c.model for c in plan.candidates],
                                  plan.max_units)

    try:
        return await plan_chat(
            req, state, request.state.request_id, admit, limit,
            has_room=lambda routed: state.limits.has_room(key, routed.model, estimate))
    except UnsupportedFeature:
        state.limits.unsupported_feature(request, key,
                                         getattr(request.state, "limit_model", ""))
        raise


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, key: InferenceCaller,
                           state: State) -> Response:
    plan = await admitted_plan(request, state, key, body)
    try:
        headers = request.state.response_headers
        headers["x-service-is-content-violation"] = "false"
        if body.stream:
            with timed(request, "first-token"):
                # a model queue can hold a stream for minutes: a client that leaves while it
                # waits is not charged for tokens it will never receive
                routed, events = await unless_client_leaves(request, open_stream(plan, state))
            add_model_headers(request, routed.model, plan.router_label)
            # The stream settles before its last event; should it never run (the client
            # left first), the background task settles or releases the hold instead.
            return StreamingResponse(events, media_type="text/event-stream",
                                     background=BackgroundTask(plan.finish_charge),
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        with timed(request, "model"):
            response = await run_unary(plan, state)
        with timed(request, "settle"):
            await plan.finish_charge()
    except ClientGone:
        await plan.release()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except BaseException:
        await plan.release()
        raise
    add_model_headers(request, plan.answered_by.model, plan.router_label)
    return json_response(request, response)
