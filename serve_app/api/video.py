"""The video endpoints: the spec's quote and queue, and the published retrieve and complete.

A job is queued at once (its quoted price held) and made by the video deployments through the
job worker; clients poll `/video/retrieve` until it answers with the MP4, then call
`/video/complete` (or retrieve with `delete_media_on_completion`) to delete it.

As the reference delivers: a model that streams its video sends no `download_url` at queue
time, and its retrieve answers the MP4 to clients that accept video (no `Accept`, `*/*`,
`video/*`, `video/mp4`) and the JSON `COMPLETED` status to those whose `Accept` excludes it;
a model that delivers by link (catalog `delivery: download_url`) sends the signed
`download_url` and its retrieve answers JSON status only.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Header, Query, Request, Response

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.http.render import json_response
from serve_app.schemas.video import (
    JobRequest,
    QueueVideoRequest,
    QuoteVideoRequest,
    RetrieveRequest,
)

router = guarded_router(tags=["Video"])

_STATUS = {"application/json": {"schema": {"type": "object", "properties": {
    "status": {"type": "string", "enum": ["PROCESSING", "COMPLETED"]},
    "average_execution_time": {"type": "number"},
    "execution_duration": {"type": "number"}}}}}


@router.post("/video/quote", dependencies=[JsonBody], summary="Price of a video job")
async def quote_video(body: QuoteVideoRequest, ctx: Context, key: InferenceCaller,
                      services: Services) -> Response:
    return json_response(ctx, await services.video.quote(ctx, key, body))


@router.post("/video/queue", dependencies=[JsonBody], summary="Queue a video job")
async def queue_video(body: QueueVideoRequest, request: Request, ctx: Context,
                      key: InferenceCaller, services: Services,
                      idempotency_key: Annotated[str | None, Header()] = None) -> Response:
    """Safe to retry with an `Idempotency-Key`; `callback_url` gets a signed event at the
    end."""
    return await services.job_service.queued(ctx, key, "video/queue", body, idempotency_key,
                                             lambda: services.video.queue(request, ctx, key, body))


@router.post("/video/retrieve", dependencies=[JsonBody], summary="Status or video of a job",
             response_class=Response, responses={200: {"content": {
                 **_STATUS, "video/mp4": {"schema": {"type": "string",
                                                         "format": "binary"}}}}})
async def retrieve_video(body: RetrieveRequest, ctx: Context, key: InferenceCaller,
                         services: Services, accept: Annotated[str | None, Header()] = None
                         ) -> Response:
    return await services.job_service.retrieve(ctx, key, body, "video", accept)


@router.get("/video/retrieve", summary="Status or video of a job (query form)",
            response_class=Response, responses={200: {"content": {
                **_STATUS, "video/mp4": {"schema": {"type": "string",
                                                        "format": "binary"}}}}})
async def retrieve_video_by_query(query: Annotated[JobRequest, Query()], ctx: Context,
                                  key: InferenceCaller, services: Services,
                                  accept: Annotated[str | None, Header()] = None) -> Response:
    """The spec names `GET /video/retrieve`; the published interface has the POST. Both
    answer alike; the GET only reads (deleting is the POST's `delete_media_on_completion`)."""
    return await services.job_service.retrieve(ctx, key, RetrieveRequest(**query.model_dump()),
                                              "video", accept)


@router.get("/video/download/{queue_id}", summary="A finished video by its delivery URL",
            response_class=Response, responses={200: {"content": {
                "video/mp4": {"schema": {"type": "string", "format": "binary"}}}}})
async def download_video(queue_id: str, expires: int, signature: str,
                         services: Services) -> Response:
    """The queue result's `download_url` (models that deliver by link): no API key, valid for
    24 hours."""
    return await services.job_service.download(queue_id, expires, signature)


@router.post("/video/complete", dependencies=[JsonBody], summary="Delete a job's video")
async def complete_video(body: JobRequest, ctx: Context, key: InferenceCaller,
                         services: Services) -> Response:
    return json_response(ctx, await services.job_service.complete(key, body, "video"))
