"""Wallet callers: a verified SIGN-IN-WITH-X payload -> the wallet, as a caller.

A sign-in writes no account: the wallet's account row is written at its first top-up or
charge (billing/wallet_accounts.py); until then the caller is a payer with balance 0 that the
hold refuses (402) with nothing written. The one thing a sign-in stores is its nonce
(nonces.py: its own sessions, off the money writer, expiring with the message), so a replay
is refused on every replica and node that shares the database.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from cachetools import TTLCache
from eth_utils import to_checksum_address
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.wallet_accounts import WalletAccount, find_wallet_account
from serve_app.client_address import counted_address
from serve_app.db.engine import run_in_session
from serve_app.db.tables import utcnow
from serve_app.errors import ApiError
from serve_app.net_guard import is_loopback
from serve_app.settings import Settings
from serve_app.wallets import siwx
from serve_app.wallets.limits import (
    WALLET_REQUESTS_IN_FLIGHT,
    SignInsPerClient,
    WalletsInFlight,
)
from serve_app.wallets.nonces import run_nonce_sweeper, sweep_nonces, use_nonce

logger = logging.getLogger("serve_app.auth")

SIWX_HEADERS = ("sign-in-with-x", "x-sign-in-with-x")


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


@dataclass(frozen=True, slots=True)
class SignedInWallet:
    """A wallet signed in for one request: the caller, and whether its account row exists
    (without one its balance is 0, read from nothing)."""

    caller: KeyRecord
    has_account: bool


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
    """Verifies SIGN-IN-WITH-X, uses its nonce once, and finds the wallet's account (read
    only; an account that exists is cached per replica)."""

    def __init__(self, engine: Engine, accepted_domains: frozenset[str],
                 requests_in_flight: int = WALLET_REQUESTS_IN_FLIGHT,
                 sign_ins: SignInsPerClient | None = None) -> None:
        self.engine = engine
        self.accepted_domains = accepted_domains
        self.in_flight = WalletsInFlight(requests_in_flight)
        self.sign_ins = sign_ins or SignInsPerClient()
        self._accounts: TTLCache[str, WalletAccount] = TTLCache(maxsize=100_000, ttl=60.0)

    def domain_for(self, request_host: str) -> str:
        """The domain a sign-in should name for a request sent to `request_host`."""
        host = request_host.lower()
        if host in self.accepted_domains or not self.accepted_domains:
            return host
        return sorted(self.accepted_domains)[0]

    def check(self, header_value: str, request_host: str, now: datetime | None = None, *,
              client: str | None = None) -> siwx.SignIn:
        """A SIGN-IN-WITH-X header's message and signature checked, its nonce not used (the
        caller gate's check before a body is read); `client`: the address it came from,
        whose sign-ins a minute are counted first (before any signature is checked)."""
        if not self.accepted_domains:
            raise ApiError(401, "Wallet sign-in is not configured on this server: the operator "
                                "sets SIWX_DOMAINS to the host names clients sign in to",
                           code="AUTHENTICATION_FAILED")
        self.sign_ins.count(counted_address(client))
        payload = siwx.decode_header(header_value)
        return siwx.verify(payload, accepted_domains=self.accepted_domains,
                           request_host=request_host.lower(), now=now or utcnow())

    async def authenticate(self, header_value: str, request_host: str,
                           now: datetime | None = None, *, client: str | None = None,
                           checked: siwx.SignIn | None = None) -> SignedInWallet:
        """The wallet of a SIGN-IN-WITH-X header, its nonce used once: `check`ed here, unless
        `checked` is the caller gate's check of this same header in this request."""
        sign_in = checked or self.check(header_value, request_host, now, client=client)
        cached = self._accounts.get(sign_in.address)

        def use(session: Session) -> WalletAccount:
            use_nonce(session, sign_in)  # committed on its own: the read below writes nothing
            return cached or find_wallet_account(session, sign_in.address)

        account = await run_in_session(self.engine, use)
        if account.exists:  # a wallet without a row is read again at its next sign-in
            self._accounts[sign_in.address] = account
        return SignedInWallet(wallet_caller(sign_in.address, account), account.exists)

    async def sweep_nonces(self) -> int:
        return await sweep_nonces(self.engine)

    async def run_nonce_sweeper(self) -> None:
        await run_nonce_sweeper(self.engine)
