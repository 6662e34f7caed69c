"""The money operations, each one database transaction: hold, settle, release, sweep.

Balances never go below zero and a key never spends past its consumption limit, whatever the
number of replicas: every check and its write happen under the account's row lock (PostgreSQL
`SELECT ... FOR UPDATE`; SQLite write transactions begin IMMEDIATE, see db/engine.py). The DIEM
allocation is consumed before USD, and each ledger line records which currency paid.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session, select

from serve_app.billing.pricing import Cost, sku, unit_type
from serve_app.billing.windows import epoch_day, window_start
from serve_app.db.tables import (
    Account,
    KeySpendWindow,
    LedgerEntry,
    LedgerLine,
    Reservation,
    UsageDaily,
)
from serve_app.errors import ApiError
from serve_app.money import NANOS_PER_UNIT


@dataclass(frozen=True, slots=True)
class Payer:
    """Who pays for a request: an account, through one of its keys (or a wallet)."""

    account_id: str
    api_key_id: str | None = None
    limit_period: str = "EPOCH"
    limit_usd_nanos: int | None = None
    limit_diem_nanos: int | None = None
    wallet_address: str | None = None

    @property
    def has_limits(self) -> bool:
        return self.api_key_id is not None and (
            self.limit_usd_nanos is not None or self.limit_diem_nanos is not None)


@dataclass(frozen=True, slots=True)
class Balances:
    usd_nanos: int
    diem_nanos: int


@dataclass(frozen=True, slots=True)
class HoldResult:
    before: Balances  # the balance before the request, for the balance headers
    usd_nanos: int
    diem_nanos: int


def insufficient_balance() -> ApiError:
    return ApiError(402, "Insufficient USD or DIEM balance to complete request",
                    code="INSUFFICIENT_BALANCE")


def _refresh_diem_epoch(session: Session, account_id: str, now: datetime) -> None:
    """A new UTC day resets the DIEM allocation to the staked amount (1 DIEM per token)."""
    today = epoch_day(now)
    session.execute(
        update(Account)
        .where(Account.id == account_id,
               (Account.diem_epoch.is_(None)) | (Account.diem_epoch != today))
        .values(diem_balance_nanos=Account.staked_tokens * NANOS_PER_UNIT, diem_epoch=today))


def _locked_account(session: Session, account_id: str) -> Account:
    account = session.get(Account, account_id, with_for_update=True, populate_existing=True)
    if account is None:
        raise ApiError(401, "Account not found", code="AUTHENTICATION_FAILED")
    return account


def _locked_window(session: Session, payer: Payer, start: str) -> KeySpendWindow:
    table = KeySpendWindow.__table__
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    session.execute(insert(table).values(api_key_id=payer.api_key_id, window_start=start,
                                         usd_nanos=0, diem_nanos=0)
                    .on_conflict_do_nothing(index_elements=["api_key_id", "window_start"]))
    window = session.get(KeySpendWindow, (payer.api_key_id, start), with_for_update=True,
                         populate_existing=True)
    assert window is not None
    return window


def hold(session: Session, request_id: str, payer: Payer, amount_nanos: int,
         now: datetime) -> HoldResult:
    """Reserve the most the request may cost against balance and key limit, or refuse (402)."""
    _refresh_diem_epoch(session, payer.account_id, now)
    account = _locked_account(session, payer.account_id)
    before = Balances(account.usd_balance_nanos, account.diem_balance_nanos)
    diem_room = account.diem_balance_nanos
    window = None
    if payer.has_limits:
        window = _locked_window(session, payer, window_start(payer.limit_period, now))
        if payer.limit_diem_nanos is not None:
            diem_room = min(diem_room, max(0, payer.limit_diem_nanos - window.diem_nanos))
    diem_part = min(amount_nanos, diem_room)
    usd_part = amount_nanos - diem_part
    if usd_part > account.usd_balance_nanos:
        if account.usd_balance_nanos + account.diem_balance_nanos < amount_nanos:
            raise insufficient_balance()
        raise ApiError(402, "This API key has reached its DIEM consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_DIEM_SPEND_LIMIT_EXCEEDED")
    if window is not None and payer.limit_usd_nanos is not None \
            and window.usd_nanos + usd_part > payer.limit_usd_nanos:
        raise ApiError(402, "This API key has reached its USD consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_USD_SPEND_LIMIT_EXCEEDED")
    account.usd_balance_nanos -= usd_part
    account.diem_balance_nanos -= diem_part
    session.add(account)
    if window is not None:
        window.usd_nanos += usd_part
        window.diem_nanos += diem_part
        session.add(window)
    session.add(Reservation(request_id=request_id, account_id=payer.account_id,
                            api_key_id=payer.api_key_id,
                            window_start=window.window_start if window else None,
                            usd_nanos=usd_part, diem_nanos=diem_part,
                            diem_epoch=account.diem_epoch, created_at=now))
    return HoldResult(before, usd_part, diem_part)


def _give_back(session: Session, res: Reservation, usd_nanos: int, diem_nanos: int) -> None:
    """Return unused parts of a hold to the balance and the key window."""
    account = _locked_account(session, res.account_id)
    account.usd_balance_nanos += usd_nanos
    if account.diem_epoch == res.diem_epoch:  # yesterday's DIEM does not come back today
        account.diem_balance_nanos += diem_nanos
    session.add(account)
    if res.window_start is not None and res.api_key_id is not None:
        session.execute(
            update(KeySpendWindow)
            .where(KeySpendWindow.api_key_id == res.api_key_id,
                   KeySpendWindow.window_start == res.window_start)
            .values(usd_nanos=KeySpendWindow.usd_nanos - usd_nanos,
                    diem_nanos=KeySpendWindow.diem_nanos - diem_nanos))


def release(session: Session, request_id: str) -> bool:
    """Drop a hold without charging (the request failed on our side). False: nothing held."""
    res = session.get(Reservation, request_id, with_for_update=True)
    if res is None:
        return False
    _give_back(session, res, res.usd_nanos, res.diem_nanos)
    session.execute(delete(Reservation).where(Reservation.request_id == request_id))
    return True


@dataclass(frozen=True, slots=True)
class Settled:
    usd_nanos: int
    diem_nanos: int
    repeated: bool = False


def settle(session: Session, request_id: str, payer: Payer, cost: Cost, *, started_at: datetime,
           now: datetime, execution_ms: int | None = None) -> Settled:
    """Charge the measured cost (at most what was held), DIEM first, and write the ledger entry
    with its lines and daily rollups. A second settlement of the same request changes nothing."""
    existing = session.get(LedgerEntry, request_id)
    if existing is not None:
        return Settled(existing.usd_nanos, existing.diem_nanos, repeated=True)
    res = session.get(Reservation, request_id, with_for_update=True)
    if res is None:
        raise LookupError(f"no hold for request {request_id}")
    total = min(cost.nanos, res.usd_nanos + res.diem_nanos)
    diem = min(total, res.diem_nanos)
    usd = total - diem
    _give_back(session, res, res.usd_nanos - usd, res.diem_nanos - diem)
    session.execute(delete(Reservation).where(Reservation.request_id == request_id))
    model = cost.model
    session.add(LedgerEntry(
        request_id=request_id, account_id=payer.account_id, api_key_id=payer.api_key_id,
        wallet_address=payer.wallet_address, model_id=model.id, model_type=model.type,
        unit_type=unit_type(model), units=cost.units, usd_nanos=usd, diem_nanos=diem,
        execution_ms=execution_ms, started_at=started_at, created_at=now))
    session.flush()
    prompt = cost.units.get("input") if model.type in ("text", "embedding") else None
    completion = cost.units.get("output") if model.type == "text" else None
    diem_left, scale = diem, total / cost.nanos if cost.nanos and total < cost.nanos else 1
    for line in cost.lines:
        line_total = int(line.nanos * scale)
        paid_diem = min(line_total, diem_left)
        diem_left -= paid_diem
        parts = [(currency, amount) for currency, amount in
                 (("DIEM", paid_diem), ("USD", line_total - paid_diem)) if amount > 0]
        for currency, amount in parts or [("USD", 0)]:
            session.add(LedgerLine(
                request_id=request_id, account_id=payer.account_id,
                api_key_id=payer.api_key_id, model_id=model.id, line_type=line.line_type,
                sku=sku(model, line.line_type), currency=currency, units=line.units,
                amount_nanos=amount, price_per_unit_usd=line.price_per_unit_usd,
                prompt_tokens=prompt, completion_tokens=completion,
                execution_ms=execution_ms, created_at=now))
        _roll_up(session, payer, model.id, model.type, line.line_type, now,
                 usd=line_total - paid_diem, diem=paid_diem, units=line.units)
    # Rounding of a capped charge leaves at most a few nanos: book them on the first line.
    booked = sum(int(line.nanos * scale) for line in cost.lines)
    if booked != total and cost.lines:
        _fix_rounding(session, request_id, total - booked)
    return Settled(usd, diem)


def _fix_rounding(session: Session, request_id: str, delta: int) -> None:
    line = session.exec(select(LedgerLine).where(LedgerLine.request_id == request_id)
                        .order_by(LedgerLine.id)).first()
    if line is not None:
        line.amount_nanos += delta
        session.add(line)


def _roll_up(session: Session, payer: Payer, model_id: str, model_type: str, line_type: str,
             now: datetime, *, usd: int, diem: int, units: int) -> None:
    table = UsageDaily.__table__
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(table).values(
        account_id=payer.account_id, day=now.date(), api_key_id=payer.api_key_id or "",
        model_id=model_id, model_type=model_type,
        line_type=line_type, usd_nanos=usd, diem_nanos=diem, units=units, requests=1)
    excluded = stmt.excluded
    session.execute(stmt.on_conflict_do_update(
        index_elements=["account_id", "day", "api_key_id", "model_id", "line_type"],
        set_={"usd_nanos": table.c.usd_nanos + excluded.usd_nanos,
              "diem_nanos": table.c.diem_nanos + excluded.diem_nanos,
              "units": table.c.units + excluded.units,
              "requests": table.c.requests + 1}))


def stale_holds(session: Session, now: datetime, max_age: timedelta) -> list[str]:
    """Holds older than any request may run: left by a replica that died mid-request."""
    return list(session.exec(select(Reservation.request_id)
                             .where(Reservation.created_at < now - max_age)).all())


def balances(session: Session, account_id: str, now: datetime) -> tuple[Balances, int]:
    """(balances, staked tokens) with the DIEM allocation of the current epoch."""
    account = session.get(Account, account_id)
    if account is None:
        raise ApiError(401, "Account not found", code="AUTHENTICATION_FAILED")
    diem = account.diem_balance_nanos
    if account.diem_epoch != epoch_day(now):
        diem = account.staked_tokens * NANOS_PER_UNIT
    return Balances(account.usd_balance_nanos, diem), account.staked_tokens
