"""Billing as the routes use it: hold before the work, settle or release after, balances for
the headers, and the sweeper that releases holds of requests that never finished."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cachetools import TTLCache
from sqlmodel import Session

from serve_app.billing import ledger
from serve_app.billing.ledger import Balances, Payer
from serve_app.billing.pricing import Cost
from serve_app.billing.writer import BatchWriter
from serve_app.db.engine import is_sqlite_file, make_engine, run_in_session
from serve_app.db.tables import utcnow
from serve_app.metrics import metrics
from serve_app.money import NANOS_PER_UNIT, from_nanos

logger = logging.getLogger("serve_app.billing")

Clock = Callable[[], datetime]

# A hold older than this belongs to a request that can no longer finish.
HOLD_MAX_AGE = timedelta(hours=1)
# A running billing service beats every HEARTBEAT_S; the holds of one silent for
# HOLDER_TIMEOUT (its replica died mid-request) are released at the next sweep.
HEARTBEAT_S = 5.0
HOLDER_TIMEOUT = timedelta(seconds=30)
SWEEP_INTERVAL_S = 30.0
BALANCE_CACHE_TTL_S = 2.0
ANALYTICS_CACHE_TTL_S = 600.0  # the spec's 10 minutes


class RemainingCredit:
    """`X-Balance-Remaining` of a wallet's answer, read when the answer starts: after the
    settlement for a unary answer, after the hold for a stream (the most it may still cost).
    The middleware turns header values into text with `str`."""

    __slots__ = ("account_id", "billing", "fallback")

    def __init__(self, billing: Billing, account_id: str, fallback: Balances) -> None:
        self.billing, self.account_id, self.fallback = billing, account_id, fallback

    def __str__(self) -> str:
        known = self.billing.known_balance(self.account_id) or self.fallback
        return f"{from_nanos(known.usd_nanos):.6f}"


@dataclass
class Hold:
    """Money held for one request; settled with the measured cost or released."""

    billing: Billing
    request_id: str
    payer: Payer
    before: Balances
    started_at: datetime
    started: float = field(default_factory=time.monotonic)
    done: bool = False
    nanos: int = 0  # the amount held
    # False: a settlement finding the hold released (by the sweep) charges nothing (ledger)
    charge_late: bool = True

    async def settle(self, cost: Cost) -> None:
        if self.done:
            return
        self.done = True
        await self.billing.settle(self, cost)

    async def release(self) -> None:
        if self.done:
            return
        self.done = True
        await self.billing.release(self)

    async def finish(self, cost: Cost | None) -> None:
        """Settle when there is something to charge, otherwise release; survives the
        cancellation of a caller whose client hung up."""
        with contextlib.suppress(asyncio.CancelledError):
            if cost is not None and cost.lines:
                await self.settle(cost)
            else:
                await self.release()


TOKEN_LINES = frozenset({"input", "output", "cache_read", "cache_write"})


def _observe(operation: str, started: float) -> None:
    metrics().billing_seconds.observe(time.perf_counter() - started,
                                      tags={"operation": operation})


def _count_charge(cost: Cost, settled: ledger.Settled) -> None:
    """The metrics of a settlement that charged: what the ledger charged (the cost, or less
    when capped at the hold), and the tokens. A repeated settlement (a worker settling after a
    takeover already did) and one finding its hold released charged nothing: not counted."""
    if settled.repeated or settled.released:
        return
    m, model = metrics(), cost.model.id
    charged = settled.usd_nanos + settled.diem_nanos
    if charged > 0:
        m.charged_usd.inc(charged / NANOS_PER_UNIT, tags={"model": model})
    for line in cost.lines:
        if line.line_type in TOKEN_LINES and line.units > 0:
            m.tokens.inc(line.units, tags={"model": model, "direction": line.line_type})


class Billing:
    def __init__(self, database_url: str, *, clock: Clock = utcnow,
                 balance_timer: Callable[[], float] = time.monotonic) -> None:
        self._engine = make_engine(database_url, write_transactions=True)
        # On SQLite an operation of a quiet replica commits on the caller's thread, never
        # waiting for the database's lock there (billing/writer.py), nor copying the log back
        # into the database: the writer thread's commits do that (the heartbeat's at least).
        inline = make_engine(database_url, write_transactions=True, lock_wait_s=0,
                             checkpoints=False) if is_sqlite_file(database_url) else None
        self.writer = BatchWriter(self._engine, inline_engine=inline)
        self.clock = clock
        self._balances: TTLCache[str, Balances] = TTLCache(
            maxsize=100_000, ttl=BALANCE_CACHE_TTL_S, timer=balance_timer)
        self.analytics_cache: TTLCache[tuple[str, str], dict] = TTLCache(
            maxsize=10_000, ttl=ANALYTICS_CACHE_TTL_S)
        # Named on the holds it takes once it beats (run_sweeper); a service that does not
        # beat (a script, a test) leaves its holds to HOLD_MAX_AGE alone.
        self.holder: str | None = None
        self._beating_since: float | None = None
        # The requests whose holds this replica took and has not yet settled or released: with
        # at most one, the replica is quiet and its money operations may commit on the event
        # loop's thread (billing/writer.py).
        self._open_holds: set[str] = set()

    @property
    def _quiet(self) -> bool:
        return len(self._open_holds) <= 1

    def held_since(self, request_id: str, payer: Payer, created_at: datetime) -> Hold:
        """The hold a request took at `created_at` and passed on (a queued job's, keyed by
        its request id), to settle or release it later; its balances are not known here."""
        age_s = (self.clock() - created_at).total_seconds()
        return Hold(self, request_id, payer, Balances(0, 0), created_at,
                    started=time.monotonic() - age_s)

    async def hold(self, request_id: str, payer: Payer, amount_nanos: int) -> Hold:
        now = self.clock()
        started = time.perf_counter()
        self._open_holds.add(request_id)
        try:
            result = await self.writer.run(
                lambda s: ledger.hold(s, request_id, payer, amount_nanos, now, self.holder),
                quiet=self._quiet)
        except BaseException as exc:
            self._open_holds.discard(request_id)
            if isinstance(exc, asyncio.CancelledError):
                # The caller left while the hold was being written: the hold commits all the
                # same (the writer is shielded), so queue its release right behind it.
                self.writer.submit(lambda s: ledger.release(s, request_id))
            raise
        _observe("hold", started)
        self._balances[payer.account_id] = Balances(
            result.before.usd_nanos - result.usd_nanos,
            result.before.diem_nanos - result.diem_nanos)
        return Hold(self, request_id, payer, result.before, now, nanos=amount_nanos)

    async def settle(self, hold: Hold, cost: Cost) -> ledger.Settled:
        now = self.clock()
        elapsed_ms = int((time.monotonic() - hold.started) * 1000)
        started = time.perf_counter()
        try:
            settled = await self.writer.run(lambda s: ledger.settle(
                s, hold.request_id, hold.payer, cost, started_at=hold.started_at, now=now,
                execution_ms=elapsed_ms, late=hold.charge_late), quiet=self._quiet)
        finally:
            self._open_holds.discard(hold.request_id)
        _observe("settle", started)
        _count_charge(cost, settled)
        self._remember(hold.payer.account_id, settled.balance)
        return settled

    async def release(self, hold: Hold) -> None:
        now = self.clock()
        started = time.perf_counter()
        try:
            released = await self.writer.run(lambda s: ledger.release(s, hold.request_id, now),
                                             quiet=self._quiet)
        finally:
            self._open_holds.discard(hold.request_id)
        _observe("release", started)
        self._remember(hold.payer.account_id, released.balance if released else None)

    def _remember(self, account_id: str, balance: Balances | None) -> None:
        """The balance a money operation left (read in its transaction, whether it gave
        anything back or not), for the answer's `X-Balance-Remaining` and the next request's
        headers: without it, every request after a settlement would read the account again,
        and a request that outlasted the cached entry would show the balance before it."""
        if balance is not None:
            self._balances[account_id] = balance

    def known_balance(self, account_id: str) -> Balances | None:
        """The balance this replica last saw for the account, without reading it."""
        return self._balances.get(account_id)

    def remember_balance(self, account_id: str, balance: Balances) -> None:
        """A balance changed outside the hold/settle path (a top-up)."""
        self._balances[account_id] = balance

    async def balances(self, account_id: str) -> Balances:
        cached = self._balances.get(account_id)
        if cached is not None:
            return cached
        now = self.clock()

        def read() -> Balances:
            with Session(self._engine) as session:
                return ledger.balances(session, account_id, now)[0]

        found = await asyncio.to_thread(read)
        self._balances[account_id] = found
        return found

    async def is_held(self, request_id: str) -> bool:
        """Whether the request's hold is still there (neither settled nor released)."""
        return await run_in_session(self._engine,
                                    lambda session: ledger.is_held(session, request_id))

    async def sweep(self) -> int:
        """Release the holds of requests that can no longer finish; returns how many. Holds
        of silent services count only once this one has beaten for HOLDER_TIMEOUT itself: after
        a database outage every service is silent until it beats again."""
        now = self.clock()
        settled_in = (self._beating_since is not None
                      and time.monotonic() - self._beating_since
                      >= HOLDER_TIMEOUT.total_seconds())

        def stale() -> list[str]:
            with Session(self._engine) as session:
                return ledger.stale_holds(session, now, HOLD_MAX_AGE,
                                          HOLDER_TIMEOUT if settled_in else None)

        released = 0
        for request_id in await asyncio.to_thread(stale):
            if await self.writer.run(lambda s, r=request_id: ledger.release(s, r)):
                logger.warning("released the stale hold of request %s", request_id)
                released += 1
        return released

    async def beat(self) -> None:
        """Tell the other replicas this billing service (and so its holds) is alive."""
        holder = self.holder or uuid.uuid4().hex
        now = self.clock()

        def write(session: Session) -> None:
            ledger.beat(session, holder, now)
            ledger.forget_gone_holders(session, now, HOLD_MAX_AGE)

        try:
            await self.writer.run(write)
        except Exception:
            self._beating_since = None
            raise
        self.holder = holder
        self._beating_since = self._beating_since or time.monotonic()

    async def run_sweeper(self, interval_s: float = SWEEP_INTERVAL_S,
                          heartbeat_s: float = HEARTBEAT_S) -> None:
        next_sweep = time.monotonic()
        while True:
            try:
                await self.beat()
            except Exception:
                logger.warning("the billing heartbeat could not be written", exc_info=True)
            if time.monotonic() >= next_sweep:
                next_sweep = time.monotonic() + interval_s
                try:
                    await self.sweep()
                except Exception:
                    logger.exception("sweeping stale holds failed")
            await asyncio.sleep(heartbeat_s)

    def close(self) -> None:
        self.writer.close()
        self._engine.dispose()
