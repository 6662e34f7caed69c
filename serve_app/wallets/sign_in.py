"""Wallet callers: a verified SIGN-IN-WITH-X payload -> the wallet's account, as a caller.

Each signed sign-in is good for one request: its nonce is written to `siwx_nonces` in the
same transaction that finds (or, on first sight, creates) the wallet's account, so a replay is
refused on every replica and node that shares the database. Nonces are swept once their
message has expired (a replayed expired message is refused by its expiry already).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from cachetools import TTLCache
from eth_utils import to_checksum_address
from sqlalchemy import delete, select
from sqlmodel import Session

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.writer import BatchWriter
from serve_app.db.engine import dialect_insert
from serve_app.db.tables import Account, AccountKind, SiwxNonce, new_id, utcnow
from serve_app.domain import DEFAULT_RATE_LIMIT_TIER
from serve_app.errors import ApiError
from serve_app.net_guard import is_loopback
from serve_app.settings import Settings
from serve_app.wallets import siwx

logger = logging.getLogger("serve_app.auth")

SIWX_HEADERS = ("sign-in-with-x", "x-sign-in-with-x")
NONCE_SWEEP_INTERVAL_S = 300.0
NONCE_SWEEP_MARGIN = timedelta(minutes=5)


_EVM_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_SOLANA_ADDRESS = re.compile(r"^[1-9A-HJ-NP-Za-km-z]{32,44}$")


def normalize_address(value: str) -> str:
    """A wallet address as accounts store it: EVM checksummed, Solana base58 as given."""
    if _EVM_ADDRESS.fullmatch(value):
        return to_checksum_address(value)
    if _SOLANA_ADDRESS.fullmatch(value):
        return value
    raise ApiError(400, "Invalid request parameters", code="INVALID_REQUEST", details={
        "_errors": [], "walletAddress": {"_errors": [
            "walletAddress must be an EVM address (0x and 40 hex digits) or a Solana address "
            "(base58)"]}})


def nonce_used() -> ApiError:
    return ApiError(401, "This nonce has already been used", code="AUTHENTICATION_FAILED")


@dataclass(frozen=True, slots=True)
class WalletAccount:
    account_id: str
    is_partner: bool
    rate_limit_tier: str


def first_header(headers: Mapping[str, str], names: Iterable[str]) -> str | None:
    """The value of the first of `names` the request carries (current name, then legacy)."""
    return next((value for name in names if (value := headers.get(name))), None)


def siwx_header(headers: Mapping[str, str]) -> str | None:
    return first_header(headers, SIWX_HEADERS)


def wallet_caller(address: str, account: WalletAccount) -> KeyRecord:
    """A wallet as the rest of the gateway sees a caller: a key of its wallet account with no
    secret, no spending limit and every model allowed. Its limits are the account's (`id` is
    the account id, so the buckets are per wallet) and its charges carry the address."""
    return KeyRecord(
        id=account.account_id, account_id=account.account_id, key_hash="",
        key_type="INFERENCE", description="wallet", model_privacy="ALL", limit_period="EPOCH",
        limit_usd_nanos=None, limit_diem_nanos=None, expires_at=None,
        is_partner=account.is_partner, rate_limit_tier=account.rate_limit_tier,
        wallet_address=address)


def _use_nonce(session: Session, sign_in: siwx.SignIn) -> None:
    stmt = (dialect_insert(session)(SiwxNonce)
            .values(address=sign_in.address, nonce=sign_in.nonce, expires_at=sign_in.expires_at)
            .on_conflict_do_nothing(index_elements=["address", "nonce"])
            .returning(SiwxNonce.nonce))
    if session.execute(stmt).first() is None:
        raise nonce_used()


def find_or_create_wallet_account(session: Session, address: str) -> WalletAccount:
    """The account of `address`, created (no balance) when the wallet is new. Two replicas
    creating it at once: the unique address makes one insert do nothing, both read the same
    account."""
    query = select(Account.id, Account.is_partner, Account.rate_limit_tier).where(
        Account.wallet_address == address)
    row = session.execute(query).first()
    if row is None:
        session.execute(dialect_insert(session)(Account).values(
            id=new_id(), kind=AccountKind.WALLET.value, wallet_address=address,
            usd_balance_nanos=0, diem_balance_nanos=0, is_partner=False,
            rate_limit_tier=DEFAULT_RATE_LIMIT_TIER, is_operator=False, staked_tokens=0,
            created_at=utcnow()).on_conflict_do_nothing(index_elements=["wallet_address"]))
        row = session.execute(query).one()
    return WalletAccount(row[0], bool(row[1]), row[2])


def sign_in_domains(settings: Settings) -> frozenset[str]:
    """The domains a sign-in may name: SIWX_DOMAINS, or, on a platform that listens on a
    loopback address only, its own `host:port` names. Never the Host header of a request: a
    signature a wallet gave another site must not sign in here."""
    if settings.accepted_siwx_domains:
        return settings.accepted_siwx_domains
    if not is_loopback(settings.host):
        logger.warning("SIWX_DOMAINS is not set and the platform listens on %s: wallet "
                       "sign-in is refused until it names the public host", settings.host)
        return frozenset()
    port = settings.port
    return frozenset(f"{host}:{port}" for host in {settings.host, "localhost", "127.0.0.1"})


class WalletAuth:
    """Verifies SIGN-IN-WITH-X and resolves the wallet's account (cached per replica)."""

    def __init__(self, writer: BatchWriter, accepted_domains: frozenset[str]) -> None:
        self.writer = writer
        self.accepted_domains = accepted_domains
        self._accounts: TTLCache[str, WalletAccount] = TTLCache(maxsize=100_000, ttl=60.0)

    def domain_for(self, request_host: str) -> str:
        """The domain a sign-in should name for a request sent to `request_host`."""
        host = request_host.lower()
        if host in self.accepted_domains or not self.accepted_domains:
            return host
        return sorted(self.accepted_domains)[0]

    async def authenticate(self, header_value: str, request_host: str,
                           now: datetime | None = None) -> KeyRecord:
        if not self.accepted_domains:
            raise ApiError(401, "Wallet sign-in is not configured on this server: the operator "
                                "sets SIWX_DOMAINS to the host names clients sign in to",
                           code="AUTHENTICATION_FAILED")
        payload = siwx.decode_header(header_value)
        sign_in = siwx.verify(payload, accepted_domains=self.accepted_domains,
                              request_host=request_host.lower(), now=now or utcnow())
        account = self._accounts.get(sign_in.address)

        def use(session: Session) -> WalletAccount | None:
            _use_nonce(session, sign_in)
            if account is not None:
                return None
            return find_or_create_wallet_account(session, sign_in.address)

        found = await self.writer.run(use)
        if found is not None:
            account = self._accounts[sign_in.address] = found
        assert account is not None
        return wallet_caller(sign_in.address, account)

    async def sweep_nonces(self) -> int:
        # A margin for replicas whose clocks differ: a nonce outlives its message by minutes.
        now = utcnow() - NONCE_SWEEP_MARGIN

        def sweep(session: Session) -> int:
            result = session.execute(delete(SiwxNonce).where(SiwxNonce.expires_at < now))
            return result.rowcount or 0

        return await self.writer.run(sweep)

    async def run_nonce_sweeper(self, interval_s: float = NONCE_SWEEP_INTERVAL_S) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sweep_nonces()
            except Exception:
                logger.exception("sweeping expired SIWX nonces failed")
