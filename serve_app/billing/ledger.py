"""The money operations, each one database transaction: hold, settle, release, sweep.

Balances never go below zero and a key never spends past its consumption limit, whatever the
number of replicas: every check and its write happen under the account's row lock (PostgreSQL
`SELECT ... FOR UPDATE`; SQLite write transactions begin IMMEDIATE, see db/engine.py). The DIEM
allocation is consumed before USD, and each ledger line records which currency paid. A charge's
ledger entry is its journal entry; a new epoch's DIEM and the DIEM that expires are written to
the journal (billing/journal.py) in the transaction that moves them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, Date, DateTime, and_, delete, func, or_, select
from sqlmodel import Session

from serve_app.billing.pricing import Cost, sku, unit_type
from serve_app.billing.wallet_accounts import create_wallet_account
from serve_app.billing.windows import epoch_day, window_start
from serve_app.db.engine import dialect_insert
from serve_app.db.tables import (
    Account,
    BillingHolder,
    EntryKind,
    KeySpendWindow,
    Reservation,
    UsageDaily,
    open_job_request_ids,
    open_response_request_ids,
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


class InsufficientBalance(ApiError):
    """402: the account's USD and DIEM together do not cover the hold. It carries both
    amounts, for the wallet variant of the answer (auth/payment_required.py)."""

    def __init__(self, available_nanos: int, needed_nanos: int) -> None:
        super().__init__(402, "Insufficient USD or DIEM balance to complete request",
                         code="INSUFFICIENT_BALANCE")
        self.available_nanos = available_nanos
        self.needed_nanos = needed_nanos


class AccountNotFound(ApiError):
    def __init__(self) -> None:
        super().__init__(401, "Account not found", code="AUTHENTICATION_FAILED")


class _Statements:
    """Driver-level statements inside the session's transaction.

    The money path runs a handful of statements per request on the ingress replica; through
    SQLAlchemy's Core or ORM layers each costs several times the statement itself (measured:
    benchmarks/README.md). SQL is written once with `?` placeholders and a `{lock}` mark
    (`FOR UPDATE` on PostgreSQL, nothing on SQLite, whose write transactions begin IMMEDIATE);
    dates and JSON go through SQLAlchemy's own bind processors, so rows look exactly as the ORM
    writes them.
    """

    _texts: dict[tuple[str, bool], str] = {}
    _processors: dict[str, tuple] = {}

    def __init__(self, session: Session) -> None:
        connection = session.connection()  # begins the transaction (IMMEDIATE on SQLite)
        dialect = connection.dialect
        self.pg = dialect.name == "postgresql"
        self.cursor = connection.connection.driver_connection.cursor()
        processors = self._processors.get(dialect.name)
        if processors is None:
            processors = self._processors[dialect.name] = tuple(
                kind.dialect_impl(dialect).bind_processor(dialect) or (lambda v: v)
                for kind in (DateTime(timezone=True), Date(), JSON()))
        self.datetime, self.date, self.json = processors

    def _text(self, sql: str) -> str:
        text = self._texts.get((sql, self.pg))
        if text is None:
            text = sql.replace("{lock}", " FOR UPDATE" if self.pg else "")
            if self.pg:
                text = text.replace("?", "%s")
            self._texts[(sql, self.pg)] = text
        return text

    def run(self, sql: str, params: tuple = ()) -> Any:
        self.cursor.execute(self._text(sql), params)
        return self.cursor

    def first(self, sql: str, params: tuple = ()) -> tuple | None:
        return self.run(sql, params).fetchone()

    def many(self, sql: str, rows: list[tuple]) -> None:
        self.cursor.executemany(self._text(sql), rows)


@dataclass(frozen=True, slots=True)
class _LockedAccount:
    usd: int
    diem: int
    epoch: str
    # The DIEM the row still holds from an epoch that has ended (None: the epoch is today's)
    # and that epoch: the caller's UPDATE replaces it with the new allocation, and journals
    # both.
    expired_diem: int | None = None
    expired_epoch: str | None = None


def _locked_account(db: _Statements, account_id: str, now: datetime) -> _LockedAccount:
    """USD, DIEM and epoch of the account, locked. A new UTC day resets the DIEM allocation to
    the staked amount (1 DIEM per token): the caller's UPDATE writes it with the epoch."""
    row = db.first("SELECT usd_balance_nanos, diem_balance_nanos, diem_epoch, staked_tokens "
                   "FROM accounts WHERE id = ?{lock}", (account_id,))
    if row is None:
        raise AccountNotFound()
    usd, diem, epoch, staked = row
    today = epoch_day(now)
    if epoch != today:
        return _LockedAccount(usd, staked * NANOS_PER_UNIT, today, expired_diem=diem,
                              expired_epoch=epoch)
    return _LockedAccount(usd, diem, today)


_INSERT_BALANCE_ENTRY = (
    "INSERT INTO balance_entries (account_id, kind, usd_nanos, diem_nanos, source, "
    "created_at) VALUES (?, ?, 0, ?, ?, ?)")


def _journal_new_epoch(db: _Statements, account_id: str, account: _LockedAccount,
                       now: datetime) -> None:
    """The DIEM of the ended epoch expires and the new epoch's allocation is given: once per
    account and UTC day, in the transaction that writes the new epoch to the row."""
    if account.expired_diem is None:
        return
    created = db.datetime(now)
    rows = [(account_id, kind, amount, epoch, created) for kind, amount, epoch in
            ((EntryKind.DIEM_EXPIRY.value, -account.expired_diem, account.expired_epoch),
             (EntryKind.DIEM_ALLOCATION.value, account.diem, account.epoch)) if amount]
    if rows:
        db.many(_INSERT_BALANCE_ENTRY, rows)


def _locked_window(db: _Statements, payer: Payer, start: str) -> tuple[int, int]:
    """(USD, DIEM) spent in the key's window (created at zero when new), locked: one
    statement."""
    return db.first(
        "INSERT INTO key_spend_windows (api_key_id, window_start, usd_nanos, diem_nanos) "
        "VALUES (?, ?, 0, 0) ON CONFLICT (api_key_id, window_start) "
        "DO UPDATE SET usd_nanos = key_spend_windows.usd_nanos "
        "RETURNING usd_nanos, diem_nanos", (payer.api_key_id, start))


def _add_to_window(db: _Statements, key_id: str, start: str, usd: int, diem: int) -> None:
    db.run("UPDATE key_spend_windows SET usd_nanos = usd_nanos + ?, diem_nanos = diem_nanos + ? "
           "WHERE api_key_id = ? AND window_start = ?", (usd, diem, key_id, start))


def hold(session: Session, request_id: str, payer: Payer, amount_nanos: int,
         now: datetime, holder: str | None = None) -> HoldResult:
    """Reserve the most the request may cost against balance and key limit, or refuse (402).
    `holder`: the billing service taking it (see `stale_holds`)."""
    db = _Statements(session)
    try:
        account = _locked_account(db, payer.account_id, now)
    except AccountNotFound:
        # A wallet's row is written at its first top-up or charge (billing/wallet_accounts):
        # until then its balance is 0, and a refusal writes nothing.
        if payer.wallet_address is None:
            raise
        if amount_nanos > 0:
            raise InsufficientBalance(0, amount_nanos) from None
        create_wallet_account(session, payer.wallet_address)
        account = _locked_account(db, payer.account_id, now)
    usd_balance, diem_balance, epoch = account.usd, account.diem, account.epoch
    before = Balances(usd_balance, diem_balance)
    diem_room = diem_balance
    window = start = None
    if payer.has_limits:
        start = window_start(payer.limit_period, now)
        window = _locked_window(db, payer, start)
        if payer.limit_diem_nanos is not None:
            diem_room = min(diem_room, max(0, payer.limit_diem_nanos - window[1]))
    diem_part = min(amount_nanos, diem_room)
    usd_part = amount_nanos - diem_part
    if usd_part > usd_balance:
        if usd_balance + diem_balance < amount_nanos:
            raise InsufficientBalance(usd_balance + diem_balance, amount_nanos)
        raise ApiError(402, "This API key has reached its DIEM consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_DIEM_SPEND_LIMIT_EXCEEDED")
    if window is not None and payer.limit_usd_nanos is not None \
            and window[0] + usd_part > payer.limit_usd_nanos:
        raise ApiError(402, "This API key has reached its USD consumption limit for the "
                            f"current {payer.limit_period} period",
                       code="API_KEY_USD_SPEND_LIMIT_EXCEEDED")
    db.run("UPDATE accounts SET usd_balance_nanos = ?, diem_balance_nanos = ?, diem_epoch = ? "
           "WHERE id = ?", (usd_balance - usd_part, diem_balance - diem_part, epoch,
                            payer.account_id))
    _journal_new_epoch(db, payer.account_id, account, now)
    if start is not None and payer.api_key_id is not None:
        _add_to_window(db, payer.api_key_id, start, usd_part, diem_part)
    db.run("INSERT INTO reservations (request_id, account_id, api_key_id, window_start, "
           "usd_nanos, diem_nanos, diem_epoch, holder, created_at) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
           (request_id, payer.account_id, payer.api_key_id, start, usd_part, diem_part, epoch,
            holder, db.datetime(now)))
    return HoldResult(before, usd_part, diem_part)


@dataclass(frozen=True, slots=True)
class _HoldRow:
    request_id: str
    account_id: str
    api_key_id: str | None
    window_start: str | None
    usd_nanos: int
    diem_nanos: int
    diem_epoch: str | None


def _give_back(db: _Statements, res: _HoldRow, usd_nanos: int, diem_nanos: int,
               now: datetime) -> Balances | None:
    """Return unused parts of a hold to the balance and the key window; DIEM only into the
    epoch it came from (yesterday's DIEM does not come back today: the journal records it as
    expired). The account's balance after it, returned or not (the answer's balance header
    shows it); None: no account row."""
    if usd_nanos or diem_nanos:
        row = db.first(
            "UPDATE accounts SET usd_balance_nanos = usd_balance_nanos + ?, "
            "diem_balance_nanos = CASE WHEN diem_epoch = ? THEN diem_balance_nanos + ? "
            "ELSE diem_balance_nanos END WHERE id = ? "
            "RETURNING usd_balance_nanos, diem_balance_nanos, diem_epoch, staked_tokens",
            (usd_nanos, res.diem_epoch, diem_nanos, res.account_id))
        if diem_nanos and row is not None and row[2] != res.diem_epoch:
            db.run(_INSERT_BALANCE_ENTRY, (res.account_id, EntryKind.DIEM_EXPIRY.value,
                                           -diem_nanos, res.request_id, db.datetime(now)))
        if res.window_start is not None and res.api_key_id is not None:
            _add_to_window(db, res.api_key_id, res.window_start, -usd_nanos, -diem_nanos)
    else:  # charged all it held: the balance is as the hold (and anything since) left it
        row = db.first("SELECT usd_balance_nanos, diem_balance_nanos, diem_epoch, "
                       "staked_tokens FROM accounts WHERE id = ?", (res.account_id,))
    db.run("DELETE FROM reservations WHERE request_id = ?", (res.request_id,))
    if row is None:
        return None
    usd, diem, epoch, staked = row
    # A new UTC day's DIEM is the staked amount, whatever the row still says.
    return Balances(usd, diem if epoch == epoch_day(now) else staked * NANOS_PER_UNIT)


def _locked_hold(db: _Statements, request_id: str) -> _HoldRow | None:
    row = db.first("SELECT request_id, account_id, api_key_id, window_start, usd_nanos, "
                   "diem_nanos, diem_epoch FROM reservations WHERE request_id = ?{lock}",
                   (request_id,))
    return _HoldRow(*row) if row is not None else None


@dataclass(frozen=True, slots=True)
class Released:
    balance: Balances | None  # the account's balance after it


def release(session: Session, request_id: str, now: datetime | None = None) -> Released | None:
    """Drop a hold without charging (the request failed on our side). None: nothing held."""
    db = _Statements(session)
    res = _locked_hold(db, request_id)
    if res is None:
        return None
    return Released(_give_back(db, res, res.usd_nanos, res.diem_nanos,
                               now or datetime.now(UTC)))


@dataclass(frozen=True, slots=True)
class Settled:
    usd_nanos: int
    diem_nanos: int
    repeated: bool = False
    balance: Balances | None = None  # the account's balance after it
    released: bool = False  # nothing charged: the hold was released before (`late`)


def _late_hold(session: Session, request_id: str, payer: Payer, cost_nanos: int,
               now: datetime) -> None:
    """The work of a request whose hold was swept (it ran past the sweeper's age limit) is
    still charged: as much of its cost as the balance holds now, whatever the key's limit."""
    account = _locked_account(_Statements(session), payer.account_id, now)
    amount = max(0, min(cost_nanos, account.usd + account.diem))
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


_INSERT_ENTRY = (
    "INSERT INTO ledger_entries (request_id, account_id, api_key_id, wallet_address, model_id, "
    "model_type, unit_type, units, usd_nanos, diem_nanos, execution_ms, started_at, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_INSERT_LINE = (
    "INSERT INTO ledger_lines (request_id, account_id, api_key_id, model_id, line_type, sku, "
    "currency, units, amount_nanos, price_per_unit_usd, prompt_tokens, completion_tokens, "
    "execution_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_UPSERT_ROLLUP = (
    "INSERT INTO usage_daily (account_id, day, api_key_id, model_id, model_type, line_type, "
    "usd_nanos, diem_nanos, units, requests) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (account_id, day, api_key_id, model_id, line_type) DO UPDATE SET "
    "usd_nanos = usage_daily.usd_nanos + excluded.usd_nanos, "
    "diem_nanos = usage_daily.diem_nanos + excluded.diem_nanos, "
    "units = usage_daily.units + excluded.units, "
    "requests = usage_daily.requests + excluded.requests")


def settle(session: Session, request_id: str, payer: Payer, cost: Cost, *, started_at: datetime,
           now: datetime, execution_ms: int | None = None, late: bool = True) -> Settled:
    """Charge the measured cost (at most what was held), DIEM first, and write the ledger entry
    with its lines and daily rollups. A second settlement of the same request changes nothing.
    `late` False: a hold the sweeper released stays released (nothing charged)."""
    db = _Statements(session)
    res = _locked_hold(db, request_id)
    if res is None:  # settled before (the hold is gone), or the sweeper released it
        existing = db.first("SELECT usd_nanos, diem_nanos FROM ledger_entries "
                            "WHERE request_id = ?", (request_id,))
        if existing is not None:
            return Settled(existing[0], existing[1], repeated=True)
        if not late:
            return Settled(0, 0, released=True)
        _late_hold(session, request_id, payer, cost.nanos, now)
        res = _locked_hold(db, request_id)
        assert res is not None, "the late hold was just written"
    total = min(cost.nanos, res.usd_nanos + res.diem_nanos)
    diem = min(total, res.diem_nanos)
    usd = total - diem
    balance = _give_back(db, res, res.usd_nanos - usd, res.diem_nanos - diem, now)
    model = cost.model
    created = db.datetime(now)
    db.run(_INSERT_ENTRY, (
        request_id, payer.account_id, payer.api_key_id, payer.wallet_address, model.id,
        model.type, unit_type(model), db.json(cost.units), usd, diem, execution_ms,
        db.datetime(started_at), created))
    # the whole prompt: the tokens read from the prefix cache (cache_read) included
    prompt = sum(cost.units.get(t, 0) for t in ("input", "cache_read")) \
        if model.type in ("text", "embedding") else None
    completion = cost.units.get("output") if model.type == "text" else None
    day = db.date(now.astimezone(UTC).date())
    lines, rollups, diem_left = [], [], diem
    for line, line_total in zip(cost.lines, _line_totals(cost, total), strict=True):
        paid_diem = min(line_total, diem_left)
        diem_left -= paid_diem
        parts = [(currency, amount) for currency, amount in
                 (("DIEM", paid_diem), ("USD", line_total - paid_diem)) if amount > 0]
        line_sku = sku(model, line.line_type)
        for currency, amount in parts or [("USD", 0)]:
            lines.append((request_id, payer.account_id, payer.api_key_id, model.id,
                          line.line_type, line_sku, currency, line.units, amount,
                          line.price_per_unit_usd, prompt, completion, execution_ms, created))
        rollups.append((payer.account_id, day, payer.api_key_id or "", model.id, model.type,
                        line.line_type, line_total - paid_diem, paid_diem, line.units, 1))
    if lines:
        db.many(_INSERT_LINE, lines)
        db.many(_UPSERT_ROLLUP, rollups)
    return Settled(usd, diem, balance=balance)


# The cold paths (key limits changed, sweeps) stay in Core statements.
_windows = KeySpendWindow.__table__
_holds = Reservation.__table__
_holders = BillingHolder.__table__
_rollups = UsageDaily.__table__


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
    stmt = dialect_insert(session)(_windows).values(
        api_key_id=key_id, window_start=start, usd_nanos=int(usd), diem_nanos=int(diem))
    # A window that exists already counts everything (holds in flight included): keep it.
    session.execute(stmt.on_conflict_do_nothing(index_elements=["api_key_id", "window_start"]))


def drop_windows(session: Session, key_id: str) -> None:
    """A key without limits keeps no windows; setting a limit again seeds a fresh one."""
    session.execute(delete(_windows).where(_windows.c.api_key_id == key_id))


def stale_holds(session: Session, now: datetime, max_age: timedelta,
                holder_timeout: timedelta | None = None) -> list[str]:
    """Holds no request will finish: older than any request may run, or (with
    `holder_timeout`) taken by a billing service that stopped beating that long ago, its
    replica dead mid-request. The holds of queued media jobs and of open background
    responses are not among them: their job (the response's worker, or the replica that takes
    it over) settles or releases them.

    Releasing a hold whose request does finish after all costs nothing: its settlement takes a
    late hold and charges as usual."""
    stale = _holds.c.created_at < now - max_age
    if holder_timeout is not None:
        gone = now - holder_timeout
        beating = select(_holders.c.id).where(_holders.c.seen_at >= gone)
        stale = or_(stale, and_(_holds.c.holder.is_not(None), _holds.c.created_at < gone,
                                _holds.c.holder.not_in(beating)))
    return list(session.execute(select(_holds.c.request_id)
                                .where(stale, _holds.c.request_id.not_in(open_job_request_ids()),
                                       _holds.c.request_id.not_in(open_response_request_ids())))
                .scalars())


def is_held(session: Session, request_id: str) -> bool:
    """Whether the request's hold is still there (neither settled nor released)."""
    return session.execute(select(_holds.c.request_id)
                           .where(_holds.c.request_id == request_id)).first() is not None


def beat(session: Session, holder: str, now: datetime) -> None:
    """The billing service `holder` is alive (committed by the caller)."""
    row = session.get(BillingHolder, holder)
    if row is None:
        session.add(BillingHolder(id=holder, seen_at=now))
    else:
        row.seen_at = now


def forget_gone_holders(session: Session, now: datetime, max_age: timedelta) -> None:
    """Rows of billing services silent for longer than any hold may live (committed by the
    caller): their holds are released by then."""
    session.execute(delete(_holders).where(_holders.c.seen_at < now - max_age))


def balances(session: Session, account_id: str, now: datetime) -> tuple[Balances, int]:
    """(balances, staked tokens) with the DIEM allocation of the current epoch."""
    account = session.get(Account, account_id)
    if account is None:
        raise ApiError(401, "Account not found", code="AUTHENTICATION_FAILED")
    diem = account.diem_balance_nanos
    if account.diem_epoch != epoch_day(now):
        diem = account.staked_tokens * NANOS_PER_UNIT
    return Balances(account.usd_balance_nanos, diem), account.staked_tokens
