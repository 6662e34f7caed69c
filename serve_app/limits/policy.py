"""What is limited and how much: the spec's default table per class, the partner columns,
per-model overrides from the catalog, and the error-budget thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.catalog import CatalogModel

WINDOW_MS = 60_000  # requests and tokens per minute
BUDGET_WINDOW_MS = 30_000  # error budgets roll over 30 seconds
FAILED_REQUESTS_MAX = 50
UNSUPPORTED_FEATURE_MAX = 200
API_KEY_CREATIONS_PER_MINUTE = 20

# class -> (requests/min, tokens/min, partner requests/min, partner tokens/min); None: none.
DEFAULT_LIMITS: dict[str, tuple[int, int | None, int, int | None]] = {
    "XS": (500, 5_000_000, 500, 10_000_000),  # also every embedding model
    "S": (150, 3_000_000, 300, 6_000_000),
    "M": (100, 2_000_000, 200, 4_000_000),
    "L": (100, 2_000_000, 150, 3_000_000),
    "IMAGE": (20, None, 60, None),  # image, upscale, inpaint
    "SPEECH": (60, None, 120, None),  # speech and transcription
}


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int | None
    bucket: str  # what the count is kept per: the class, or the model when it has its own

    @property
    def tier(self) -> str:
        return "partner" if self.bucket.startswith("partner:") else "paid"


def limits_for(model: CatalogModel, *, is_partner: bool,
               table: dict[str, tuple[int, int | None, int, int | None]] | None = None
               ) -> Limits | None:
    """The per-minute limits of `model` for a (partner) account; None: not rate limited."""
    cls = model.rate_limit_class
    if cls is None:
        return None  # video, music and voice-changer jobs are billed per job, not limited
    rpm, tpm, partner_rpm, partner_tpm = (table or DEFAULT_LIMITS)[cls]
    if is_partner:
        rpm, tpm = partner_rpm, partner_tpm
    bucket = f"class:{cls}"
    override = model.rate_limits
    if override:
        rpm = override.get("partner_requests_per_minute" if is_partner else
                           "requests_per_minute", rpm)
        tpm = override.get("partner_tokens_per_minute" if is_partner else
                           "tokens_per_minute", tpm)
        bucket = f"model:{model.id}"
    return Limits(rpm, tpm, ("partner:" if is_partner else "") + bucket)
