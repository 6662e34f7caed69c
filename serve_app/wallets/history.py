"""What `GET /x402/balance` and `GET /x402/transactions` read: a wallet account's credit and
its USD movements (top-ups and charges), newest first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.billing import ledger
from serve_app.billing.ledger import Balances
from serve_app.db.tables import (
    Account,
    LedgerEntry,
    PaymentStatus,
    Reservation,
    X402Payment,
    as_utc,
    iso_z,
)
from serve_app.money import from_nanos


@dataclass(frozen=True, slots=True)
class WalletBalance:
    address: str
    balances: Balances
    exists: bool


def wallet_balance(session: Session, address: str, now: datetime) -> WalletBalance:
    account_id = session.execute(select(Account.id).where(
        Account.wallet_address == address)).scalar_one_or_none()
    if account_id is None:
        return WalletBalance(address, Balances(0, 0), exists=False)
    found, _staked = ledger.balances(session, account_id, now)
    return WalletBalance(address, found, exists=True)


def wallet_transactions(session: Session, address: str, limit: int,
                        offset: int) -> tuple[int, list[dict], bool]:
    """(current USD balance, one page of transactions, whether more follow).

    `balanceAfter` is walked back from the balance now, with the holds of requests still in
    flight counted back in, so every row shows the balance its own movement left."""
    account_id = session.execute(select(Account.id).where(
        Account.wallet_address == address)).scalar_one_or_none()
    if account_id is None:
        return 0, [], False
    balance = session.execute(select(Account.usd_balance_nanos).where(
        Account.id == account_id)).scalar_one()
    held = session.execute(select(func.coalesce(func.sum(Reservation.usd_nanos), 0)).where(
        Reservation.account_id == account_id)).scalar_one()
    wanted = offset + limit + 1
    top_ups = session.execute(
        select(X402Payment.payment_id, X402Payment.amount_nanos, X402Payment.credited_at)
        .where(X402Payment.account_id == account_id,
               X402Payment.status == PaymentStatus.CREDITED)
        .order_by(X402Payment.credited_at.desc()).limit(wanted)).all()
    charges = session.execute(
        select(LedgerEntry.request_id, LedgerEntry.usd_nanos, LedgerEntry.created_at,
               LedgerEntry.model_id)
        .where(LedgerEntry.account_id == account_id, LedgerEntry.usd_nanos > 0)
        .order_by(LedgerEntry.created_at.desc()).limit(wanted)).all()
    rows = [(at, f"topup_{pid}", amount, "TOP_UP", None, None) for pid, amount, at in top_ups]
    rows += [(at, f"charge_{rid}", -usd, "CHARGE", rid, model)
             for rid, usd, at, model in charges]
    rows.sort(key=lambda row: as_utc(row[0]), reverse=True)
    after = int(balance) + int(held)
    page = []
    for index, (at, entry_id, amount, kind, request_id, model_id) in enumerate(rows[:wanted]):
        if index >= offset and len(page) < limit:
            page.append({"id": entry_id, "amount": float(from_nanos(amount)),
                         "balanceAfter": float(from_nanos(after)), "type": kind,
                         "createdAt": iso_z(at), "requestId": request_id, "modelId": model_id})
        after -= amount
    return int(balance), page, len(rows) > offset + limit
