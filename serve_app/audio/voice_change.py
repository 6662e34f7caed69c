"""Voice changes as the routes see them (`/audio/voice-changer/quote|queue|retrieve|complete`):
the model (a voice changer, else a 400 naming the endpoint to use), the fields, then the job.

A queue request does its work in the order that keeps abuse cheap:

1. the caller is known (the route's dependencies authenticate before the body is read);
2. the model is a voice changer (400);
3. admitted (jobs/intake.py, pipeline/bill.py): the account's limits (429), the fields fit
   the model (one source exactly, a voice it has, only the options it supports: 400s), a
   hold of the first minute's price, the least a change costs (402 for an account that
   cannot pay that), the model online (503);
4. only then is the source read: the upload's bytes, or `audio_url` fetched (30 s, under
   25 MB); its format judged from its bytes and its length measured, off the event loop
   (sources.py);
5. too long: 422, the hold released, nothing charged; else its price (whole minutes, rounded
   up) held in place of the first (402 when the account cannot pay it, nothing charged); a
   chained or grouped Ogg file is a 400 (sources.py), and the engine decodes no more than
   the measured seconds (voice_pipeline.py);
6. the source kept in the result store (it goes once the job is made, or with a failed job),
   and the job queued with the caller's tenant (its share at the engines' gates). The runner
   makes it (voice_pipeline.py), then settles or releases.
"""

from __future__ import annotations

from typing import Any

from serve_app.accounts.key_store import KeyRecord
from serve_app.audio.sources import SourceAudio, check_source
from serve_app.audio.voice_pipeline import SOURCE_INPUT
from serve_app.billing.pricing.audio import (
    parse_seconds,
    quote_usd,
    source_too_long,
    voice_change_cost,
    voice_change_floor,
)
from serve_app.errors import invalid_request
from serve_app.images.inputs import MediaSourceReader
from serve_app.jobs.service import JobService
from serve_app.models.catalog import CatalogModel
from serve_app.models.chains import VoiceChangerSpec
from serve_app.models.router import ModelRouter, RoutedModel
from serve_app.pipeline.context import RequestContext
from serve_app.schemas.audio import VoiceChangerQueueRequest, VoiceChangerQuoteRequest

KIND = "voice-change"  # the job kind of a voice change
SOURCE_MEDIA_TYPES = {"mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg",
                      "flac": "audio/flac"}


def check_not_voice_changer(model: CatalogModel, endpoint: str) -> None:
    """The other audio endpoints refuse a voice changer, naming its own endpoint."""
    if model.operation == "voice-change":
        raise invalid_request(f"{model.id} is a voice-changer model: use "
                              f"POST /audio/voice-changer/{endpoint}", "model")


class VoiceChanger:
    """Voice-change quotes and jobs."""

    def __init__(self, router: ModelRouter, job_service: JobService,
                 sources: MediaSourceReader) -> None:
        self.router = router
        self.job_service = job_service
        self.sources = sources  # fetches `audio_url` (30 s, under 25 MB, public hosts)

    def model(self, name: str, endpoint: str) -> RoutedModel:
        """A voice changer by name; any other music model is a 400 naming its endpoint."""
        routed = self.router.resolve(name, "music")
        if routed.model.voice_changer is None:
            raise invalid_request(f"{routed.model.id} is not a voice-changer model: use "
                                  f"POST /audio/{endpoint}", "model")
        return routed

    def quote(self, body: VoiceChangerQuoteRequest) -> dict[str, float | int]:
        model = self.model(body.model, "quote").model
        seconds = parse_seconds(body.duration_seconds)
        cost = voice_change_cost(model, seconds)
        assert seconds is not None  # voice_change_cost requires it
        return {"quote": quote_usd(cost),
                "duration_seconds": int(seconds) if seconds.is_integer() else seconds}

    async def queue(self, ctx: RequestContext, key: KeyRecord, body: VoiceChangerQueueRequest,
                    upload: bytes | None) -> dict[str, Any]:
        routed = self.model(body.model, "queue")
        model = routed.model
        spec = model.voice_changer
        assert spec is not None

        async with self.job_service.intake(ctx, key, routed, KIND,
                                           body.callback_url) as intake:
            field = _check_fields(model, spec, body, upload)  # 400
            voice = _voice(model, spec, body.voice)
            await intake.admit(voice_change_floor(model))  # the least a change costs
            async with self.job_service.fetch_slots.slot(key.account_id):
                data = upload if upload is not None else await self.sources.read(
                    body.audio_url or "", field, allow_urls=True, media="audio")
                source = await check_source(data, field, spec.accepted_audio_formats,
                                            spec.max_source_audio_duration_seconds)
            if source.seconds > spec.max_source_audio_duration_seconds:
                raise source_too_long(model, source.seconds)
            cost = voice_change_cost(model, source.seconds)
            await intake.hold(cost)
            await intake.keep(SOURCE_INPUT, data, SOURCE_MEDIA_TYPES[source.format])
            del data
            job = await intake.queue(cost, _params(spec, voice, source))
        return {"model": model.id, "queue_id": job.queue_id, "status": "QUEUED",
                "duration_seconds": source.seconds}


def _check_fields(model: CatalogModel, spec: VoiceChangerSpec,
                  body: VoiceChangerQueueRequest, upload: bytes | None) -> str:
    """400 for what the model cannot take; the name of the field the source comes in."""
    if (upload is None) == (body.audio_url is None):
        both = upload is not None
        message = ("give the source audio once: a `file` upload or an `audio_url`, not both"
                   if both else "the source audio is required: a `file` upload "
                                "(multipart/form-data) or an `audio_url` (JSON)")
        raise invalid_request(message, "audio_url" if both else "file")
    if body.audio_url is not None and not body.audio_url.strip().lower().startswith(
            ("http://", "https://")):
        raise invalid_request("audio_url must be an http or https URL", "audio_url")
    if body.remove_background_noise and not spec.supports_background_noise_removal:
        raise invalid_request(f"{model.id} does not support remove_background_noise",
                              "remove_background_noise")
    if body.seed is not None and not spec.supports_seed:
        raise invalid_request(f"{model.id} does not support seed", "seed")
    return "file" if upload is not None else "audio_url"


def _voice(model: CatalogModel, spec: VoiceChangerSpec, requested: str | None) -> str:
    """One of the model's voices (any case), or its default voice."""
    if requested is None:
        return spec.default_voice
    by_name = {v.lower(): v for v in model.voices}
    if requested.lower() not in by_name:
        raise invalid_request(f"voice {requested!r} is not offered by {model.id}; use one of "
                              f"{', '.join(model.voices)}", "voice")
    return by_name[requested.lower()]


def _params(spec: VoiceChangerSpec, voice: str, source: SourceAudio) -> dict[str, Any]:
    return {"voice": voice, "format": spec.output_format, "source_format": source.format,
            "source_seconds": source.seconds}
