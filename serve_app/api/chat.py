"""`POST /chat/completions`, unary and streamed."""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import Header, Request, Response
from starlette.responses import StreamingResponse

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, unless_client_leaves
from serve_app.http import render
from serve_app.http.billed_stream import BilledStream
from serve_app.responses.service import last_event_id
from serve_app.schemas.chat import ChatCompletionRequest

router = guarded_router(tags=["Chat"])

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/chat/completions", dependencies=[JsonBody], summary="Chat completion")
async def chat_completions(body: ChatCompletionRequest, request: Request, ctx: Context,
                           key: InferenceCaller, services: Services) -> Response:
    if not body.stream:
        return render.json_response(ctx, await services.chat.completion(ctx, key, body))
    if body.stream_options is not None and body.stream_options.resumable:
        stream_id = await services.responses.create_chat(ctx, key, body)
        following = services.responses.follow(key.account_id, stream_id, -1, resumed=False)
        return StreamingResponse(following, headers=SSE_HEADERS, media_type="text/event-stream")
    try:
        stream = await services.chat.completion_stream(ctx, key, body,
                                                       partial(unless_client_leaves, request))
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return BilledStream(stream, headers=SSE_HEADERS)


@router.get("/chat/completions/{completion_id}", summary="Resume a resumable chat stream")
async def resume_chat_stream(
        completion_id: str, ctx: Context, key: InferenceCaller, services: Services,
        stream: bool = False,
        last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID",
                                                           max_length=20)] = None) -> Response:
    """A resumable chat stream (`stream_options.resumable`): `?stream=true` sends its events
    after the one `Last-Event-ID` names (all without it), then the live ones until its end;
    without it, whether it is still running."""
    view = await services.responses.own(key, completion_id, chat=True)
    if not stream:
        return render.json_response(ctx, view.response)
    return StreamingResponse(services.responses.follow(
        key.account_id, view.id, last_event_id(last_event_id_header)),
                             headers=SSE_HEADERS, media_type="text/event-stream")


@router.delete("/chat/completions/{completion_id}", summary="Delete a resumable chat stream")
async def delete_chat_stream(completion_id: str, ctx: Context, key: InferenceCaller,
                             services: Services) -> Response:
    """Stop a resumable chat stream still running (what it made is charged, the rest of its
    hold released) and delete it and its events, so that it no longer counts toward the
    account's kept responses."""
    await services.responses.delete(key, completion_id, chat=True)
    return render.json_response(ctx, {"id": completion_id, "object": "chat.completion.deleted",
                                      "deleted": True})
