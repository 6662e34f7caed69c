"""`POST /responses`: the response-object convention, on the same engines as chat."""

from __future__ import annotations

from fastapi import Response

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.chat.response_objects import respond as respond_with
from serve_app.chat.response_objects import stream_response, to_chat_request
from serve_app.http import render
from serve_app.http.billed_stream import BilledStream
from serve_app.schemas.responses import ResponsesRequest

router = guarded_router(tags=["Chat"])


@router.post("/responses", dependencies=[JsonBody], summary="Create a model response")
async def create_response(body: ResponsesRequest, ctx: Context, key: InferenceCaller,
                          services: Services) -> Response:
    req = to_chat_request(body)
    if body.stream:
        return BilledStream(await stream_response(ctx, key, req, services.chat),
                            headers={"Cache-Control": "no-cache"})
    response = await respond_with(ctx, key, req, services.chat)
    return render.json_response(ctx, _published(response))


def _published(response: dict) -> dict:
    """The response object as the reference publishes it: `error` and `usage` are objects
    when present, never null, so a null one is left out."""
    return {name: value for name, value in response.items()
            if value is not None or name not in ("error", "usage")}
