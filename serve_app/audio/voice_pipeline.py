"""The making of a voice change, as the job runner calls it (jobs/runner.py `JobMaker`): the
source is heard by the voice changer's transcription model, and what was heard is read aloud
by its speech model in the job's voice, each through one call to that model's deployment.

It is transcribe-then-speak: the words come through, the speaker's pacing, intonation and
pauses do not. A source in which nothing is heard fails the job (422 NO_SPEECH_HEARD), so its
hold is released and nothing is charged.
"""

from __future__ import annotations

from deployments.protocol import MediaJob, MediaResult, Transcription, TranscriptionRequest
from serve_app.errors import ApiError
from serve_app.models.calls import call_model
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.router import ModelRouter

# The input name of the source audio in a voice-change job (the result store's key suffix).
SOURCE_INPUT = "source"


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
        heard: Transcription = await call_model(
            self.router.transcription(hearing).transcribe, hearing.id, hearing.id,
            TranscriptionRequest(job.inputs[SOURCE_INPUT], None, False))
        text = " ".join(heard.text.split())
        if not text:
            raise ApiError(422, "No speech was heard in the source audio, so there was nothing "
                                "to say in another voice; nothing was charged",
                           code="NO_SPEECH_HEARD")
        spoken: MediaResult = await call_model(
            self.router.speech(speaking).synthesize, speaking.id, speaking.id,
            MediaJob({"prompt": text, "voice": job.params["voice"],
                      "format": job.params["format"], "speed": 1.0}))
        return MediaResult(spoken.media, spoken.media_type,
                           heard.replica_ms + spoken.replica_ms)
