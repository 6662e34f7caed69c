"""Models made of other models of the catalog. A voice changer (`operation: voice-change`) runs
no engine of its own: it hears the source audio with a transcription model of the catalog,
then reads what it heard aloud with a speech model of the catalog, in one of that model's
voices. Its catalog entry names both (`voice_changer:`), typed here, and what it accepts; the
catalog checks that the models it names exist and fit (catalog.py `Catalog._consistent`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Containers a voice changer may accept: those the Gateway recognises from their first bytes
# and the transcription replica decodes (serve_app/audio/sources.py).
VoiceChangerFormat = Literal["mp3", "wav", "ogg", "flac"]


class VoiceChangerSpec(BaseModel):
    """What a voice changer chains and accepts.

    `transcription`: the id of the `asr` model that hears the source; `speech`: the id of the
    `tts` model that reads it aloud (the voice changer's `voices` are some of its voices, and
    `default_voice` one of those); `max_source_audio_duration_seconds`: the longest source
    accepted (at most what the transcription model hears); the options the reference's
    voice changers have, which these models do not support (refused when asked)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    transcription: str = Field(min_length=1)
    speech: str = Field(min_length=1)
    default_voice: str = Field(min_length=1, max_length=60)
    accepted_audio_formats: tuple[VoiceChangerFormat, ...] = ("mp3", "wav", "ogg", "flac")
    max_source_audio_duration_seconds: int = Field(default=300, gt=0)
    supports_background_noise_removal: bool = False
    supports_seed: bool = False
    # The format of the changed audio (one of the speech model's formats).
    output_format: Literal["mp3", "opus", "aac", "flac", "wav"] = "mp3"

    @model_validator(mode="after")
    def _some_format(self) -> VoiceChangerSpec:
        if not self.accepted_audio_formats:
            raise ValueError("a voice changer must accept at least one audio format")
        return self

    def public_fields(self, voices: list[str]) -> dict[str, Any]:
        """Its fields of the public model record (`model_spec`), in the reference's names."""
        return {
            "voice_changer": True,
            "accepted_audio_formats": list(self.accepted_audio_formats),
            "max_source_audio_duration_seconds": self.max_source_audio_duration_seconds,
            "supports_background_noise_removal": self.supports_background_noise_removal,
            "supports_seed": self.supports_seed,
            "voices": list(voices),
            "default_voice": self.default_voice,
            "supports_custom_voice_id": False,
        }
