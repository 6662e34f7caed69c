"""SQLModel tables of the control plane. Amounts are integer nano-units (see money.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime
from enum import StrEnum

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlmodel import Field, SQLModel, col, select

from serve_app.domain import DEFAULT_RATE_LIMIT_TIER, ApiKeyType, LimitPeriod, ModelPrivacy


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands datetimes back naive; every stored time is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def iso_z(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with milliseconds and a `Z`, as every answer writes times."""
    value = as_utc(value)
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z") if value else None


def new_id() -> str:
    return str(uuid.uuid4())


def _utc_column(*, nullable: bool, index: bool = False) -> Column:
    return Column(DateTime(timezone=True), nullable=nullable, index=index)


class AccountKind(StrEnum):
    API = "API"  # an account that holds API keys
    WALLET = "WALLET"  # an EVM or Solana wallet paying with prepaid credit


class Account(SQLModel, table=True):
    __tablename__ = "accounts"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    kind: str = Field(default=AccountKind.API, max_length=16)
    wallet_address: str | None = Field(default=None, max_length=128, unique=True)
    usd_balance_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    diem_balance_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    is_partner: bool = Field(default=False)
    # A tier of configs/rate_limit_tiers.yaml (`inference-admin set-tier`).
    rate_limit_tier: str = Field(default=DEFAULT_RATE_LIMIT_TIER, max_length=32,
                                 sa_column_kwargs={"server_default": DEFAULT_RATE_LIMIT_TIER})
    # The operator's account (the first one): it alone publishes characters for every account.
    is_operator: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    # Staked tokens: each UTC day (epoch) the DIEM balance is reset to this many DIEM.
    staked_tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False,
                                                            server_default="0"))
    diem_epoch: str | None = Field(default=None, max_length=10)  # the day diem belongs to
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
    author: str = Field(default="", max_length=64)
    tags: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False,
                                                              server_default="[]"))
    photo_url: str | None = Field(default=None, max_length=500)
    adult: bool = Field(default=False)
    web_enabled: bool = Field(default=False)
    featured: bool = Field(default=False)
    model_id: str | None = Field(default=None, max_length=200)
    updated_at: datetime = Field(default_factory=utcnow,
                                 sa_column=_utc_column(nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class Reservation(SQLModel, table=True):
    """Money held for a request in flight: taken before the work, settled or released after.

    A reservation left behind by a replica that died is released by the sweeper, so a hold is
    never lost and never charged.
    """

    __tablename__ = "reservations"

    request_id: str = Field(primary_key=True, max_length=64)
    account_id: str = Field(foreign_key="accounts.id", index=True, max_length=36)
    api_key_id: str | None = Field(default=None, max_length=36)
    # The key's consumption window the hold counts against (None: no limit applies).
    window_start: str | None = Field(default=None, max_length=16)
    usd_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    diem_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    # The DIEM epoch the DIEM part came from: it is refunded only into the same epoch.
    diem_epoch: str | None = Field(default=None, max_length=10)
    # The billing service (one per Gateway replica) that took the hold: once it stops beating
    # (BillingHolder), its holds are released without waiting for HOLD_MAX_AGE.
    holder: str | None = Field(default=None, max_length=36)
    created_at: datetime = Field(default_factory=utcnow,
                                 sa_column=_utc_column(nullable=False, index=True))


class BillingHolder(SQLModel, table=True):
    """A live billing service: it writes `seen_at` every few seconds while its replica runs."""

    __tablename__ = "billing_holders"

    id: str = Field(primary_key=True, max_length=36)
    seen_at: datetime = Field(sa_column=_utc_column(nullable=False))


class LedgerEntry(SQLModel, table=True):
    """One billable request, keyed by its request id: a repeated settlement changes nothing."""

    __tablename__ = "ledger_entries"

    request_id: str = Field(primary_key=True, max_length=64)
    account_id: str = Field(foreign_key="accounts.id", max_length=36)
    api_key_id: str | None = Field(default=None, max_length=36)
    wallet_address: str | None = Field(default=None, max_length=128)
    model_id: str = Field(max_length=200)
    model_type: str = Field(max_length=16)
    unit_type: str = Field(max_length=16)
    # Units per type, e.g. {"input": 339, "output": 227}.
    units: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    usd_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    diem_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    execution_ms: int | None = None
    started_at: datetime = Field(sa_column=_utc_column(nullable=False))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class EntryKind(StrEnum):
    """What moved a balance (billing/journal.py). CHARGE entries are the ledger's own rows
    (`ledger_entries`); the other kinds are `balance_entries`."""

    OPENING = "OPENING"  # the balance an account had when its journal began (migration 0013)
    GRANT = "GRANT"  # credit the operator gave (inference-admin, INITIAL_CREDIT_USD)
    TOP_UP = "TOP_UP"  # an x402 payment credited to a wallet
    CHARGE = "CHARGE"  # a settled request
    DIEM_ALLOCATION = "DIEM_ALLOCATION"  # a new epoch's DIEM: 1 per staked token
    DIEM_EXPIRY = "DIEM_EXPIRY"  # DIEM whose epoch ended unspent (a hold's part included)


class BalanceEntry(SQLModel, table=True):
    """One change to an account's balance that is not a charge: immutable, never updated or
    deleted. With the charges (`ledger_entries`) they are the account's journal; the balance
    columns of `accounts` are the journal's sum less the open holds."""

    __tablename__ = "balance_entries"
    __table_args__ = (Index("ix_balance_entries_account_time", "account_id", "created_at"),)

    id: int | None = Field(default=None, sa_column=Column(BigInteger().with_variant(
        Integer, "sqlite"), primary_key=True, autoincrement=True))
    account_id: str = Field(foreign_key="accounts.id", max_length=36)
    kind: str = Field(max_length=32)
    usd_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    diem_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    # What it came from: the payment id of a top-up, the request id of a hold's expired
    # DIEM, the epoch of an allocation.
    source: str | None = Field(default=None, max_length=200)
    reason: str | None = Field(default=None, max_length=500)  # the operator's, for a grant
    actor: str | None = Field(default=None, max_length=128)  # who gave a grant
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class LedgerLine(SQLModel, table=True):
    """One priced line of an entry in one currency: what `GET /billing/usage-history` lists."""

    __tablename__ = "ledger_lines"
    __table_args__ = (Index("ix_ledger_lines_account_time", "account_id", "created_at", "id"),)

    id: int | None = Field(default=None, sa_column=Column(BigInteger().with_variant(
        Integer, "sqlite"), primary_key=True, autoincrement=True))
    request_id: str = Field(foreign_key="ledger_entries.request_id", index=True, max_length=64)
    account_id: str = Field(max_length=36)
    api_key_id: str | None = Field(default=None, max_length=36)
    model_id: str = Field(max_length=200)
    line_type: str = Field(max_length=32)  # input, output, cache_read, cache_write, image, ...
    sku: str = Field(max_length=256)
    currency: str = Field(max_length=16)  # USD or DIEM
    units: int = Field(sa_column=Column(BigInteger, nullable=False))
    amount_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    price_per_unit_usd: float
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    execution_ms: int | None = None
    created_at: datetime = Field(sa_column=_utc_column(nullable=False))


class UsageDaily(SQLModel, table=True):
    """Daily rollup per (account, key, model, line type), kept in the settlement transaction
    so analytics never scan the ledger. `api_key_id` is '' for usage without a key."""

    __tablename__ = "usage_daily"
    __table_args__ = (UniqueConstraint("account_id", "day", "api_key_id", "model_id",
                                       "line_type", name="uq_usage_daily"),)

    id: int | None = Field(default=None, primary_key=True)
    account_id: str = Field(max_length=36)
    day: date
    api_key_id: str = Field(default="", max_length=36)
    model_id: str = Field(max_length=200)
    model_type: str = Field(max_length=16)
    line_type: str = Field(max_length=32)
    usd_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    diem_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    units: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    requests: int = Field(default=0)


class KeySpendWindow(SQLModel, table=True):
    """What a key spent (settled plus held) in one window of its `limitPeriod`."""

    __tablename__ = "key_spend_windows"

    api_key_id: str = Field(primary_key=True, max_length=36)
    window_start: str = Field(primary_key=True, max_length=16)  # EPOCH:2026-11-22, MONTH:...
    usd_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    diem_nanos: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))


class CharacterReview(SQLModel, table=True):
    __tablename__ = "character_reviews"
    __table_args__ = (Index("ix_character_reviews_character_time", "character_id",
                            "created_at"),)

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    character_id: str = Field(foreign_key="characters.id", max_length=36)
    account_id: str | None = Field(default=None, max_length=36)
    username: str = Field(max_length=64)
    rating: int
    message: str | None = Field(default=None, max_length=4000)
    locale: str | None = Field(default=None, max_length=16)
    user_avatar_url: str | None = Field(default=None, max_length=500)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class RateLimitEvent(SQLModel, table=True):
    """A limit an account ran into: `GET /api_keys/rate_limits/log` lists the newest."""

    __tablename__ = "rate_limit_events"
    __table_args__ = (Index("ix_rate_limit_events_account_time", "account_id", "created_at"),)

    id: int | None = Field(default=None, primary_key=True)
    account_id: str = Field(max_length=36)
    api_key_id: str | None = Field(default=None, max_length=36)
    model_id: str | None = Field(default=None, max_length=200)
    tier: str = Field(max_length=32)
    limit_type: str = Field(max_length=32)  # RPM, TPM, FAILED_REQUESTS, ...
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))


class ServerSecret(SQLModel, table=True):
    """Random secrets shared by every replica (e.g. the key that signs usage cursors)."""

    __tablename__ = "server_secrets"

    name: str = Field(primary_key=True, max_length=64)
    value: str = Field(max_length=128)


class SiwxNonce(SQLModel, table=True):
    """A SIGN-IN-WITH-X nonce already accepted: each signed sign-in is good for one request,
    on every replica and node. Kept until its message expires, then swept."""

    __tablename__ = "siwx_nonces"

    address: str = Field(primary_key=True, max_length=128)
    nonce: str = Field(primary_key=True, max_length=64)
    expires_at: datetime = Field(sa_column=_utc_column(nullable=False, index=True))


class PaymentStatus(StrEnum):
    PENDING = "PENDING"  # claimed by one submission, at the facilitator now
    CREDITED = "CREDITED"  # settled and credited to the wallet, exactly once


class X402Payment(SQLModel, table=True):
    """One x402 top-up payment, keyed by what makes it unique on its chain (EIP-3009
    authorization nonce, Solana signature): the claim that credits it exactly once."""

    __tablename__ = "x402_payments"
    __table_args__ = (Index("ix_x402_payments_wallet_time", "wallet_address", "created_at"),)

    payment_id: str = Field(primary_key=True, max_length=200)
    status: str = Field(default=PaymentStatus.PENDING, max_length=16)
    wallet_address: str = Field(max_length=128)
    account_id: str | None = Field(default=None, max_length=36)
    network: str = Field(max_length=64)
    amount_nanos: int = Field(sa_column=Column(BigInteger, nullable=False))
    transaction: str | None = Field(default=None, max_length=200)
    balance_after_nanos: int | None = Field(default=None, sa_column=Column(BigInteger))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    credited_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))


class RpcIdempotency(SQLModel, table=True):
    """A crypto RPC answer kept for its `Idempotency-Key` on one network (24 hours, then
    swept): a retry with the same key and body is answered from here, not forwarded or
    charged again."""

    __tablename__ = "rpc_idempotency"

    account_id: str = Field(primary_key=True, max_length=36)
    network: str = Field(primary_key=True, max_length=64)
    key: str = Field(primary_key=True, max_length=255)
    body_sha256: str = Field(max_length=64)
    done: bool = Field(default=False)  # False while the first request is still running
    response: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    credits: int = Field(default=0)
    cost_usd: str = Field(default="", max_length=32)
    created_at: datetime = Field(default_factory=utcnow,
                                 sa_column=_utc_column(nullable=False, index=True))


class JobStatus(StrEnum):
    """A queued media job's states: QUEUED -> PROCESSING -> COMPLETED | FAILED. A job whose
    runner died goes from PROCESSING back to PROCESSING under a new lease (or to FAILED once
    it has used its attempts)."""

    QUEUED = "QUEUED"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


# The states of a job that still holds its reservation.
OPEN_STATUSES = (JobStatus.QUEUED.value, JobStatus.PROCESSING.value)


class JobRow(SQLModel, table=True):
    """One queued video or audio generation (`/video/queue`, `/audio/queue`).

    The money for it is held under `request_id` when it is queued, and settled with the
    quoted cost (`cost_lines`) when it completes or released when it fails. A runner owns a
    job while its lease lasts; a lease that runs out means its runner died.
    """

    __tablename__ = "media_jobs"
    __table_args__ = (Index("ix_media_jobs_status_created", "status", "created_at"),
                      Index("ix_media_jobs_model_finished", "model_id", "finished_at"))

    queue_id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    kind: str = Field(max_length=16)  # video | audio
    model_id: str = Field(max_length=128)
    status: str = Field(default=JobStatus.QUEUED, max_length=16)
    request_id: str = Field(max_length=64, unique=True)  # the hold's reservation
    account_id: str = Field(max_length=36, index=True)
    api_key_id: str | None = Field(default=None, max_length=36)
    wallet_address: str | None = Field(default=None, max_length=128)
    # What the engine is asked to do, and the input files' keys in the result store.
    params: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    inputs: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    # The quoted price, line by line: [line_type, units, nanos, price_per_unit_usd].
    cost_lines: list = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    result_key: str | None = Field(default=None, max_length=255)
    media_type: str | None = Field(default=None, max_length=64)
    error_status: int | None = Field(default=None)
    error_code: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    media_deleted: bool = Field(default=False)
    # Bytes the job keeps in the result store (its inputs, then its media; 0 once deleted):
    # an account's sum is capped.
    stored_bytes: int = Field(default=0, sa_column=Column(BigInteger, nullable=False,
                                                          server_default="0"))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    started_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    finished_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    # Where its completion event goes (`callback_url`); cleared once the event is enqueued.
    callback_url: str | None = Field(default=None, max_length=2048, index=True)


class QueueIdempotency(SQLModel, table=True):
    """A queue request's `Idempotency-Key` per account (jobs/idempotency.py): claimed before
    the job is queued, then its answer, replayed to a retry until `expires_at` (swept)."""

    __tablename__ = "queue_idempotency"

    account_id: str = Field(primary_key=True, max_length=36)
    key: str = Field(primary_key=True, max_length=255)
    body_sha256: str = Field(max_length=64)  # of the route and the request's fields
    done: bool = Field(default=False)  # False while the first request is still running
    status_code: int = Field(default=0)
    response: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    expires_at: datetime = Field(sa_column=_utc_column(nullable=False, index=True))


class WebhookSecret(SQLModel, table=True):
    """The secret that signs an account's job events (made on first use, rotated on demand);
    after a rotation the one it replaced signs too, until `previous_until`."""

    __tablename__ = "webhook_secrets"

    account_id: str = Field(primary_key=True, max_length=36)
    secret: str = Field(max_length=128)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    previous_secret: str | None = Field(default=None, max_length=128)
    previous_until: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))


class WebhookDelivery(SQLModel, table=True):
    """One job event on its way to its `callback_url` (jobs/webhooks.py): tried until it is
    answered 2xx or has had its tries, then kept until `expires_at` (swept)."""

    __tablename__ = "webhook_deliveries"

    id: str = Field(default_factory=new_id, primary_key=True, max_length=36)
    queue_id: str = Field(max_length=36, unique=True)
    account_id: str = Field(max_length=36)
    url: str = Field(max_length=2048)
    payload: str = Field(sa_column=Column(Text, nullable=False))
    attempts: int = Field(default=0)
    # When the next try is due (None: delivered or given up); a try in flight pushes it on.
    next_attempt_at: datetime | None = Field(default=None,
                                             sa_column=_utc_column(nullable=True, index=True))
    delivered_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    last_error: str | None = Field(default=None, max_length=500)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    expires_at: datetime = Field(sa_column=_utc_column(nullable=False, index=True))


def open_job_request_ids():
    """A subquery of the reservations that open jobs hold: the hold sweeper leaves them."""
    return select(JobRow.request_id).where(col(JobRow.status).in_(OPEN_STATUSES))


# A stored response still under way (its worker, or the replica taking it over, drives it).
OPEN_RESPONSE_STATUSES = ("queued", "in_progress")


class StoredResponse(SQLModel, table=True):
    """A background `/responses` generation (serve_app/responses/): its response object as it
    stands, whose it is, and the lease of the replica whose worker drives it. The money is
    held under `request_id` until the worker settles what the engine made; the row and its
    events are deleted after `expires_at` (swept)."""

    __tablename__ = "stored_responses"

    id: str = Field(primary_key=True, max_length=48)  # resp_ (chatcmpl-) and 32 hex digits
    account_id: str = Field(max_length=36, index=True)
    request_id: str = Field(max_length=128)  # the hold's (a client's X-Request-ID, maybe)
    status: str = Field(max_length=16)  # queued | in_progress | completed | failed | ...
    response: str = Field(sa_column=Column(Text, nullable=False))  # the object, JSON
    # Bytes it keeps (its object and its events): an account's sum is bounded.
    stored_bytes: int = Field(default=0, sa_column=Column(BigInteger, nullable=False))
    lease_owner: str | None = Field(default=None, max_length=64)
    lease_expires_at: datetime | None = Field(default=None, sa_column=_utc_column(nullable=True))
    cancel_requested: bool = Field(default=False)
    created_at: datetime = Field(default_factory=utcnow, sa_column=_utc_column(nullable=False))
    expires_at: datetime = Field(sa_column=_utc_column(nullable=False, index=True))
    # What another replica needs to continue the generation should its worker die (the
    # engine request, the model, the payer; serve_app/responses/takeover.py), JSON, counted
    # in `stored_bytes`; None for one that cannot be continued, and once it has ended.
    continuation: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


def open_response_request_ids():
    """A subquery of the holds of background responses still open: their worker, or the
    replica that takes one over when its worker died, settles or releases them (the hold
    sweeper leaves them)."""
    return select(StoredResponse.request_id).where(
        col(StoredResponse.status).in_(OPEN_RESPONSE_STATUSES))


class ResponseEvent(SQLModel, table=True):
    """One numbered event of a stored response, where no Redis keeps them
    (serve_app/responses/events.py)."""

    __tablename__ = "response_events"

    response_id: str = Field(primary_key=True, max_length=48)
    sequence_number: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    data: str = Field(sa_column=Column(Text, nullable=False))
