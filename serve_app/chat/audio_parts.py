"""Audio parts of a chat (`input_audio`), heard before the model sees them, as files are read:
the transcription deployment (the default `asr` model, the one `/audio/transcriptions` uses)
turns each into a text part `[Audio]` followed by its transcript, and the seconds it heard are
charged with the chat at that model's catalog price (`per_audio_second`). Each part's size is
checked from its base64 length, and its declared format against those the transcription model
reads, before the hold (nothing decoded); the base64 is decoded before any other work of the
request (URLs fetched, the web read), the audio itself in the transcription replica."""

from __future__ import annotations

import math
from collections.abc import Callable

from deployments.protocol import Transcription, TranscriptionRequest
from serve_app.billing.pricing import PricedLine, nanos_of, unit_price_usd
from serve_app.chat.parts import decode_payload, replace_parts
from serve_app.errors import ApiError, UnsupportedFeature, nest_errors, payload_too_large
from serve_app.models.calls import call_model
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter
from serve_app.schemas.chat import AudioPart, ChatCompletionRequest, TextPart

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # as `/audio/transcriptions` takes
# Containers the transcription replica decodes (through its audio decoder), as `format` names.
AUDIO_FORMATS = frozenset({"wav", "mp3", "mpeg", "mpga", "flac", "ogg", "opus", "m4a", "mp4",
                           "aac", "webm"})
DEFAULT_MAX_AUDIO_SECONDS = 1800  # a transcription model's cap unless its catalog sets one
_FIELD = "messages"
_TOO_LARGE = f"Audio inputs must be under {MAX_AUDIO_BYTES // (1024 * 1024)} MB"


def audio_parts(req: ChatCompletionRequest) -> int:
    return len(_parts(req))


def most_seconds(model: CatalogModel) -> int:
    """The most audio one part may hold: the transcription model's `max_seconds`."""
    most = model.engine_options.max_seconds
    return int(DEFAULT_MAX_AUDIO_SECONDS if most is None else most)


def heard_line(model: CatalogModel, seconds: int) -> PricedLine:
    """`seconds` heard by `model`, at its price, as a line of the chat's entry."""
    per_second = unit_price_usd(model, "audio_seconds")
    return PricedLine("audio_seconds", seconds, nanos_of(per_second, seconds),
                      float(per_second))


def _parts(req: ChatCompletionRequest) -> list[AudioPart]:
    return [p for m in req.messages if isinstance(m.content, list) for p in m.content
            if isinstance(p, AudioPart)]


def check_audio_parts(req: ChatCompletionRequest) -> None:
    """Every audio part's declared format and size (from its base64 length), before any work
    is done for the request: a 400 INVALID_AUDIO_FORMAT or a 413, nothing decoded."""
    for part in _parts(req):
        fmt = part.input_audio.format.lower()
        if fmt not in AUDIO_FORMATS:
            message = (f"input_audio.format {part.input_audio.format!r} is not supported; "
                       f"use one of {', '.join(sorted(AUDIO_FORMATS))}")
            raise ApiError(400, message, code="INVALID_AUDIO_FORMAT",
                           details=nest_errors([((_FIELD,), message)]))
        data = part.input_audio.data
        prefix = data.find(",") + 1 if data.startswith("data:") else 0  # a data: URL's
        if (len(data) - prefix) * 3 // 4 > MAX_AUDIO_BYTES:
            raise payload_too_large(_TOO_LARGE)


def decode_audio_parts(req: ChatCompletionRequest) -> list[bytes]:
    """The bytes of every audio part, in order (413 over the size, 400 when not base64)."""
    return [decode_payload(part.input_audio.data, MAX_AUDIO_BYTES, _TOO_LARGE,
                           "input_audio.data is not valid base64")[0] for part in _parts(req)]


class AudioReader:
    """Hears the audio parts of a chat request through the router's transcription model."""

    def __init__(self, router: ModelRouter) -> None:
        self.router = router

    def transcriber(self) -> CatalogModel:
        """The model that hears audio parts (a 400 when the server has none)."""
        try:
            return self.router.resolve("default", "asr").model
        except ApiError as exc:
            raise UnsupportedFeature("This server has no transcription model for audio "
                                     "inputs (input_audio)", _FIELD) from exc

    async def _hear(self, model: CatalogModel, audio: bytes) -> Transcription:
        heard: Transcription = await call_model(
            self.router.transcription(model).transcribe, model.id, model.id,
            TranscriptionRequest(audio, None, False))
        return heard

    async def inline(self, req: ChatCompletionRequest, model: CatalogModel,
                     heard: Callable[[int], None],
                     decoded: list[bytes] | None = None) -> ChatCompletionRequest:
        """`req` with each audio part replaced by a text part of its transcript; `heard` is
        told the seconds of each part as soon as it is heard (its started seconds, at least
        one), so that they are charged even when a later part or the chat fails. `decoded`:
        the parts' bytes, in order (`decode_audio_parts`); decoded here when not given, every
        part before the first is heard: a part refused by that costs nothing."""
        pending = iter(decoded if decoded is not None else decode_audio_parts(req))

        async def as_text(part: AudioPart) -> TextPart:
            transcript = await self._hear(model, next(pending))
            heard(max(1, math.ceil(transcript.duration)))
            return TextPart(type="text", text=f"[Audio]\n{transcript.text.strip()}")

        return await replace_parts(req, AudioPart, as_text)
