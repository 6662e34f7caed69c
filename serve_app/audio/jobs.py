"""Queued audio (`/audio/quote`, `/audio/queue`): the price from the model's catalog table
(pricing/audio.py), and a job that holds it and is made by the model's deployment (a Piper
voice reads the prompt for speech models). Voice changers have their own endpoints
(voice_change.py) and are refused here."""

from __future__ import annotations

from serve_app.accounts.key_store import KeyRecord
from serve_app.audio.serving import pick_voice
from serve_app.audio.voice_change import check_not_voice_changer
from serve_app.billing.pricing.audio import audio_cost, parse_seconds, quote_usd
from serve_app.errors import invalid_request
from serve_app.jobs.service import JobService
from serve_app.models.catalog import CatalogModel
from serve_app.models.router import ModelRouter
from serve_app.pipeline.context import RequestContext
from serve_app.schemas.audio import QueueAudioRequest, QuoteAudioRequest

DEFAULT_PROMPT_LIMIT = 5000


class QueuedAudio:
    """Queued audio: quotes from the catalog, and jobs queued at their price."""

    def __init__(self, router: ModelRouter, job_service: JobService) -> None:
        self.router = router
        self.job_service = job_service

    def quote(self, body: QuoteAudioRequest) -> dict[str, float]:
        model = self.router.resolve(body.model, "music").model
        cost = audio_cost(model, duration_seconds=parse_seconds(body.duration_seconds),
                          character_count=body.character_count)
        return {"quote": quote_usd(cost)}

    async def queue(self, ctx: RequestContext, key: KeyRecord,
                    body: QueueAudioRequest) -> dict[str, str]:
        routed = self.router.resolve(body.model, "music")
        model = routed.model
        check_not_voice_changer(model, "queue")

        async with self.job_service.intake(ctx, key, routed, "audio",
                                           body.callback_url) as intake:
            given = model.audio_constraints.prompt_character_limit  # the checks (400)
            limit = DEFAULT_PROMPT_LIMIT if given is None else given
            if len(body.prompt) > limit:
                raise invalid_request(f"prompt is {len(body.prompt)} characters; {model.id} "
                                      f"takes at most {limit}", "prompt")
            _unsupported(model, body)
            voice = _voice(model, body.voice)
            cost = audio_cost(model, duration_seconds=parse_seconds(body.duration_seconds),
                              character_count=len(body.prompt))
            await intake.admit(cost)  # its price, known without inputs
            job = await intake.queue(cost, {
                "prompt": body.prompt, "voice": voice, "speed": body.speed or 1.0,
                "format": model.default_format or "mp3",
                "duration_seconds": parse_seconds(body.duration_seconds)})
        return {"model": model.id, "queue_id": job.queue_id, "status": "QUEUED"}


def _voice(model: CatalogModel, requested: str | None) -> str:
    if not model.voices:  # a queued model without voices is asked for none (a 400, not 500)
        raise invalid_request(f"{model.id} offers no voices", "voice")
    return pick_voice(model, requested)


def _unsupported(model: CatalogModel, body: QueueAudioRequest) -> None:
    """Options a model does not support are refused, as the model listing says."""
    offers = model.audio_constraints
    supported = {"lyrics_prompt": offers.supports_lyrics,
                 "force_instrumental": offers.supports_force_instrumental,
                 "loop": offers.supports_loop, "lyrics_optimizer": offers.supports_lyrics_optimizer,
                 "language_code": offers.supports_language_code, "speed": offers.supports_speed}
    for field, flag in supported.items():
        if getattr(body, field) is not None and not flag:
            raise invalid_request(f"{model.id} does not support {field}", field)


