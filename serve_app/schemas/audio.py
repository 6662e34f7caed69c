"""Audio request bodies: speech (`POST /audio/speech`), transcription
(`POST /audio/transcriptions`, multipart), in the published shapes; the chat-completion
convention's fields are accepted too."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

AudioFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input: str = Field(min_length=1, max_length=4096)
    model: str = Field(default="default", min_length=1)
    voice: str | None = Field(default=None, max_length=512)
    response_format: AudioFormat | None = None
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    streaming: bool = False
    language: str | None = Field(default=None, min_length=2, max_length=32)
    prompt: str | None = Field(default=None, max_length=500)  # style prompts: not supported
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    instructions: str | None = None  # the `openai` SDK's field; ignored like `prompt`

    @field_validator("input")
    @classmethod
    def _words(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must contain text to read, not only spaces")
        return value


class TranscriptionRequest(BaseModel):
    """The form fields beside the uploaded `file`."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="default", min_length=1)
    response_format: Literal["json", "text", "verbose_json"] = "json"
    timestamps: bool = False
    language: str | None = Field(default=None, min_length=2, max_length=16)
    prompt: str | None = None  # the `openai` SDK's field; not used by the engine
    temperature: float | None = Field(default=None, ge=0, le=1)


class QuoteAudioRequest(BaseModel):
    """`POST /audio/quote`: a duration as a number or a numeric string."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    duration_seconds: float | str | None = None
    character_count: int | None = Field(default=None, gt=0)


class VoiceChangerQuoteRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    duration_seconds: float | str | None = None


class QueueAudioRequest(BaseModel):
    """`POST /audio/queue`, in the published shape."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1, max_length=20000)
    duration_seconds: float | str | None = None
    voice: str | None = Field(default=None, max_length=128)
    speed: float | None = Field(default=None, ge=0.25, le=4.0)
    language_code: str | None = Field(default=None, min_length=2, max_length=8)
    lyrics_prompt: str | None = None
    force_instrumental: bool | None = None
    loop: bool | None = None
    lyrics_optimizer: bool | None = None
    callback_url: str | None = Field(default=None, min_length=1, max_length=2048, description=(
        "Where the signed job event is POSTed once the job ends (docs: Completion webhooks)"))

    @field_validator("prompt")
    @classmethod
    def _words(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prompt must contain text, not only spaces")
        return value


class VoiceChangerQueueRequest(BaseModel):
    """`POST /audio/voice-changer/queue`: the fields of a JSON body, or the plain fields of a
    multipart form beside its `file` (booleans and the seed then come as text). Strict: an
    unknown field is refused."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    audio_url: str | None = Field(default=None, min_length=1, max_length=2048)
    voice: str | None = Field(default=None, min_length=1, max_length=60)
    remove_background_noise: bool | None = None
    seed: int | None = Field(default=None, ge=0)
    callback_url: str | None = Field(default=None, min_length=1, max_length=2048, description=(
        "Where the signed job event is POSTed once the job ends (docs: Completion webhooks)"))
