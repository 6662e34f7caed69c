"""A wallet's account row: written at the wallet's first top-up or charge, never at sign-in.

Its id is derived from the address (`wallet_account_id`), so a signed-in wallet is a payer
before its row exists: until then its balance is 0, its reads answer from "no row", and a
request it cannot pay is refused (402) without anything written. Wallet accounts written
before this rule keep the random ids they were given; `find_wallet_account` reads either.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlmodel import Session

from serve_app.db.engine import dialect_insert
from serve_app.db.tables import Account, AccountKind, utcnow
from serve_app.domain import DEFAULT_RATE_LIMIT_TIER

# Fixed forever: changing it would give every wallet without a row another account id.
_WALLET_ACCOUNTS = uuid.UUID("6f1d2c52-8b0e-4d5a-9a57-3f1e0c6b2a91")


@dataclass(frozen=True, slots=True)
class WalletAccount:
    account_id: str
    is_partner: bool
    rate_limit_tier: str
    exists: bool = True  # False: no row yet (balance 0)


def wallet_account_id(address: str) -> str:
    """The id a wallet's account gets when its row is written (`address` normalised)."""
    return str(uuid.uuid5(_WALLET_ACCOUNTS, address))


def find_wallet_account(session: Session, address: str) -> WalletAccount:
    """The account of `address`: its row, or what it will be once written (exists=False).
    Reads only."""
    row = session.execute(
        select(Account.id, Account.is_partner, Account.rate_limit_tier)
        .where(Account.wallet_address == address)).first()
    if row is None:
        return WalletAccount(wallet_account_id(address), False, DEFAULT_RATE_LIMIT_TIER,
                             exists=False)
    return WalletAccount(row[0], bool(row[1]), row[2])


def create_wallet_account(session: Session, address: str) -> None:
    """Write the wallet's row (no balance) unless it has one. Two writers at once: the
    unique address (and the derived id) make one insert do nothing."""
    session.execute(dialect_insert(session)(Account).values(
        id=wallet_account_id(address), kind=AccountKind.WALLET.value, wallet_address=address,
        usd_balance_nanos=0, diem_balance_nanos=0, is_partner=False,
        rate_limit_tier=DEFAULT_RATE_LIMIT_TIER, is_operator=False, staked_tokens=0,
        created_at=utcnow()).on_conflict_do_nothing())


def find_or_create_wallet_account(session: Session, address: str) -> WalletAccount:
    """The account of `address`, its row written when missing: for a top-up that credits it
    and for the operator staking tokens for it."""
    found = find_wallet_account(session, address)
    if found.exists:
        return found
    create_wallet_account(session, address)
    return find_wallet_account(session, address)
