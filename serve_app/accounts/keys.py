"""API key administration: the rules behind `/api_keys` and the admin CLI."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from serve_app.accounts.secrets import generate_secret, hash_secret
from serve_app.billing.ledger import drop_windows, seed_window
from serve_app.billing.windows import window_start
from serve_app.db.tables import Account, ApiKey, KeySpendWindow, UsageDaily, iso_z, utcnow
from serve_app.errors import ApiError, invalid_request
from serve_app.money import NANOS_PER_UNIT, as_number, to_nanos
from serve_app.schemas.api_keys import (
    ConsumptionLimit,
    CreateApiKeyRequest,
    UpdateApiKeyRequest,
)

MAX_ACTIVE_KEYS = 500


def _limits(row: ApiKey) -> dict[str, Any]:
    return {
        "usd": as_number(row.limit_usd_nanos),
        "diem": as_number(row.limit_diem_nanos),
        "vcu": as_number(row.limit_vcu_nanos),
    }


def key_record(row: ApiKey) -> dict[str, Any]:
    """The record of list, get and update answers (no secret)."""
    return {
        "id": row.id,
        "apiKeyType": row.key_type,
        "description": row.description,
        "consumptionLimits": _limits(row),
        "limitPeriod": row.limit_period,
        "modelPrivacy": row.model_privacy,
        "createdAt": iso_z(row.created_at),
        "expiresAt": iso_z(row.expires_at),
        "last6Chars": row.last6,
        "lastUsedAt": iso_z(row.last_used_at),
    }


def _apply_limits(row: ApiKey, limit: ConsumptionLimit, fields: set[str]) -> None:
    for name in fields:
        value = getattr(limit, name)
        setattr(row, f"limit_{name}_nanos", None if value is None else to_nanos(value))


def _check_expiry(expires_at: datetime | None) -> None:
    if expires_at is not None and expires_at <= utcnow():
        raise invalid_request("expiresAt must be in the future", "expiresAt")


def active_key_count(session: Session, account_id: str) -> int:
    now = utcnow()
    return session.exec(
        select(func.count()).select_from(ApiKey).where(
            ApiKey.account_id == account_id,
            ApiKey.deleted_at.is_(None),
            (ApiKey.expires_at.is_(None)) | (ApiKey.expires_at > now),
        )
    ).one()


def create_key(session: Session, account_id: str, req: CreateApiKeyRequest) -> dict[str, Any]:
    """Create a key and return the create answer, the only place the secret ever appears."""
    _check_expiry(req.expiresAt)
    if session.get(Account, account_id, with_for_update=True) is None:
        raise ApiError(404, "Account not found")
    if active_key_count(session, account_id) >= MAX_ACTIVE_KEYS:
        raise invalid_request(f"An account may hold at most {MAX_ACTIVE_KEYS} active API keys")
    secret = generate_secret()
    row = ApiKey(
        account_id=account_id,
        key_hash=hash_secret(secret),
        last6=secret[-6:],
        key_type=req.apiKeyType,
        description=req.description,
        limit_period=req.limitPeriod,
        model_privacy=req.modelPrivacy,
        expires_at=req.expiresAt,
    )
    if req.consumptionLimit is not None:
        _apply_limits(row, req.consumptionLimit, {"usd", "diem", "vcu"})
    session.add(row)
    session.commit()
    session.refresh(row)
    return {
        "apiKey": secret,
        "id": row.id,
        "apiKeyType": row.key_type,
        "description": row.description,
        "consumptionLimit": _limits(row),
        "limitPeriod": row.limit_period,
        "modelPrivacy": row.model_privacy,
        "expiresAt": iso_z(row.expires_at),
    }


def _owned_key(session: Session, account_id: str, key_id: str) -> ApiKey:
    row = session.exec(select(ApiKey).where(
        ApiKey.id == key_id, ApiKey.account_id == account_id, ApiKey.deleted_at.is_(None))).first()
    if row is None:
        raise ApiError(404, f"API key {key_id!r} not found")
    return row


def update_key(session: Session, account_id: str, req: UpdateApiKeyRequest) -> tuple[dict, str]:
    """Apply the fields present in the request; returns (record, hash of the changed key)."""
    row = _owned_key(session, account_id, req.id)
    given = req.model_fields_set
    if "description" in given:
        if req.description is None:
            raise invalid_request("description must be a string", "description")
        row.description = req.description
    if "expiresAt" in given:
        _check_expiry(req.expiresAt)
        row.expires_at = req.expiresAt
    if "limitPeriod" in given and req.limitPeriod is not None:
        row.limit_period = req.limitPeriod
    if "modelPrivacy" in given and req.modelPrivacy is not None:
        row.model_privacy = req.modelPrivacy
    if "consumptionLimit" in given:
        limit = req.consumptionLimit or ConsumptionLimit(usd=None, diem=None, vcu=None)
        _apply_limits(row, limit, limit.model_fields_set or {"usd", "diem", "vcu"})
    row.updated_at = utcnow()
    session.add(row)
    if given & {"consumptionLimit", "limitPeriod"}:
        if row.limit_usd_nanos is None and row.limit_diem_nanos is None \
                and row.limit_vcu_nanos is None:
            drop_windows(session, row.id)
        else:
            seed_window(session, row.id, account_id, row.limit_period, row.updated_at)
    session.commit()
    session.refresh(row)
    return key_record(row), row.key_hash


def _amount(nanos: int) -> str:
    return f"{Decimal(nanos) / NANOS_PER_UNIT:.4f}"


def _with_usage(session: Session, rows: list[ApiKey]) -> list[dict[str, Any]]:
    """Records with `usage.trailingSevenDays` (from the daily rollups) and, for keys with a
    consumption limit, `currentPeriodUsage` (the key's current window)."""
    now = utcnow()
    ids = [r.id for r in rows]
    week: dict[str, tuple[int, int]] = {}
    if ids:
        for key_id, usd, diem in session.exec(
                select(UsageDaily.api_key_id, func.sum(UsageDaily.usd_nanos),
                       func.sum(UsageDaily.diem_nanos))
                .where(col(UsageDaily.api_key_id).in_(ids),
                       UsageDaily.day >= (now - timedelta(days=6)).date())
                .group_by(UsageDaily.api_key_id)).all():
            week[key_id] = (int(usd or 0), int(diem or 0))
    records = []
    for row in rows:
        record = key_record(row)
        usd, diem = week.get(row.id, (0, 0))
        record["usage"] = {"trailingSevenDays": {"usd": _amount(usd), "vcu": _amount(0),
                                                 "diem": _amount(diem)}}
        if row.limit_usd_nanos is not None or row.limit_diem_nanos is not None \
                or row.limit_vcu_nanos is not None:
            window = session.get(KeySpendWindow, (row.id, window_start(row.limit_period, now)))
            record["currentPeriodUsage"] = {
                "usd": _amount(window.usd_nanos if window else 0),
                "diem": _amount(window.diem_nanos if window else 0)}
        records.append(record)
    return records


def list_keys(session: Session, account_id: str) -> list[dict[str, Any]]:
    rows = session.exec(select(ApiKey).where(
        ApiKey.account_id == account_id, ApiKey.deleted_at.is_(None))
        .order_by(ApiKey.created_at)).all()
    return _with_usage(session, list(rows))


def get_key(session: Session, account_id: str, key_id: str) -> dict[str, Any]:
    return _with_usage(session, [_owned_key(session, account_id, key_id)])[0]


def delete_key(session: Session, account_id: str, key_id: str) -> str:
    """Revoke a key (kept, marked deleted, so its ledger entries keep their key)."""
    row = _owned_key(session, account_id, key_id)
    now = utcnow()
    row.deleted_at = now
    row.updated_at = now
    session.add(row)
    session.commit()
    return row.key_hash
