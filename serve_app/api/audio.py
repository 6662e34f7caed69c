"""Audio endpoints of the chat-completion convention, as published: speech
(`POST /audio/speech`, streamed or whole), transcription (`POST /audio/transcriptions`,
multipart with a `file`), and the voices of the speech models (`GET /audio/voices`). The
`openai` SDK's `audio.speech.create` and `audio.transcriptions.create` work unchanged."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
from starlette.types import Receive, Scope, Send

from serve_app.api.deps import Context, InferenceCaller, JsonBody, State
from serve_app.audio import serving as service
from serve_app.errors import ApiError, invalid_request, payload_too_large
from serve_app.pipeline.respond import json_response
from serve_app.schemas.audio import (
    QueueAudioRequest,
    QuoteAudioRequest,
    SpeechRequest,
    TranscriptionRequest,
    VoiceChangerQuoteRequest,
)
from serve_app.schemas.video import JobRequest, RetrieveRequest

router = APIRouter(tags=["Audio"])

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # files must be smaller


@router.post("/audio/speech", dependencies=[JsonBody], summary="Text to speech",
             response_class=Response,
             responses={200: {"content": {t: {"schema": {"type": "string", "format": "binary"}}
                                          for t in service.CONTENT_TYPES.values()},
                              "description": "The audio"}})
async def create_speech(body: SpeechRequest, ctx: Context, key: InferenceCaller,
                        state: State) -> Response:
    speech = await state.audio.speak(ctx, key, body)
    if body.streaming:
        return _SpeechStream(speech)
    try:
        audio = await speech.whole()
    finally:
        await speech.close()
    return Response(audio, media_type=speech.media_type)


class _SpeechStream(StreamingResponse):
    """Streams the speech and closes it however the answer ends (Starlette does not close a
    body iterator whose client left)."""

    def __init__(self, speech: service.Speech) -> None:
        super().__init__(speech.pieces, media_type=speech.media_type)
        self.speech = speech

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.speech.close()


async def _upload(request: Request) -> tuple[dict[str, Any], bytes]:
    """The form's plain fields and the bytes of its `file` (under 25 MB)."""
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
        if not isinstance(upload, UploadFile):
            raise invalid_request("file is required: the audio as a file upload", "file")
        if upload.size is not None and upload.size >= MAX_AUDIO_BYTES:
            raise payload_too_large(f"the audio file is {upload.size} bytes; files must be "
                                    f"smaller than 25 MB ({MAX_AUDIO_BYTES} bytes)")
        data = await upload.read()
        if not data:
            raise invalid_request("file is empty", "file")
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
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
                               state: State) -> Response:
    fields, audio = await _upload(request)
    body = TranscriptionRequest.model_validate(fields)
    out = await state.audio.transcribe(ctx, key, body, audio)
    if body.response_format == "text":
        return PlainTextResponse(out.text)
    return json_response(ctx, service.transcription_payload(body, out))


@router.get("/audio/voices", summary="Voices of the speech models")
async def list_voices(state: State, model: str | None = Query(None)) -> dict:
    return {"object": "list", "data": state.audio.voices(model)}


# ---- queued audio ------------------------------------------------------------------------

@router.post("/audio/quote", dependencies=[JsonBody], summary="Price of an audio job")
async def quote_audio(body: QuoteAudioRequest, ctx: Context, key: InferenceCaller,
                      state: State) -> Response:
    return json_response(ctx, state.queued_audio.quote(body))


@router.post("/audio/voice-changer/quote", dependencies=[JsonBody],
             summary="Price of a voice change")
async def quote_voice_change(body: VoiceChangerQuoteRequest, ctx: Context,
                             key: InferenceCaller, state: State) -> Response:
    return json_response(ctx, state.queued_audio.voice_changer_quote(body))


@router.post("/audio/queue", dependencies=[JsonBody], summary="Queue an audio job")
async def queue_audio(body: QueueAudioRequest, ctx: Context, key: InferenceCaller,
                      state: State, idempotency_key: str | None = Header(None)) -> Response:
    return await state.job_service.queued(ctx, key, "audio/queue", body, idempotency_key,
                                          lambda: state.queued_audio.queue(ctx, key, body))


@router.post("/audio/retrieve", dependencies=[JsonBody], summary="Status or audio of a job",
             response_class=Response, responses={200: {"content": {
                 t: {"schema": {"type": "string", "format": "binary"}}
                 for t in ("audio/mpeg", "audio/wav", "audio/flac")}}})
async def retrieve_audio(body: RetrieveRequest, ctx: Context, key: InferenceCaller,
                         state: State) -> Response:
    return await state.job_service.retrieve(ctx, key, body, "audio")


@router.post("/audio/complete", dependencies=[JsonBody], summary="Delete a job's audio")
async def complete_audio(body: JobRequest, ctx: Context, key: InferenceCaller,
                         state: State) -> Response:
    return json_response(ctx, await state.job_service.complete(key, body, "audio"))
