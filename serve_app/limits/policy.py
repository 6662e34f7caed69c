"""What is limited and how much: the spec's default table per class, the partner columns,
per-model overrides from the catalog, the tiers of configs/rate_limit_tiers.yaml, and the
error-budget thresholds."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from serve_app.domain import DEFAULT_RATE_LIMIT_TIER
from serve_app.models.catalog import CatalogModel

logger = logging.getLogger("serve_app.limits")

WINDOW_MS = 60_000  # requests and tokens per minute
BUDGET_WINDOW_MS = 30_000  # error budgets roll over 30 seconds
FAILED_REQUESTS_MAX = 50
UNSUPPORTED_FEATURE_MAX = 200
# Images one account may send that the gateway refuses after reading their header (any key or
# wallet of the account): past it, its images are refused with 429 before they are read.
REFUSED_IMAGES_MAX = 20
# Requests a key, and an account over all its keys and wallets, may leave before their answer
# began (499) in BUDGET_WINDOW_MS: a hold given back costs nothing, and an engine that cannot
# stop mid-pass (an upscale) finishes for nobody; past either, 429 before the next is admitted.
CLIENT_GONE_MAX = 60
CLIENT_GONE_ACCOUNT_MAX = 120
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


# class -> (requests/min, tokens/min, partner requests/min, partner tokens/min) of one tier.
TierTable = Mapping[str, tuple[int, int | None, int, int | None]]

TierName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]
_Amount = Annotated[int, Field(gt=0)]


class ClassLimits(BaseModel):
    """One class of one tier in configs/rate_limit_tiers.yaml; every number must be given
    (tokens may be null: no token limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: _Amount
    tokens_per_minute: _Amount | None
    partner_requests_per_minute: _Amount
    partner_tokens_per_minute: _Amount | None

    def row(self) -> tuple[int, int | None, int, int | None]:
        return (self.requests_per_minute, self.tokens_per_minute,
                self.partner_requests_per_minute, self.partner_tokens_per_minute)


class TierFile(BaseModel):
    """configs/rate_limit_tiers.yaml: tier name -> class -> limits, every class listed; and
    each tier's share of a busy engine (`shares`, 1 when not listed)."""

    model_config = ConfigDict(extra="forbid")

    tiers: dict[TierName, dict[str, ClassLimits]] = Field(default_factory=dict)
    shares: dict[TierName, Annotated[float, Field(gt=0, le=1000)]] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _every_class(self) -> TierFile:
        for name, table in self.tiers.items():
            missing = [c for c in DEFAULT_LIMITS if c not in table]
            unknown = [c for c in table if c not in DEFAULT_LIMITS]
            if missing or unknown:
                raise ValueError(f"tier {name!r} must list exactly the classes "
                                 f"{', '.join(DEFAULT_LIMITS)} (missing: {missing}, "
                                 f"unknown: {unknown})")
        unlisted = [name for name in self.shares
                    if name not in self.tiers and name != DEFAULT_RATE_LIMIT_TIER]
        if unlisted:
            raise ValueError(f"shares name tiers that are not listed: {unlisted}")
        return self


@dataclass(frozen=True)
class RateLimitTiers:
    """The tiers a replica knows, loaded once at start; `default` is always among them."""

    tables: Mapping[str, TierTable]
    shares: Mapping[str, float] = field(default_factory=dict)
    _warned: set[str] = field(default_factory=set, compare=False, repr=False)

    @classmethod
    def builtin(cls) -> RateLimitTiers:
        return cls({DEFAULT_RATE_LIMIT_TIER: DEFAULT_LIMITS})

    @property
    def names(self) -> list[str]:
        return list(self.tables)

    def __contains__(self, name: object) -> bool:
        return name in self.tables

    def resolve(self, name: str) -> tuple[str, TierTable]:
        """The tier `name` and its table; a tier this replica does not know (removed from
        the file after it was set) gets the default tier, with a warning once."""
        table = self.tables.get(name)
        if table is not None:
            return name, table
        if name not in self._warned:
            self._warned.add(name)
            logger.warning("rate-limit tier %r is not in the tier file; the default tier "
                           "applies", name)
        return DEFAULT_RATE_LIMIT_TIER, self.tables[DEFAULT_RATE_LIMIT_TIER]

    def share(self, name: str) -> float:
        """The weight of tier `name` in a busy engine's fair share (deployments/fair_share.py):
        an account of a tier with share 2 is served twice the tokens of one with share 1 while
        both wait. 1 for a tier the file gives no share (and for an unknown tier: the
        default's)."""
        if name not in self.tables:
            name = DEFAULT_RATE_LIMIT_TIER
        return self.shares.get(name, 1.0)


BUILTIN_TIERS = RateLimitTiers.builtin()


def load_tiers(path: str | Path) -> RateLimitTiers:
    """Read and check the tier file (RATE_LIMIT_TIERS); a file without a `default` tier gets
    the spec's table as `default`. Raises ValueError naming the file on any mistake."""
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    try:
        parsed = TierFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid rate-limit tiers: {exc}") from exc
    tables: dict[str, TierTable] = {
        name: {cls: limits.row() for cls, limits in table.items()}
        for name, table in parsed.tiers.items()}
    tables.setdefault(DEFAULT_RATE_LIMIT_TIER, DEFAULT_LIMITS)
    return RateLimitTiers(tables, dict(parsed.shares))


def api_tier_id(tier: str, *, is_partner: bool) -> str:
    """The tier as answers name it (`apiTier.id` of `/api_keys/rate_limits`, `rateLimitTier`
    of its log): the tier's name; the default tier keeps the names `paid` and `partner`."""
    if tier != DEFAULT_RATE_LIMIT_TIER:
        return tier
    return "partner" if is_partner else "paid"


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int | None
    bucket: str  # what the count is kept per: the class, or the model when it has its own
    tier_name: str = DEFAULT_RATE_LIMIT_TIER  # the tier whose numbers these are

    @property
    def tier(self) -> str:
        return api_tier_id(self.tier_name, is_partner=self.bucket.startswith("partner:"))


def limits_for(model: CatalogModel, *, is_partner: bool, tier: str = DEFAULT_RATE_LIMIT_TIER,
               tiers: RateLimitTiers | None = None) -> Limits | None:
    """The per-minute limits of `model` for a (partner) account on `tier` of `tiers` (the
    built-in default table when None); None: not rate limited. The catalog's per-model
    overrides apply on the default tier only."""
    cls = model.rate_limit_class
    if cls is None:
        return None  # video, music and voice-changer jobs are billed per job, not limited
    tier, table = (tiers or BUILTIN_TIERS).resolve(tier)
    rpm, tpm, partner_rpm, partner_tpm = table[cls]
    if is_partner:
        rpm, tpm = partner_rpm, partner_tpm
    bucket = f"class:{cls}"
    override = model.rate_limits
    if override and tier == DEFAULT_RATE_LIMIT_TIER:
        rpm = override.get("partner_requests_per_minute" if is_partner else
                           "requests_per_minute", rpm)
        tpm = override.get("partner_tokens_per_minute" if is_partner else
                           "tokens_per_minute", tpm)
        bucket = f"model:{model.id}"
    return Limits(rpm, tpm, ("partner:" if is_partner else "") + bucket, tier)
