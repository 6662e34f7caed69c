"""What a queued audio job costs, from the model's `pricing` table in the catalog (the
published shapes): `per_thousand_characters` (speech read from the prompt), `per_second` (by
the duration asked, or the model's default), `durations` (tiers of `min_seconds` to
`max_seconds`, one price each), or `generation` (one price per job). Voice-changer models are
priced by the whole minutes of the source audio they change (rounded up), one `durations`
tier per number of minutes, on their own endpoints.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from serve_app.billing.pricing import Cost, PricedLine, nanos_of
from serve_app.errors import ApiError, invalid_request, nest_errors
from serve_app.models.catalog import CatalogModel
from serve_app.money import NANOS_PER_UNIT


def _usd(entry: Any) -> Decimal:
    return Decimal(str(entry["usd"] if isinstance(entry, dict) else entry))


def parse_seconds(value: Any, field: str = "duration_seconds") -> float | None:
    """A duration given as a number or a numeric string, greater than 0."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid_request(f"{field} must be a number of seconds", field)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            raise invalid_request(f"{field} must be a number of seconds", field) from None
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise invalid_request(f"{field} must be greater than 0", field)
    return float(value)


def has_duration_metadata(model: CatalogModel) -> bool:
    return "durations" in model.pricing or "per_second" in model.pricing


def audio_cost(model: CatalogModel, *, duration_seconds: float | None,
               character_count: int | None) -> Cost:
    """The price of one queued audio job on `model`."""
    if model.operation == "voice-change":
        raise invalid_request(f"{model.id} is a voice-changer model: quote it with "
                              "POST /audio/voice-changer/quote", "model")
    pricing = model.pricing
    if duration_seconds is not None and not has_duration_metadata(model):
        unit = "character" if "per_thousand_characters" in pricing else "generation"
        raise invalid_request(f"{model.id} takes no duration: it is priced per {unit}",
                              "duration_seconds")
    seconds = duration_seconds or model.audio_constraints.default_duration_seconds
    if "per_thousand_characters" in pricing:
        if character_count is None:
            raise invalid_request(f"character_count is required: {model.id} is priced per "
                                  "thousand characters", "character_count")
        if character_count <= 0:
            raise invalid_request("character_count must be greater than 0", "character_count")
        rate = _usd(pricing["per_thousand_characters"])
        line = PricedLine("queued_characters", character_count,
                          nanos_of(rate * character_count / 1000), float(rate))
    elif "per_second" in pricing:
        if seconds is None:
            raise invalid_request(f"duration_seconds is required for {model.id}",
                                  "duration_seconds")
        rate = _usd(pricing["per_second"])
        line = PricedLine("audio_output_seconds", max(1, math.ceil(seconds)),
                          nanos_of(rate * Decimal(str(seconds))), float(rate))
    elif "durations" in pricing:
        if seconds is None:
            raise invalid_request(f"duration_seconds is required for {model.id}",
                                  "duration_seconds")
        tier = next((t for t in pricing["durations"].values()
                     if t["min_seconds"] <= seconds <= t["max_seconds"]), None)
        if tier is None:
            low = min(t["min_seconds"] for t in pricing["durations"].values())
            high = max(t["max_seconds"] for t in pricing["durations"].values())
            raise invalid_request(f"duration_seconds must be {low} to {high} for {model.id}",
                                  "duration_seconds")
        rate = _usd(tier)
        line = PricedLine("audio_generations", 1, nanos_of(rate), float(rate))
    elif "generation" in pricing:
        rate = _usd(pricing["generation"])
        line = PricedLine("audio_generations", 1, nanos_of(rate), float(rate))
    else:
        raise ApiError(500, f"the catalog gives {model.id} no audio price",
                       code="UNKNOWN_ERROR")
    return Cost(model, (line,))


def voice_change_minutes(seconds: float) -> int:
    """The whole minutes a voice change of `seconds` of source audio is billed: rounded up,
    at least one."""
    return max(1, math.ceil(seconds / 60))


def source_too_long(model: CatalogModel, seconds: float) -> ApiError:
    spec = model.voice_changer
    most = spec.max_source_audio_duration_seconds if spec else 0
    return ApiError(422, f"The source audio lasts {seconds:g} s; {model.id} changes at most "
                         f"{most} s", code="AUDIO_DURATION_TOO_LONG",
                    details=nest_errors([(("duration_seconds",),
                                          f"at most {most} seconds")]))


def voice_change_cost(model: CatalogModel, duration_seconds: float | None) -> Cost:
    """A voice change of `duration_seconds` of source audio: the `durations` tier of its whole
    minutes (rounded up), keyed by the number of minutes. 422 past the model's longest
    source."""
    spec = model.voice_changer
    if model.operation != "voice-change" or spec is None:
        raise invalid_request(f"{model.id} is not a voice-changer model: quote it with "
                              "POST /audio/quote", "model")
    if duration_seconds is None:
        raise invalid_request("duration_seconds is required: the length of the audio to "
                              "change", "duration_seconds")
    if duration_seconds > spec.max_source_audio_duration_seconds:
        raise source_too_long(model, duration_seconds)
    minutes = voice_change_minutes(duration_seconds)
    rate = _usd(model.pricing["durations"][str(minutes)])
    return Cost(model, (PricedLine("audio_minutes", minutes, nanos_of(rate),
                                   float(rate / minutes)),))


def voice_change_floor(model: CatalogModel) -> Cost:
    """The least a voice change costs: its first minute (held before the source is read)."""
    return voice_change_cost(model, 1.0)


def quote_usd(cost: Cost) -> float:
    return round(cost.nanos / NANOS_PER_UNIT, 9)
