"""A catalog model's `constraints`: what it accepts, one typed section per model family.

The family follows the model's `type`: `text` (sampling defaults), `image` / `inpaint` /
`upscale` (sizes, qualities, steps; the reference's camelCase names), `video` (durations,
resolutions, ratios, audio, consent, enhancement models), `music` (the queued audio models:
prompt limit, duration, speed and the options they support); the other types take none.
The public record publishes a section as the catalog wrote it (`Section.given()`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from serve_app.models.sections import Section


class SamplingDefault(Section):
    default: int | float


class TextConstraints(Section):
    """Sampling defaults a request that names none gets."""

    temperature: SamplingDefault | None = None
    top_p: SamplingDefault | None = None

    @property
    def default_temperature(self) -> float | None:
        return self.temperature.default if self.temperature else None

    @property
    def default_top_p(self) -> float | None:
        return self.top_p.default if self.top_p else None


class StepRange(Section):
    default: int | None = None
    max: int | None = None


class ImageConstraints(Section):
    """Image generation, edit and upscale models, under the reference's names."""

    aspect_ratios: list[str] | None = Field(default=None, alias="aspectRatios")
    resolutions: list[str] | None = None
    default_resolution: str | None = Field(default=None, alias="defaultResolution")
    qualities: list[str] | None = None
    default_quality: str | None = Field(default=None, alias="defaultQuality")
    prompt_character_limit: int | None = Field(default=None, alias="promptCharacterLimit")
    steps: StepRange | None = None
    width_height_divisor: int | None = Field(default=None, alias="widthHeightDivisor")


class ConsentPolicy(Section):
    """The consent a model asks for before it takes media that shows a face
    (serve_app/video/consent.py)."""

    flow: str
    aliases: list[str] = Field(default_factory=list)
    version: str
    policy_text: str
    docs_url: str | None = None


class EnhancementModels(Section):
    models: list[str] = Field(default_factory=list)


class VideoConstraints(Section):
    """Video models: what a job may ask for (serve_app/billing/pricing/video.py)."""

    durations: list[str] = Field(default_factory=list)
    resolutions: list[str] = Field(default_factory=list)
    default_resolution: str | None = None
    aspect_ratios: list[str] | None = None
    default_aspect_ratio: str = "16:9"
    audio: bool = False
    audio_configurable: bool = False
    fps: int | float | None = None
    generation_seconds: int | float = 1
    max_source_seconds: int | float = 30
    default_upscale_factor: int = 2
    prompt_character_limit: int | None = None
    refused_terms: list[str] = Field(default_factory=list)
    consent: ConsentPolicy | None = None
    model_type: str | None = None  # the published `model_type`, when not the operation's
    # Enhancement providers and the models each offers (`enhancement_model`).
    opencv: EnhancementModels | None = None
    realesrgan: EnhancementModels | None = None

    @property
    def enhancement_models(self) -> list[str]:
        """The enhancement models of every provider, in catalog order."""
        providers = [getattr(self, key) for key in self._given]
        return [name for provider in providers if isinstance(provider, EnhancementModels)
                for name in provider.models]


class AudioConstraints(Section):
    """Queued audio models (`music`): published on the record's `model_spec` itself."""

    prompt_character_limit: int | None = None
    default_duration_seconds: int | float | None = None
    min_speed: int | float | None = None
    max_speed: int | float | None = None
    supports_speed: bool = False
    supports_lyrics: bool = False
    supports_force_instrumental: bool = False
    supports_loop: bool = False
    supports_lyrics_optimizer: bool = False
    supports_language_code: bool = False


class NoConstraints(Section):
    """Embedding, speech and transcription models take no constraints."""


Constraints = (TextConstraints | ImageConstraints | VideoConstraints | AudioConstraints
               | NoConstraints)

SECTION_OF_TYPE: dict[str, type[Section]] = {
    "text": TextConstraints, "image": ImageConstraints, "inpaint": ImageConstraints,
    "upscale": ImageConstraints, "video": VideoConstraints, "music": AudioConstraints,
}


def constraints_of(model_type: Any, given: Any) -> Section:
    """The section of a model of `model_type` from the catalog's mapping (or a section)."""
    section = SECTION_OF_TYPE.get(model_type, NoConstraints)
    return section.model_validate({} if given is None else given)


# What a model of another family reads: nothing given, every default.
EMPTY_TEXT, EMPTY_IMAGE, EMPTY_VIDEO, EMPTY_AUDIO = (
    TextConstraints(), ImageConstraints(), VideoConstraints(), AudioConstraints())
