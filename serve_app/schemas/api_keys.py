"""Requests of `/api_keys`, with every field rule of the spec."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from serve_app.domain import ApiKeyType, LimitPeriod, ModelPrivacy
from serve_app.money import MAX_AMOUNT_UNITS

LimitAmount = Annotated[float, Field(ge=0, le=MAX_AMOUNT_UNITS)]

_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _parse_expiry(value: object) -> datetime | None:
    """`""` or null -> no expiry; `YYYY-MM-DD` -> that day's midnight UTC; an ISO 8601
    date-time (with `Z` or an offset; none means UTC) -> that instant."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        if _DATE_ONLY.match(value):
            return datetime.combine(date.fromisoformat(value), time(), tzinfo=UTC)
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError("must be an ISO 8601 date (YYYY-MM-DD) or date-time") from exc
    else:
        raise ValueError("must be a string")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


Expiry = Annotated[datetime | None, BeforeValidator(_parse_expiry)]


class ConsumptionLimit(BaseModel):
    model_config = ConfigDict(extra="ignore")

    usd: LimitAmount | None = None
    diem: LimitAmount | None = None
    vcu: LimitAmount | None = Field(
        default=None, description="Deprecated: DIEM's legacy name. Limits the same DIEM "
                                  "spending (1 VCU = 1 DIEM); with `diem` too, the lower holds.")


class CreateApiKeyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    apiKeyType: ApiKeyType = ApiKeyType.INFERENCE
    description: str = Field(default="", max_length=64)
    consumptionLimit: ConsumptionLimit | None = None
    limitPeriod: LimitPeriod = LimitPeriod.EPOCH
    modelPrivacy: ModelPrivacy = ModelPrivacy.ALL
    expiresAt: Expiry = None


class UpdateApiKeyRequest(BaseModel):
    """Only the fields present are changed; `expiresAt` of `""` or null removes the expiry."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=64)
    description: str | None = Field(default=None, max_length=64)
    consumptionLimit: ConsumptionLimit | None = None
    limitPeriod: LimitPeriod | None = None
    modelPrivacy: ModelPrivacy | None = None
    expiresAt: Expiry = None
