"""The money operations, each one database transaction: hold, settle, release, sweep.

Balances never go below zero and a key never spends past its consumption limit, whatever the
number of replicas: every check and its write happen under the account's row lock (PostgreSQL
`SELECT ... FOR UPDATE`; SQLite write transactions begin IMMEDIATE, see db/engine.py). The DIEM
allocation is consumed before USD, and each ledger line records which currency paid.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlmodel import Session

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

logger = logging.getLogger("serve_app.billing")


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


# Core statements (no ORM unit of work): the money path runs a handful of them per request.
_accounts = Account.__table__
_windows = KeySpendWindow.__table__
_holds = Reservation.__table__
_entries = LedgerEntry.__table__
_lines = LedgerLine.__table__
_rollups = UsageDaily.__table__


def _dialect_insert(session: Session):
    return postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert


def _locked_account(session: Session, account_id: str, now: datetime) -> tuple[int, int, str]:
    """(USD, DIEM, epoch) of the account, locked. A new UTC day resets the DIEM allocation to
    the staked amount (1 DIEM per token): the caller's UPDATE writes it with the epoch."""
    row = session.execute(
        select(_accounts.c.usd_balance_nanos, _accounts.c.diem_balance_nanos,
               _accounts.c.diem_epoch, _accounts.c.staked_tokens)
        .where(_accounts.c.id == account_id).with_for_update()).first()
    if row is None:
        raise ApiError(401, "Account not found", code="AUTHENTICATION_FAILED")
    today = epoch_day(now)
    if row.diem_epoch != today:
        return row.usd_balance_nanos, row.staked_tokens * NANOS_PER_UNIT, today
    return row.usd_balance_nanos, row.diem_balance_nanos, today


def _locked_window(session: Session, payer: Payer, start: str):
    """The key's window (created at zero when new), locked: one statement."""
    stmt = _dialect_insert(session)(_windows).values(
        api_key_id=payer.api_key_id, window_start=start, usd_nanos=0, diem_nanos=0)
    return session.execute(
        stmt.on_conflict_do_update(index_elements=["api_key_id", "window_start"],
                                   set_={"usd_nanos": _windows.c.usd_nanos})
        .returning(_windows.c.usd_nanos, _windows.c.diem_nanos)).one()


def _add_to_window(session: Session, key_id: str, start: str, usd: int, diem: int) -> None:
    session.execute(update(_windows)
                    .where(_windows.c.api_key_id == key_id, _windows.c.window_start == start)
                    .values(usd_nanos=_windows.c.usd_nanos + usd,
                            diem_nanos=_windows.c.diem_nanos + diem))


def hold(session: Session, request_id: str, payer: Payer, amount_nanos: int,
         now: datetime) -> HoldResult:
    """Reserve the most the request may cost against balance and key limit, or refuse (402)."""
    usd_balance, diem_balance, epoch = _locked_account(session, payer.account_id, now)
    before = Balances(usd_balance, diem_balance)
    diem_room = diem_balance
    window = start = None
    if payer.has_limits:
        start = window_start(payer.limit_period, now)
        window = _locked_window(session, payer, start)
        if payer.limit_diem_nanos is not None:
            diem_room = min(diem_room, max(0, payer.limit_diem_nanos - window.diem_nanos))
    diem_part = min(amount_nanos, diem_room)
    usd_part = amount_nanos - diem_part
    if usd_part > usd_balance:
        if usd_balance + diem_balance < amount_nanos:
            raise insufficient_balance()
        raise ApiError(402, "This API key has reached its DIEM consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_DIEM_SPEND_LIMIT_EXCEEDED")
    if window is not None and payer.limit_usd_nanos is not None \
            and window.usd_nanos + usd_part > payer.limit_usd_nanos:
        raise ApiError(402, "This API key has reached its USD consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_USD_SPEND_LIMIT_EXCEEDED")
    session.execute(update(_accounts).where(_accounts.c.id == payer.account_id).values(
        usd_balance_nanos=usd_balance - usd_part, diem_balance_nanos=diem_balance - diem_part,
        diem_epoch=epoch))
    if start is not None and payer.api_key_id is not None:
        _add_to_window(session, payer.api_key_id, start, usd_part, diem_part)
    session.execute(_holds.insert().values(
        request_id=request_id, account_id=payer.account_id, api_key_id=payer.api_key_id,
        window_start=start, usd_nanos=usd_part, diem_nanos=diem_part,
        diem_epoch=epoch, created_at=now))
    return HoldResult(before, usd_part, diem_part)


def _give_back(session: Session, res, usd_nanos: int, diem_nanos: int) -> None:
    """Return unused parts of a hold to the balance and the key window; DIEM only into the
    epoch it came from (yesterday's DIEM does not come back today)."""
    if usd_nanos or diem_nanos:
        c = _accounts.c
        session.execute(update(_accounts).where(c.id == res.account_id).values(
            usd_balance_nanos=c.usd_balance_nanos + usd_nanos,
            diem_balance_nanos=case((c.diem_epoch == res.diem_epoch,
                                     c.diem_balance_nanos + diem_nanos),
                                    else_=c.diem_balance_nanos)))
        if res.window_start is not None and res.api_key_id is not None:
            _add_to_window(session, res.api_key_id, res.window_start, -usd_nanos, -diem_nanos)
    session.execute(delete(_holds).where(_holds.c.request_id == res.request_id))


def _locked_hold(session: Session, request_id: str):
    return session.execute(select(_holds).where(_holds.c.request_id == request_id)
                           .with_for_update()).first()


def release(session: Session, request_id: str) -> bool:
    """Drop a hold without charging (the request failed on our side). False: nothing held."""
    res = _locked_hold(session, request_id)
    if res is None:
        return False
    _give_back(session, res, res.usd_nanos, res.diem_nanos)
    return True


@dataclass(frozen=True, slots=True)
class Settled:
    usd_nanos: int
    diem_nanos: int
    repeated: bool = False


def _late_hold(session: Session, request_id: str, payer: Payer, cost_nanos: int,
               now: datetime) -> None:
    """The work of a request whose hold was swept (it ran past the sweeper's age limit) is
    still charged: as much of its cost as the balance holds now, whatever the key's limit."""
    usd, diem, _ = _locked_account(session, payer.account_id, now)
    amount = max(0, min(cost_nanos, usd + diem))
    logger.warning("request %s settled after its hold was released: charging %d of %d nanos",
                   request_id, amount, cost_nanos)
    hold(session, request_id, Payer(payer.account_id, payer.api_key_id,
                                    wallet_address=payer.wallet_address), amount, now)


def _line_totals(cost: Cost, total: int) -> list[int]:
    """Each line's share of the charge: its price, scaled down when the charge was capped at
    the hold, the rounding remainder on the first line."""
    if total >= cost.nanos:
        return [line.nanos for line in cost.lines]
    shares = [line.nanos * total // cost.nanos for line in cost.lines]
    if shares:
        shares[0] += total - sum(shares)
    return shares


def settle(session: Session, request_id: str, payer: Payer, cost: Cost, *, started_at: datetime,
           now: datetime, execution_ms: int | None = None) -> Settled:
    """Charge the measured cost (at most what was held), DIEM first, and write the ledger entry
    with its lines and daily rollups. A second settlement of the same request changes nothing."""
    res = _locked_hold(session, request_id)
    if res is None:  # settled before (the hold is gone), or the sweeper released it
        existing = session.get(LedgerEntry, request_id)
        if existing is not None:
            return Settled(existing.usd_nanos, existing.diem_nanos, repeated=True)
        _late_hold(session, request_id, payer, cost.nanos, now)
        res = _locked_hold(session, request_id)
    total = min(cost.nanos, res.usd_nanos + res.diem_nanos)
    diem = min(total, res.diem_nanos)
    usd = total - diem
    _give_back(session, res, res.usd_nanos - usd, res.diem_nanos - diem)
    model = cost.model
    session.execute(_entries.insert().values(
        request_id=request_id, account_id=payer.account_id, api_key_id=payer.api_key_id,
        wallet_address=payer.wallet_address, model_id=model.id, model_type=model.type,
        unit_type=unit_type(model), units=cost.units, usd_nanos=usd, diem_nanos=diem,
        execution_ms=execution_ms, started_at=started_at, created_at=now))
    prompt = cost.units.get("input") if model.type in ("text", "embedding") else None
    completion = cost.units.get("output") if model.type == "text" else None
    lines, rollups, diem_left = [], [], diem
    for line, line_total in zip(cost.lines, _line_totals(cost, total), strict=True):
        paid_diem = min(line_total, diem_left)
        diem_left -= paid_diem
        parts = [(currency, amount) for currency, amount in
                 (("DIEM", paid_diem), ("USD", line_total - paid_diem)) if amount > 0]
        for currency, amount in parts or [("USD", 0)]:
            lines.append({
                "request_id": request_id, "account_id": payer.account_id,
                "api_key_id": payer.api_key_id, "model_id": model.id,
                "line_type": line.line_type, "sku": sku(model, line.line_type),
                "currency": currency, "units": line.units, "amount_nanos": amount,
                "price_per_unit_usd": line.price_per_unit_usd, "prompt_tokens": prompt,
                "completion_tokens": completion, "execution_ms": execution_ms,
                "created_at": now})
        rollups.append({
            "account_id": payer.account_id, "day": now.date(),
            "api_key_id": payer.api_key_id or "", "model_id": model.id,
            "model_type": model.type, "line_type": line.line_type,
            "usd_nanos": line_total - paid_diem, "diem_nanos": paid_diem, "units": line.units,
            "requests": 1})
    if lines:
        session.execute(_lines.insert(), lines)
        session.execute(_rollup_upsert(session), rollups)
    return Settled(usd, diem)


def _rollup_upsert(session: Session):
    stmt = _dialect_insert(session)(_rollups)
    excluded, c = stmt.excluded, _rollups.c
    return stmt.on_conflict_do_update(
        index_elements=["account_id", "day", "api_key_id", "model_id", "line_type"],
        set_={"usd_nanos": c.usd_nanos + excluded.usd_nanos,
              "diem_nanos": c.diem_nanos + excluded.diem_nanos,
              "units": c.units + excluded.units,
              "requests": c.requests + excluded.requests})


def seed_window(session: Session, key_id: str, account_id: str, period: str,
                now: datetime) -> None:
    """Start the key's current window, if it has none, from what the key already spent in it
    (the daily rollups): a limit set, or a period changed, mid-window counts the spending
    before the change."""
    start = window_start(period, now)
    today = now.astimezone(UTC).date()
    first = {"EPOCH": today, "MONTH": today.replace(day=1)}.get(period, date(1970, 1, 1))
    c = _rollups.c
    usd, diem = session.execute(
        select(func.coalesce(func.sum(c.usd_nanos), 0), func.coalesce(func.sum(c.diem_nanos), 0))
        .where(c.account_id == account_id, c.api_key_id == key_id, c.day >= first)).one()
    stmt = _dialect_insert(session)(_windows).values(
        api_key_id=key_id, window_start=start, usd_nanos=int(usd), diem_nanos=int(diem))
    # A window that exists already counts everything (holds in flight included): keep it.
    session.execute(stmt.on_conflict_do_nothing(index_elements=["api_key_id", "window_start"]))


def drop_windows(session: Session, key_id: str) -> None:
    """A key without limits keeps no windows; setting a limit again seeds a fresh one."""
    session.execute(delete(_windows).where(_windows.c.api_key_id == key_id))


def stale_holds(session: Session, now: datetime, max_age: timedelta) -> list[str]:
    """Holds older than any request may run: left by a replica that died mid-request."""
    return list(session.execute(select(_holds.c.request_id)
                                .where(_holds.c.created_at < now - max_age)).scalars())


def balances(session: Session, account_id: str, now: datetime) -> tuple[Balances, int]:
    """(balances, staked tokens) with the DIEM allocation of the current epoch."""
    account = session.get(Account, account_id)
    if account is None:
        raise ApiError(401, "Account not found", code="AUTHENTICATION_FAILED")
    diem = account.diem_balance_nanos
    if account.diem_epoch != epoch_day(now):
        diem = account.staked_tokens * NANOS_PER_UNIT
    return Balances(account.usd_balance_nanos, diem), account.staked_tokens
