"""Speech and transcription between the router and the audio deployments: the model, the
limits (the SPEECH class), the hold, one call, the settlement. Speech is charged per character
read aloud: the whole input once all of its audio is out, or, for a streamed answer the client
leaves early or the model breaks off, the characters of the pieces it was sent. Transcription
is charged per second of audio heard (started seconds), after holding the most the model
accepts. A failure of ours before anything was delivered releases the hold.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from deployments import protocol
from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.pricing import Cost, price
from serve_app.errors import ApiError, invalid_request
from serve_app.models.calls import call_model, stream_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter
from serve_app.pipeline.bill import SETTLE, BilledEvents, Mark
from serve_app.pipeline.context import RequestContext
from serve_app.pipeline.runner import RequestRunner
from serve_app.schemas.audio import SpeechRequest, TranscriptionRequest

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac",
                 "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
# The chat-completion convention's voice names: clients send them by default, so they speak
# with the model's default voice rather than fail.
CONVENTION_VOICES = frozenset({"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx",
                               "nova", "sage", "shimmer", "verse", "marin", "cedar"})
DEFAULT_MAX_AUDIO_SECONDS = 1800


@dataclass(eq=False)
class Speech:
    """A speech answer on its way: its audio `pieces`, and what of it was delivered
    (`delivered`, which its bill reads when it closes). Streamed, the response settles the
    bill (`BilledStream`: `pieces` yields `SETTLE` once all the audio is out); whole,
    `whole()` reads the pieces."""

    model: CatalogModel
    cost: Cost  # of the whole input
    characters: int  # of the whole input
    first: protocol.SpeechPiece | None
    rest: AsyncIterator[Any]  # the deployment's stream: SpeechPiece, then its end
    sent: int = 0  # characters of the pieces delivered
    complete: bool = False  # all the audio is out
    pieces: AsyncIterator[bytes | Mark] = field(init=False)

    def __post_init__(self) -> None:
        self.pieces = self._audio()

    async def _audio(self) -> AsyncIterator[bytes | Mark]:
        """The audio, piece by piece. A piece counts as delivered when its consumer comes
        back for the next one (a streamed response: once it was written to the client); the
        whole input once the last piece is out."""
        piece = self.first
        while piece is not None:
            if piece.audio:
                yield piece.audio
            self.sent += piece.characters
            piece = await anext(self.rest, None)  # a failure here: `sent` is charged
        self.complete = True
        yield SETTLE

    def delivered(self) -> tuple[Cost | None, int | None]:
        """The whole input once all of its audio is out; else the characters of the pieces
        delivered (a client that left early, a model that broke off); else nothing."""
        if self.complete:
            return self.cost, None
        if self.sent > 0:
            return price(self.model, {"speech_characters": min(self.sent, self.characters)}), None
        return None, None

    async def stop(self) -> None:
        """Stop the synthesis (started or not: the deployment's stream is open from
        `speak` on)."""
        try:
            await self.pieces.aclose()  # type: ignore[attr-defined]
        finally:
            await self.rest.aclose()  # type: ignore[attr-defined]

    async def whole(self) -> bytes:
        """All the audio as one body: nothing of it is delivered unless all of it is."""
        try:
            return b"".join([p async for p in self.pieces if not isinstance(p, Mark)])
        except BaseException:
            self.sent = 0
            raise


def pick_voice(model: CatalogModel, requested: str | None) -> str:
    """The model's voice named by `requested` (any case); its first voice for none or a
    convention name (`alloy`, ...)."""
    if not model.voices:
        raise ApiError(500, f"Model {model.id} lists no voices", code="INFERENCE_FAILED")
    if requested is None or requested.lower() in CONVENTION_VOICES:
        return model.voices[0]
    by_name = {v.lower(): v for v in model.voices}
    if requested.lower() not in by_name:
        raise invalid_request(f"voice {requested!r} is not offered by {model.id}; use one of "
                              f"{', '.join(model.voices)}", "voice")
    return by_name[requested.lower()]


def _format(model: CatalogModel, requested: str | None) -> str:
    offered = model.supported_formats or list(CONTENT_TYPES)
    fmt = requested or model.default_format or offered[0]
    if fmt not in offered:
        raise invalid_request(f"response_format {fmt!r} is not offered by {model.id}; use one "
                              f"of {', '.join(offered)}", "response_format")
    return fmt


class AudioService:
    """Speech and transcription: the model, admission, one call, the settlement."""

    def __init__(self, router: ModelRouter, catalog: Catalog, runner: RequestRunner) -> None:
        self.router = router
        self.catalog = catalog
        self.runner = runner
        self.admission = runner.admission

    async def speak(self, ctx: RequestContext, key: KeyRecord, body: SpeechRequest
                    ) -> tuple[bytes | BilledEvents, str]:
        """The speech of `body.input`, and its media type: all of its audio, or, streamed
        (`body.streaming`), the pieces for the response that sends them and settles the bill.
        The first piece is ready when this returns, so a failure to start is an error
        answer, not a broken stream."""
        routed = self.router.resolve(body.model, "tts")
        model = routed.model
        cost = price(model, {"speech_characters": len(body.input)})
        async with self.runner.admit(ctx, key, routed) as bill:
            voice, fmt = pick_voice(model, body.voice), _format(model, body.response_format)
            await bill.hold(cost)
            handle = self.router.speech(model)
            with ctx.step("model"):
                stream = stream_model(handle.speak, model.id, model.id,
                                      protocol.SpeechRequest(body.input, voice, body.speed,
                                                             fmt, self.admission.tenant(key)))
                await anext(stream)  # SpeechStart: the voice is loaded and known
                first = await anext(stream, None)
            speech = Speech(model, cost, len(body.input), first, stream)
            bill.measure = speech.delivered
            if body.streaming:
                return bill.stream(speech.pieces, stop=speech.stop), CONTENT_TYPES[fmt]
            try:
                return await speech.whole(), CONTENT_TYPES[fmt]
            finally:
                await speech.stop()  # then the bill settles what was delivered

    async def transcribe(self, ctx: RequestContext, key: KeyRecord,
                         body: TranscriptionRequest, audio: bytes) -> protocol.Transcription:
        routed = self.router.resolve(body.model, "asr")
        model = routed.model
        given = model.engine_options.max_seconds
        most = int(DEFAULT_MAX_AUDIO_SECONDS if given is None else given)
        async with self.runner.admit(ctx, key, routed) as bill:
            await bill.hold(price(model, {"audio_seconds": most}))
            handle = self.router.transcription(model)
            with ctx.step("model"):
                out: protocol.Transcription = await call_model(
                    handle.transcribe, model.id, model.id,
                    protocol.TranscriptionRequest(audio, body.language, body.timestamps,
                                                  self.admission.tenant(key)))
            ctx.record("replica", out.replica_ms)
            bill.deliver(price(model, {"audio_seconds": max(1, math.ceil(out.duration))}))
        return out

    def voices(self, model_name: str | None) -> list[dict[str, str]]:
        """The voices of one speech model, or of all of them."""
        models = [self.router.resolve(model_name, "tts").model] if model_name else \
            self.catalog.of_type("tts")
        return [{"id": voice, "name": voice, "model": m.id} for m in models for voice in m.voices]


def transcription_payload(body: TranscriptionRequest, out: protocol.Transcription
                          ) -> dict[str, Any]:
    """`json` as published (text, duration, timestamps when asked); `verbose_json` as the
    chat-completion convention has it."""
    if body.response_format == "verbose_json":
        payload = {"task": "transcribe", "language": out.language,
                   "duration": out.duration, "text": out.text,
                   "segments": [{"id": i, **segment}
                                for i, segment in enumerate(out.segments)]}
        if body.timestamps:
            payload["words"] = out.words or []
        return payload
    payload = {"text": out.text, "duration": out.duration}
    if body.timestamps:
        payload["timestamps"] = {"word": out.words or [], "segment": out.segments}
    return payload


