"""The making of a voice change, as the job worker calls it (jobs/worker.py `JobMaker`): the
source is heard by the voice changer's transcription model, and what was heard is read aloud
by its speech model in the job's voice, each through one call to that model's deployment.

It is transcribe-then-speak: the words come through, the speaker's pacing, intonation and
pauses do not. Both calls run at the engines' fair-share gates as the caller's tenant. The
transcription engine opens the source as the format the Gateway judged it to be and decodes
no more than the seconds it was billed for (plus `DECODE_TOLERANCE_S`): a source that holds
more (its measure was fooled) fails the job, nothing charged, before Whisper hears any of it.
A source in which nothing is heard fails the job (422 NO_SPEECH_HEARD) and is charged: it was
decoded and heard in full.
"""

from __future__ import annotations

from deployments.protocol import MediaJob, MediaResult, Transcription, TranscriptionRequest
from serve_app.errors import ApiError
from serve_app.jobs.worker import ChargedFailure
from serve_app.models.calls import call_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter

# The input name of the source audio in a voice-change job (the result store's key suffix).
SOURCE_INPUT = "source"
# What the engine may decode past the measured length: decoders add an encoder's delay and
# padding, and a measure from packet times may miss a fraction of a second at a join.
DECODE_TOLERANCE_S = 2.0


class VoicePipeline:
    """Makes voice-change jobs: hear, then speak."""

    def __init__(self, catalog: Catalog, router: ModelRouter) -> None:
        self.catalog = catalog
        self.router = router

    async def make(self, model: CatalogModel, job: MediaJob) -> MediaResult:
        spec = model.voice_changer
        if spec is None:
            raise ApiError(500, f"{model.id} is not a voice changer", code="INFERENCE_FAILED")
        hearing = self.catalog.by_id[spec.transcription]
        speaking = self.catalog.by_id[spec.speech]
        params = job.params
        heard: Transcription = await call_model(
            self.router.transcription(hearing).transcribe, hearing.id, hearing.id,
            TranscriptionRequest(job.inputs[SOURCE_INPUT], None, False, job.tenant,
                                 demuxer=params.get("source_format"),
                                 max_seconds=float(params["source_seconds"])
                                 + DECODE_TOLERANCE_S))
        text = " ".join(heard.text.split())
        if not text:
            raise ChargedFailure(422, "No speech was heard in the source audio, so there was "
                                      "nothing to say in another voice; the source's decoding "
                                      "and transcription were charged",
                                 code="NO_SPEECH_HEARD")
        spoken: MediaResult = await call_model(
            self.router.speech(speaking).synthesize, speaking.id, speaking.id,
            MediaJob({"prompt": text, "voice": params["voice"],
                      "format": params["format"], "speed": 1.0}, tenant=job.tenant))
        return MediaResult(spoken.media, spoken.media_type,
                           heard.replica_ms + spoken.replica_ms)
