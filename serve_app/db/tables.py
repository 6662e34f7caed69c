"""SQLModel tables of the control plane. Amounts are integer nano-units (see money.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import BigInteger, Column, DateTime, String
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; every stored time is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def new_id() -> str:
    return str(uuid.uuid4())


def _utc_column(*, nullable: bool, index: bool = False) -> Column:
    return Column(DateTime(timezone=True), nullable=nullable, index=index)


class AccountKind(StrEnum):
    API = "API"  # an account that holds API keys
    WALLET = "WALLET"  # an EVM or Solana wallet paying with prepaid credit


class ApiKeyType(StrEnum):
    INFERENCE = "INFERENCE"
    ADMIN = "ADMIN"


class LimitPeriod(StrEnum):
    EPOCH = "EPOCH"
    MONTH = "MONTH"
    LIFETIME = "LIFETIME"


class ModelPrivacy(StrEnum):
    ALL = "ALL"
    PRIVATE_TEXT = "PRIVATE_TEXT"
    PRIVATE_ONLY = "PRIVATE_ONLY"


class Account(SQLModel, table=True):
    __tablename__ = "accounts"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    kind: str = Field(default=AccountKind.API, max_length=16)
    wallet_address: str | None = Field(default=None, max_length=128, unique=True)
    usd_balance_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    diem_balance_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    is_partner: bool = Field(default=False)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    # SHA-256 of the secret; the secret itself is never stored.
    key_hash: str = Field(sa_column=Column(String(64), nullable=False, unique=True, index=True))
    last6: str = Field(max_length=6)
    key_type: str = Field(default=ApiKeyType.INFERENCE, max_length=16)
    description: str = Field(default="", max_length=64)
    limit_usd_nanos: int | None = Field(default=None, sa_column=Column(BigInteger))
    limit_diem_nanos: int | None = Field(default=None, sa_column=Column(BigInteger))
    limit_vcu_nanos: int | None = Field(default=None, sa_column=Column(BigInteger))
    limit_period: str = Field(default=LimitPeriod.EPOCH, max_length=16)
    model_privacy: str = Field(default=ModelPrivacy.ALL, max_length=16)
    expires_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    # Bumped by every change that must reach the per-replica key caches.
    updated_at: datetime = Field(default_factory=utcnow,
                                 sa_column=_utc_column(nullable=False, index=True))
    last_used_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    deleted_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))


class Character(SQLModel, table=True):
    """A public persona for chat: `service_parameters.character_slug` selects its prompt."""

    __tablename__ = "characters"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    slug: str = Field(max_length=128, unique=True, index=True)
    name: str = Field(max_length=128)
    description: str = Field(default="", max_length=2000)
    system_prompt: str = Field(default="", max_length=20000)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
