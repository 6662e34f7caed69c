"""Prices from the catalog: the most a request may cost (for the hold) and what it did cost.
Per unit: tokens and the priced lines here; images (images.py), queued video (video.py) and
queued audio (audio.py) beside it.

Catalog prices are USD (and DIEM) per million tokens for text and embeddings, per image for
image models, per thousand characters for speech, per second or minute for audio and video.
Amounts are integer nano-units (money.py); one DIEM pays for one USD of usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from serve_app.models.catalog import CatalogModel
from serve_app.money import NANOS_PER_UNIT

# line type -> (catalog pricing key, units per priced unit, unit name, usage-history label)
LINE_TYPES: dict[str, tuple[str, int, str, str]] = {
    "input": ("input", 1_000_000, "tokens", "Input"),
    "output": ("output", 1_000_000, "tokens", "Output"),
    "cache_read": ("cache_input", 1_000_000, "tokens", "Cache Read"),
    "cache_write": ("cache_write", 1_000_000, "tokens", "Cache Write"),
    "image": ("generation", 1, "images", "Image"),
    "characters": ("characters", 1_000, "chars", "Characters"),
    "seconds": ("seconds", 1, "seconds", "Seconds"),
    "minutes": ("minutes", 1, "minutes", "Minutes"),
    "credits": ("credits", 1, "credits", "Credits"),  # crypto RPC calls
    "input_images": ("inputImages", 1, "images", "Input Images"),  # edits: extra inputs
    "prompt_enhancement": ("enhancePrompt", 1, "requests", "Prompt Enhancement"),
    # Chat's usage-priced extras: searches the provider answered, pages scraped.
    "web_search": ("web_search", 1, "searches", "Web Search"),
    "web_scraping": ("web_scraping", 1, "pages", "Web Scraping"),
    # Speech: characters read aloud, priced per million as published (`input`); audio
    # transcribed, per second (`per_audio_second`).
    "speech_characters": ("input", 1_000_000, "chars", "Characters"),
    "audio_seconds": ("per_audio_second", 1, "seconds", "Audio Seconds"),
    # Queued video jobs (serve_app/billing/pricing/video.py prices them): seconds of video made (the
    # rate depends on the model's table), a job priced per generation, its audio track.
    "video_seconds": ("per_second", 1, "seconds", "Video Seconds"),
    "video_generations": ("per_generation", 1, "generations", "Generation"),
    "video_audio_seconds": ("audio_per_second", 1, "seconds", "Audio"),
    # Queued audio jobs (pricing/audio.py): per thousand characters, per second, or per
    # generation (flat, or by duration tier).
    "queued_characters": ("per_thousand_characters", 1_000, "chars", "Characters"),
    "audio_output_seconds": ("per_second", 1, "seconds", "Seconds"),
    "audio_generations": ("generation", 1, "generations", "Generation"),
    # Voice changes (pricing/audio.py): whole minutes of source audio, priced by tier.
    "audio_minutes": ("durations", 1, "minutes", "Minutes"),
}

# `modelType` of the analytics answer, per catalog model type.
ANALYTICS_MODEL_TYPE: dict[str, str | None] = {
    "text": "LLM", "image": "IMAGE", "upscale": "IMAGE", "inpaint": "IMAGE", "tts": "TTS",
    "asr": "ASR", "video": "VIDEO", "embedding": None, "music": None,
}


@dataclass(frozen=True, slots=True)
class PricedLine:
    line_type: str
    units: int
    nanos: int
    price_per_unit_usd: float  # per priced unit (per million tokens, per image, ...)

    @property
    def unit_scale(self) -> int:
        return LINE_TYPES[self.line_type][1]

    @property
    def label(self) -> str:
        return LINE_TYPES[self.line_type][3]


@dataclass(frozen=True, slots=True)
class Cost:
    model: CatalogModel
    lines: tuple[PricedLine, ...]

    @property
    def nanos(self) -> int:
        return sum(line.nanos for line in self.lines)

    @property
    def units(self) -> dict[str, int]:
        return {line.line_type: line.units for line in self.lines}


def unit_price_usd(model: CatalogModel, line_type: str) -> Decimal:
    key = LINE_TYPES[line_type][0]
    entry = model.pricing.get(key)
    if isinstance(entry, dict):
        entry = entry.get("usd")
    if entry is None:
        return Decimal(0)
    return Decimal(str(entry))


_UNIT_TYPES = {"image": "images", "upscale": "images", "inpaint": "images", "tts": "chars",
               "asr": "seconds", "video": "seconds", "music": "seconds",
               "crypto_rpc": "credits"}


def unit_type(model: CatalogModel) -> str:
    """The unit of the analytics answer: tokens, images, chars, seconds, minutes, credits (a
    voice changer bills whole minutes of its source)."""
    if model.voice_changer is not None:
        return "minutes"
    return unit_type_of(model.type)


def unit_type_of(model_type: str) -> str:
    return _UNIT_TYPES.get(model_type, "tokens")


def price(model: CatalogModel, units: dict[str, int]) -> Cost:
    """Price units per line type; each line is rounded up to a whole nano-unit."""
    lines = []
    for line_type, count in units.items():
        if count <= 0:
            continue
        per_unit = unit_price_usd(model, line_type)
        scale = LINE_TYPES[line_type][1]
        nanos = int((per_unit * count * NANOS_PER_UNIT / scale).to_integral_value(ROUND_CEILING))
        lines.append(PricedLine(line_type, count, nanos, float(per_unit)))
    return Cost(model, tuple(lines))


def token_units(model: CatalogModel, prompt_tokens: int, completion_tokens: int,
                cached_tokens: int = 0) -> dict[str, int]:
    """The priced lines of a text answer: the prompt's tokens served from the prefix cache at
    the model's cache-read price (`cache_input`), the rest at its input price; a model without
    a cache-read price bills the whole prompt at its input price."""
    cached = min(max(cached_tokens, 0), prompt_tokens)
    if model.pricing.get(LINE_TYPES["cache_read"][0]) is None:
        cached = 0
    return {"input": prompt_tokens - cached, "cache_read": cached, "output": completion_tokens}


def sku(model: CatalogModel, line_type: str) -> str:
    kind = {"text": "llm"}.get(model.type, model.type)
    unit = {1_000_000: "mtoken", 1_000: "kchar"}.get(LINE_TYPES[line_type][1], "unit")
    return f"{model.id}-{kind}-{line_type.replace('_', '-')}-{unit}"


def catalog_usd(entry: object) -> Decimal | None:
    """A catalog price (`{usd: ...}` or a bare number) as Decimal; None when absent."""
    if isinstance(entry, dict):
        entry = entry.get("usd")
    return None if entry is None else Decimal(str(entry))


def nanos_of(usd: Decimal, count: int = 1) -> int:
    """`count` units at `usd` each, in nano-USD, rounded up."""
    return int((usd * count * NANOS_PER_UNIT).to_integral_value(ROUND_CEILING))
