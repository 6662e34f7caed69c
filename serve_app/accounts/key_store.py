"""API key lookup for the ingress: one indexed query on a miss, a per-replica cache otherwise.

A cached key is dropped when it changes: the replica that changes a key invalidates its own
cache and publishes the change to every other replica (control/key_events.py) before it
answers; a background sync also picks up changes made outside the API (the admin CLI) within
`key_sync_interval_s`, and flushes batched `lastUsedAt` stamps.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cachetools import TTLCache
from sqlalchemy import update
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from serve_app.accounts.secrets import hash_secret
from serve_app.db.tables import Account, ApiKey, ApiKeyType, as_utc, utcnow
from serve_app.domain import DEFAULT_RATE_LIMIT_TIER
from serve_app.errors import ApiError, authentication_failed

logger = logging.getLogger("serve_app.auth")

# Unknown secrets are remembered briefly so a flood of bad keys does not reach the database.
_NEGATIVE_TTL_S = 5.0
_CACHE_SIZE = 100_000


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """What a request needs to know about its key, detached from any database session."""

    id: str
    account_id: str
    key_hash: str
    key_type: str
    description: str
    model_privacy: str
    limit_period: str
    limit_usd_nanos: int | None
    limit_diem_nanos: int | None
    expires_at: datetime | None
    is_partner: bool = False  # the account's partner status: the partner rate-limit columns
    rate_limit_tier: str = DEFAULT_RATE_LIMIT_TIER  # the account's tier (rate_limit_tiers.yaml)
    is_operator: bool = False  # the operator's account (publishes characters)
    # Set for a wallet signed in with SIGN-IN-WITH-X (auth/wallets.py): no secret, and `id`
    # is the wallet account's id.
    wallet_address: str | None = None
    limit_vcu_nanos: int | None = None  # the legacy name of a DIEM limit (1 VCU = 1 DIEM)

    @property
    def is_admin(self) -> bool:
        return self.key_type == ApiKeyType.ADMIN

    @classmethod
    def from_row(cls, row: ApiKey, *, is_partner: bool = False,
                 rate_limit_tier: str = DEFAULT_RATE_LIMIT_TIER,
                 is_operator: bool = False) -> KeyRecord:
        return cls(
            id=row.id,
            account_id=row.account_id,
            key_hash=row.key_hash,
            key_type=row.key_type,
            description=row.description,
            model_privacy=row.model_privacy,
            limit_period=row.limit_period,
            limit_usd_nanos=row.limit_usd_nanos,
            limit_diem_nanos=row.limit_diem_nanos,
            limit_vcu_nanos=row.limit_vcu_nanos,
            expires_at=as_utc(row.expires_at),
            is_partner=is_partner,
            rate_limit_tier=rate_limit_tier,
            is_operator=is_operator,
        )


def mark_account_keys_changed(session: Session, account_id: str) -> None:
    """For a change to an account that its cached keys carry (partner status, rate-limit
    tier): bump its keys' `updated_at`, so each replica's sync drops them within
    `key_sync_interval_s` and loads them again. The caller commits."""
    session.execute(update(ApiKey).where(ApiKey.account_id == account_id,
                                         ApiKey.deleted_at.is_(None))
                    .values(updated_at=utcnow()))


_UNKNOWN = object()


class KeyStore:
    def __init__(self, engine: Engine, *, ttl_s: float = 60.0) -> None:
        self.engine = engine
        self._cache: TTLCache[str, KeyRecord] = TTLCache(maxsize=_CACHE_SIZE, ttl=ttl_s)
        self._unknown: TTLCache[str, object] = TTLCache(maxsize=_CACHE_SIZE, ttl=_NEGATIVE_TTL_S)
        self._last_used: dict[str, datetime] = {}
        self._synced_at = utcnow()

    async def authenticate(self, secret: str) -> KeyRecord:
        if not secret:
            raise authentication_failed()
        key_hash = hash_secret(secret)
        record = self._cache.get(key_hash)
        if record is None:
            if key_hash in self._unknown:
                raise authentication_failed()
            record = await asyncio.to_thread(self._load, key_hash)
            if record is None:
                self._unknown[key_hash] = _UNKNOWN
                raise authentication_failed()
            self._cache[key_hash] = record
        # The lookup is by hash, so timing reveals nothing about the secret; compare anyway in
        # constant time so no code path ever compares secrets with `==`.
        if not hmac.compare_digest(record.key_hash, key_hash):
            raise authentication_failed()
        now = utcnow()
        if record.expires_at is not None and record.expires_at <= now:
            raise ApiError(401, "API key has expired", code="AUTHENTICATION_FAILED")
        self._last_used[record.id] = now
        return record

    def _load(self, key_hash: str) -> KeyRecord | None:
        with Session(self.engine) as session:
            found = session.exec(
                select(ApiKey, Account.is_partner, Account.rate_limit_tier,
                       Account.is_operator).join(Account)
                .where(ApiKey.key_hash == key_hash, ApiKey.deleted_at.is_(None))
            ).first()
            if found is None:
                return None
            row, is_partner, rate_limit_tier, is_operator = found
            return KeyRecord.from_row(row, is_partner=bool(is_partner),
                                      rate_limit_tier=rate_limit_tier,
                                      is_operator=bool(is_operator))

    def invalidate(self, key_hashes: Iterable[str] | None) -> None:
        """Forget the given keys (all keys when None)."""
        if key_hashes is None:
            self._cache.clear()
            self._unknown.clear()
            return
        for key_hash in key_hashes:
            self._cache.pop(key_hash, None)
            self._unknown.pop(key_hash, None)

    async def sync(self) -> None:
        """Drop keys changed by anyone since the last sync, and write `lastUsedAt` stamps."""
        # Overlap the window a little: a commit can land with an `updated_at` slightly in the
        # past of the moment this query runs.
        since = self._synced_at - timedelta(seconds=5)
        started = utcnow()
        stamps, self._last_used = self._last_used, {}
        changed = await asyncio.to_thread(self._sync_db, since, stamps)
        self.invalidate(changed)  # on the event loop: the caches are not thread-safe
        self._synced_at = started

    def _sync_db(self, since: datetime, stamps: dict[str, datetime]) -> list[str]:
        with Session(self.engine) as session:
            changed = list(session.exec(
                select(ApiKey.key_hash).where(ApiKey.updated_at >= since)).all())
            for key_id, used_at in stamps.items():
                session.execute(update(ApiKey).where(ApiKey.id == key_id)
                                .values(last_used_at=used_at))
            session.commit()
        return changed

    async def run_sync_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sync()
            except Exception:
                logger.exception("key sync failed; retrying in %.1fs", interval_s)
