"""`/responses`: the response-object convention, on the same engines as chat. A background
response (`background: true`) runs detached from the connection and is kept for a while:
`GET /responses/{id}` answers it as it stands, or follows its events (`?stream=true`, after
`starting_after` or the `Last-Event-ID` header), `POST /responses/{id}/cancel` stops it and
`DELETE /responses/{id}` removes it (serve_app/responses/)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query, Response
from starlette.responses import StreamingResponse

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.chat.response_objects import respond as respond_with
from serve_app.chat.response_objects import stream_response, to_chat_request
from serve_app.http import render
from serve_app.http.billed_stream import BilledStream
from serve_app.responses.service import last_event_id
from serve_app.schemas.responses import ResponsesRequest

router = guarded_router(tags=["Chat"])

STREAM_HEADERS = {"Cache-Control": "no-cache"}


@router.post("/responses", dependencies=[JsonBody], summary="Create a model response")
async def create_response(body: ResponsesRequest, ctx: Context, key: InferenceCaller,
                          services: Services) -> Response:
    req = to_chat_request(body)
    if body.background:
        created = await services.responses.create(ctx, key, req)
        if body.stream:
            following = services.responses.follow(key.account_id, created["id"], -1,
                                                  resumed=False)
            return StreamingResponse(following,
                                     media_type="text/event-stream", headers=STREAM_HEADERS)
        return render.json_response(ctx, _published(created))
    if body.stream:
        return BilledStream(await stream_response(ctx, key, req, services.chat),
                            headers=STREAM_HEADERS)
    response = await respond_with(ctx, key, req, services.chat)
    return render.json_response(ctx, _published(response))


@router.get("/responses/{response_id}", summary="Retrieve a background response")
async def retrieve_response(
        response_id: str, ctx: Context, key: InferenceCaller, services: Services,
        stream: bool = False,
        starting_after: Annotated[int | None, Query(ge=-1)] = None,
        last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID",
                                                           max_length=20)] = None) -> Response:
    view = await services.responses.own(key, response_id)
    if not stream:
        return render.json_response(ctx, _published(view.response))
    after = starting_after if starting_after is not None else last_event_id(last_event_id_header)
    return StreamingResponse(services.responses.follow(key.account_id, view.id, after),
                             media_type="text/event-stream", headers=STREAM_HEADERS)


@router.post("/responses/{response_id}/cancel", summary="Cancel a background response")
async def cancel_response(response_id: str, ctx: Context, key: InferenceCaller,
                          services: Services) -> Response:
    view = await services.responses.cancel(key, response_id)
    return render.json_response(ctx, _published(view.response))


@router.delete("/responses/{response_id}", summary="Delete a background response")
async def delete_response(response_id: str, ctx: Context, key: InferenceCaller,
                          services: Services) -> Response:
    await services.responses.delete(key, response_id)
    return render.json_response(ctx, {"id": response_id, "object": "response",
                                      "deleted": True})


def _published(response: dict) -> dict:
    """The response object as the reference publishes it: `error` and `usage` are objects
    when present, never null, so a null one is left out."""
    return {name: value for name, value in response.items()
            if value is not None or name not in ("error", "usage")}
