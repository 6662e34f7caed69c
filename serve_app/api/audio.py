"""Audio endpoints of the chat-completion convention, as published: speech
(`POST /audio/speech`, streamed or whole), transcription (`POST /audio/transcriptions`,
multipart with a `file`), and the voices of the speech models (`GET /audio/voices`). The
`openai` SDK's `audio.speech.create` and `audio.transcriptions.create` work unchanged.

Queued audio (`/audio/quote|queue|retrieve|complete`) and the voice changer
(`/audio/voice-changer/quote|queue|retrieve|complete`, a multipart `file` or a JSON
`audio_url`) follow; each refuses the other's models with a 400 naming its endpoint."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from fastapi import Header, Query, Request, Response
from fastapi.responses import PlainTextResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from serve_app.api.deps import Context, InferenceCaller, JsonBody, Services
from serve_app.api.guarded_route import guarded_router
from serve_app.audio import serving as service
from serve_app.audio.voice_change import KIND as VOICE_CHANGE
from serve_app.audio.voice_change import check_not_voice_changer
from serve_app.errors import ApiError, invalid_request, payload_too_large
from serve_app.http.billed_stream import BilledStream
from serve_app.http.render import json_response
from serve_app.json_bodies import parse_json
from serve_app.schemas.audio import (
    QueueAudioRequest,
    QuoteAudioRequest,
    SpeechRequest,
    TranscriptionRequest,
    VoiceChangerQueueRequest,
    VoiceChangerQuoteRequest,
)
from serve_app.schemas.video import JobRequest, RetrieveRequest
from serve_app.services import GatewayServices

router = guarded_router(tags=["Audio"])

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # files must be smaller


@router.post("/audio/speech", dependencies=[JsonBody], summary="Text to speech",
             response_class=Response,
             responses={200: {"content": {t: {"schema": {"type": "string", "format": "binary"}}
                                          for t in service.CONTENT_TYPES.values()},
                              "description": "The audio"}})
async def create_speech(body: SpeechRequest, ctx: Context, key: InferenceCaller,
                        services: Services) -> Response:
    speech, media_type = await services.audio.speak(ctx, key, body)
    if isinstance(speech, bytes):
        return Response(speech, media_type=media_type)
    return BilledStream(speech, media_type=media_type)


async def _upload(request: Request, *, required: bool = True
                  ) -> tuple[dict[str, Any], bytes | None]:
    """The form's plain fields and the bytes of its `file` (under 25 MB); None for no file
    when it is not `required`."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise ApiError(415, f"Invalid content type {content_type or '(none)'!r}: send "
                            "multipart/form-data with the audio as `file`",
                       code="INVALID_CONTENT_TYPE")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_AUDIO_BYTES + 1024 * 1024:
        raise payload_too_large(f"Request body exceeds {MAX_AUDIO_BYTES} bytes")
    try:
        form = await request.form(max_files=1, max_fields=16)
    except (MultiPartException, StarletteHTTPException) as exc:  # broken, or too many parts
        raise invalid_request(f"Invalid multipart body: {getattr(exc, 'detail', exc)}") from exc
    try:
        upload = form.get("file")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        if upload is None and not required:
            return fields, None
        if not isinstance(upload, UploadFile):
            raise invalid_request("file is required: the audio as a file upload", "file")
        if upload.size is not None and upload.size >= MAX_AUDIO_BYTES:
            raise payload_too_large(f"the audio file is {upload.size} bytes; files must be "
                                    f"smaller than 25 MB ({MAX_AUDIO_BYTES} bytes)")
        data = await upload.read()
        if not data:
            raise invalid_request("file is empty", "file")
        return fields, data
    finally:
        await form.close()


@router.post("/audio/transcriptions", summary="Speech to text",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "multipart/form-data": {"schema": {
                     **TranscriptionRequest.model_json_schema(),
                     "properties": {"file": {"type": "string", "format": "binary"},
                                    **TranscriptionRequest.model_json_schema()["properties"]},
                     "required": ["file"]}}}}})
async def create_transcription(request: Request, ctx: Context, key: InferenceCaller,
                               services: Services) -> Response:
    fields, audio = await _upload(request)
    assert audio is not None  # required
    body = TranscriptionRequest.model_validate(fields)
    out = await services.audio.transcribe(ctx, key, body, audio)
    if body.response_format == "text":
        return PlainTextResponse(out.text)
    return json_response(ctx, service.transcription_payload(body, out))


@router.get("/audio/voices", summary="Voices of the speech models")
async def list_voices(services: Services, model: str | None = Query(None)) -> dict:
    return {"object": "list", "data": services.audio.voices(model)}


# ---- queued audio ------------------------------------------------------------------------

@router.post("/audio/quote", dependencies=[JsonBody], summary="Price of an audio job")
async def quote_audio(body: QuoteAudioRequest, ctx: Context, key: InferenceCaller,
                      services: Services) -> Response:
    return json_response(ctx, services.queued_audio.quote(body))




@router.post("/audio/queue", dependencies=[JsonBody], summary="Queue an audio job")
async def queue_audio(body: QueueAudioRequest, ctx: Context, key: InferenceCaller,
                      services: Services, idempotency_key: str | None = Header(None)) -> Response:
    return await services.job_service.queued(ctx, key, "audio/queue", body, idempotency_key,
                                             lambda: services.queued_audio.queue(ctx, key, body))


@router.post("/audio/retrieve", dependencies=[JsonBody], summary="Status or audio of a job",
             response_class=Response, responses={200: {"content": {
                 t: {"schema": {"type": "string", "format": "binary"}}
                 for t in ("audio/mpeg", "audio/wav", "audio/flac")}}})
async def retrieve_audio(body: RetrieveRequest, ctx: Context, key: InferenceCaller,
                         services: Services) -> Response:
    _not_voice_changer(services, body.model, "retrieve")
    return await services.job_service.retrieve(ctx, key, body, "audio")


@router.post("/audio/complete", dependencies=[JsonBody], summary="Delete a job's audio")
async def complete_audio(body: JobRequest, ctx: Context, key: InferenceCaller,
                         services: Services) -> Response:
    _not_voice_changer(services, body.model, "complete")
    return json_response(ctx, await services.job_service.complete(key, body, "audio"))


def _not_voice_changer(services: GatewayServices, name: str, endpoint: str) -> None:
    """A voice changer named on a queued-audio route: 400 naming its own endpoint (a name the
    catalog does not know is left to the route's answer for an unknown job)."""
    model = services.catalog.find(name, "music")
    if model is not None:
        check_not_voice_changer(model, endpoint)


def _voice_changer_only(services: GatewayServices, name: str, endpoint: str) -> None:
    """Another music model named on a voice-changer route: 400 naming its endpoint."""
    model = services.catalog.find(name, "music")
    if model is not None and model.type == "music" and model.voice_changer is None:
        services.voice_changer.model(name, endpoint)


# ---- voice changer (speech to speech) ------------------------------------------------------

@router.post("/audio/voice-changer/quote", dependencies=[JsonBody],
             summary="Price of a voice change")
async def quote_voice_change(body: VoiceChangerQuoteRequest, ctx: Context,
                             key: InferenceCaller, services: Services) -> Response:
    return json_response(ctx, services.voice_changer.quote(body))


@router.post("/audio/voice-changer/queue", summary="Queue a voice change",
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": VoiceChangerQueueRequest.model_json_schema()},
                 "multipart/form-data": {"schema": {
                     **VoiceChangerQueueRequest.model_json_schema(),
                     "properties": {"file": {"type": "string", "format": "binary"},
                                    **VoiceChangerQueueRequest.model_json_schema()[
                                        "properties"]}}}}}})
async def queue_voice_change(request: Request, ctx: Context, key: InferenceCaller,
                             services: Services,
                             idempotency_key: str | None = Header(None)) -> Response:
    """The source once: a multipart `file`, or a JSON `audio_url` fetched by the server."""
    upload: bytes | None = None
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type == "multipart/form-data":
        fields, upload = await _upload(request, required=False)
    elif media_type == "application/json" or media_type.endswith("+json"):
        fields = await parse_json(await request.body())
        if not isinstance(fields, dict):
            raise invalid_request("The request body must be a JSON object")
    else:
        raise ApiError(415, f"Invalid content type {media_type or '(none)'!r}: send "
                            "application/json with an audio_url, or multipart/form-data with "
                            "the audio as `file`", code="INVALID_CONTENT_TYPE")
    body = VoiceChangerQueueRequest.model_validate(fields)
    digested = None  # a retry is the same request only with the same file
    if upload is not None and idempotency_key is not None:
        digest = await asyncio.to_thread(hashlib.sha256, upload)  # up to 25 MB: off the loop
        digested = {"file_sha256": digest.hexdigest()}
    return await services.job_service.queued(
        ctx, key, "audio/voice-changer/queue", body, idempotency_key,
        lambda: services.voice_changer.queue(ctx, key, body, upload), digested)


@router.post("/audio/voice-changer/retrieve", dependencies=[JsonBody],
             summary="Status or audio of a voice change", response_class=Response,
             responses={200: {"content": {
                 t: {"schema": {"type": "string", "format": "binary"}}
                 for t in ("audio/mpeg", "audio/wav", "audio/flac")}}})
async def retrieve_voice_change(body: RetrieveRequest, ctx: Context, key: InferenceCaller,
                                services: Services) -> Response:
    _voice_changer_only(services, body.model, "retrieve")
    return await services.job_service.retrieve(ctx, key, body, VOICE_CHANGE)


@router.post("/audio/voice-changer/complete", dependencies=[JsonBody],
             summary="Delete a voice change's audio")
async def complete_voice_change(body: JobRequest, ctx: Context, key: InferenceCaller,
                                services: Services) -> Response:
    _voice_changer_only(services, body.model, "complete")
    return json_response(ctx, await services.job_service.complete(key, body, VOICE_CHANGE))
