"""The image endpoints: the spec's upscale, background removal and multi-edit, and the
published generation companions (`/image/generate`, `/image/edit`, and the chat-completion
convention's `/images/generations`, which the `openai` SDK's `images.generate` calls).

Bodies are JSON or, where the endpoint allows, multipart uploads; either way they are read
here with the size caps first (serve_app/images/inputs.py) and validated by the schemas.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.errors import invalid_request
from serve_app.http.render import json_response
from serve_app.images import serving as service
from serve_app.images.inputs import read_image_body
from serve_app.middleware import MEDIA_ROUTES, ONE_IMAGE_BODY_BYTES
from serve_app.schemas.images import (
    BackgroundRemoveRequest,
    EditRequest,
    GenerateRequest,
    MultiEditRequest,
    OpenAIImageRequest,
    UpscaleRequest,
)
from serve_app.services import GatewayServices

router = guarded_router(tags=["Image"])

Source = Callable[[], Awaitable[bytes]]


def _body_doc(schema: type[BaseModel], *, multipart: bool = True) -> dict[str, Any]:
    """The request body of the OpenAPI document (the routes read their bodies themselves)."""
    content = {"application/json": {"schema": schema.model_json_schema()}}
    if multipart:
        content["multipart/form-data"] = {"schema": schema.model_json_schema()}
    return {"requestBody": {"required": True, "content": content}}


def _image_answer(media_type: str) -> dict[Any, Any]:
    return {200: {"content": {media_type: {"schema": {"type": "string", "format": "binary"}}},
                  "description": "The image"}}


def _uploaded(data: bytes) -> Source:
    async def read() -> bytes:
        return data

    return read


def _sent(services: GatewayServices, value: str, field: str, *, allow_urls: bool) -> Source:
    async def read() -> bytes:
        return await services.media_sources.read(value, field, allow_urls=allow_urls)

    return read


def _one_image(services: GatewayServices, fields: dict[str, Any], files: dict[str, list[bytes]],
               value: str | None, *, allow_urls: bool, url: str | None = None) -> Source:
    uploads = files.get("image", [])
    if len(uploads) > 1:
        raise invalid_request("send one image", "image")
    if uploads:
        return _uploaded(uploads[0])
    if value:
        return _sent(services, value, "image", allow_urls=allow_urls)
    if url:
        return _sent(services, url, "image_url", allow_urls=True)
    if "image" in fields:
        raise invalid_request("image must be a non-empty base64 string"
                              + (" or image URL" if allow_urls else ""), "image")
    raise invalid_request("image is required", "image")


async def _read(request: Request, route: str, file_fields: set[str]
                ) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    images = MEDIA_ROUTES[route]
    return await read_image_body(request, file_fields=frozenset(file_fields),
                                 max_body_bytes=images * ONE_IMAGE_BODY_BYTES,
                                 max_files=images)


@router.post("/image/upscale", summary="Upscale an image", response_class=Response,
             openapi_extra=_body_doc(UpscaleRequest), responses=_image_answer("image/png"))
async def upscale_image(request: Request, ctx: Context, key: InferenceCaller,
                        services: Services) -> Response:
    fields, files = await _read(request, "/image/upscale", {"image"})
    body = UpscaleRequest.model_validate(fields)
    source = _one_image(services, fields, files, body.image, allow_urls=False)
    produced = await services.images.upscale(ctx, key, body, source)
    return Response(produced.images[0], media_type="image/png")


@router.post("/image/background-remove", summary="Remove the background of an image",
             response_class=Response, openapi_extra=_body_doc(BackgroundRemoveRequest),
             responses=_image_answer("image/png"))
async def remove_background(request: Request, ctx: Context, key: InferenceCaller,
                            services: Services) -> Response:
    fields, files = await _read(request, "/image/background-remove", {"image"})
    body = BackgroundRemoveRequest.model_validate(fields)
    source = _one_image(services, fields, files, body.image, allow_urls=True, url=body.image_url)
    produced = await services.images.remove_background(ctx, key, body, source)
    return Response(produced.images[0], media_type="image/png")


def _edit_sources(services: GatewayServices, body: MultiEditRequest, files: dict[str, list[bytes]],
                  *, multipart: bool) -> tuple[list[Source], list[str]]:
    if multipart:
        if files.get("images") and files.get("image"):
            raise invalid_request("upload every image as `images` (the first is the base)",
                                  "images")
        uploads = files.get("images") or files.get("image") or []
        return ([_uploaded(data) for data in uploads],
                [f"images[{i}]" for i in range(len(uploads))])
    values = list(body.images)
    if isinstance(body, EditRequest) and body.image:
        values = [body.image, *values]
    for i, value in enumerate(values):
        if not value:
            raise invalid_request("must be a non-empty base64 string or image URL",
                                  f"images[{i}]")
    return ([_sent(services, v, f"images[{i}]", allow_urls=True) for i, v in enumerate(values)],
            [f"images[{i}]" for i in range(len(values))])


def _edited(produced: service.Produced) -> Response:
    extension = produced.media_type.split("/")[1].replace("jpeg", "jpg")
    return Response(produced.images[0], media_type=produced.media_type,
                    headers={"Content-Disposition": f'inline; filename="edited.{extension}"'})


@router.post("/image/multi-edit", summary="Edit an image with several layered inputs",
             response_class=Response, openapi_extra=_body_doc(MultiEditRequest),
             responses=_image_answer("image/png"))
async def multi_edit(request: Request, ctx: Context, key: InferenceCaller,
                     services: Services) -> Response:
    fields, files = await _read(request, "/image/multi-edit", {"images", "image"})
    multipart = request.headers.get("content-type", "").lower().startswith("multipart/")
    if multipart and ("images" in fields or "image" in fields):
        raise invalid_request("multipart requests take image files only: upload each image "
                              "as a file in `images`", "images")
    body = MultiEditRequest.model_validate(fields)
    sources, names = _edit_sources(services, body, files, multipart=multipart)
    produced = await services.images.edit(ctx, key, body, sources, names)
    return _edited(produced)


@router.post("/image/edit", summary="Edit an image", response_class=Response,
             openapi_extra=_body_doc(EditRequest), responses=_image_answer("image/png"))
async def edit_image(request: Request, ctx: Context, key: InferenceCaller,
                     services: Services) -> Response:
    fields, files = await _read(request, "/image/edit", {"image"})
    body = EditRequest.model_validate(fields)
    if files.get("image"):
        sources, names = [_uploaded(files["image"][0])], ["image"]
    elif body.image:
        sources, names = [_sent(services, body.image, "image", allow_urls=True)], ["image"]
    else:
        raise invalid_request("image is required", "image")
    produced = await services.images.edit(ctx, key, body, sources, names)
    return _edited(produced)


@router.post("/image/generate", dependencies=[JsonBody], summary="Generate images")
async def generate_image(body: GenerateRequest, ctx: Context, key: InferenceCaller,
                         services: Services) -> Response:
    started = time.perf_counter()
    produced = await services.images.generate(ctx, key, body)
    if body.return_binary:
        return Response(produced.images[0], media_type=produced.media_type)
    return json_response(ctx, service.generate_payload(body, produced, started), compress=True)


@router.post("/images/generations", dependencies=[JsonBody],
             summary="Generate an image (chat-completion convention)")
async def openai_generations(body: OpenAIImageRequest, ctx: Context, key: InferenceCaller,
                             services: Services) -> Response:
    produced = await services.images.generate(ctx, key,
                                              services.images.native_generation(body))
    encoded = base64.b64encode(produced.images[0]).decode("ascii")
    item = ({"url": f"data:{produced.media_type};base64,{encoded}"}
            if body.response_format == "url" else {"b64_json": encoded})
    return json_response(ctx, {"created": int(time.time()), "data": [item]}, compress=True)
