"""The crypto RPC proxy's daily credit cap: the credits each account used in the past 24
hours, read from the ledger, and when enough of them leave the window for a refused request
to fit (its 429's `X-RateLimit-Reset`)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timedelta

from sqlalchemy import Subquery, func, select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.db.engine import run_in_session
from serve_app.db.tables import LedgerLine, as_utc

# The ledger line type of crypto RPC usage: its units are credits.
LINE_TYPE = "credits"
CREDIT_WINDOW = timedelta(hours=24)
# How long a replica trusts its last reading of an account's credits of the past 24 hours
# (its own settlements since are added to it): one ledger read per account every few seconds.
CREDIT_READ_TTL_S = 5.0


class CreditWindow:
    """Credits each account used in the past 24 hours, from the ledger (every replica and
    restart sees the same), read at most every CREDIT_READ_TTL_S per account; this replica's
    own settlements since the read, and its calls in flight, are added to the reading."""

    def __init__(self, read_ttl_s: float = CREDIT_READ_TTL_S) -> None:
        self.read_ttl_s = read_ttl_s
        self._readings: dict[str, list[float | int]] = {}  # account -> [read at, credits]
        self._in_flight: Counter[str] = Counter()

    @staticmethod
    def _per_request(account_id: str, since: datetime) -> Subquery:
        """Credits (and time) of each request of the account settled since `since`. A line
        paid partly in DIEM and partly in USD is two rows with the same units."""
        lines = LedgerLine.__table__.c
        return (select(func.max(lines.units).label("credits"),
                       func.min(lines.created_at).label("at"), lines.request_id)
                .where(lines.account_id == account_id, lines.line_type == LINE_TYPE,
                       lines.created_at >= since)
                .group_by(lines.request_id).subquery())

    @classmethod
    def _settled_since(cls, session: Session, account_id: str, since: datetime) -> int:
        per_request = cls._per_request(account_id, since)
        return int(session.execute(
            select(func.coalesce(func.sum(per_request.c.credits), 0))).scalar_one())

    @classmethod
    def _freed_when(cls, session: Session, account_id: str, since: datetime,
                    credits: int) -> datetime | None:
        """When the oldest settled requests that together hold `credits` were settled (their
        credits leave the rolling window 24 hours later); None: the ledger holds fewer."""
        per_request = cls._per_request(account_id, since)
        running = select(per_request.c.at, func.sum(per_request.c.credits).over(
            order_by=(per_request.c.at, per_request.c.request_id)).label("freed")).subquery()
        return as_utc(session.execute(
            select(running.c.at).where(running.c.freed >= credits)
            .order_by(running.c.at).limit(1)).scalar_one_or_none())

    async def resets_at(self, database: Engine, now: datetime, account_id: str,
                        credits: int) -> datetime:
        """When `credits` more fit in the account's rolling 24 hours: once enough of its
        oldest credits leave the window (at the latest, 24 hours from now: the credits of
        calls in flight are not settled yet)."""
        if credits <= 0:
            return now
        since = now - CREDIT_WINDOW
        oldest = await run_in_session(
            database, lambda s: self._freed_when(s, account_id, since, credits))
        return now + CREDIT_WINDOW if oldest is None else oldest + CREDIT_WINDOW

    async def used(self, database: Engine, now: datetime, account_id: str) -> int:
        reading = self._readings.get(account_id)
        if reading is None or time.monotonic() - reading[0] > self.read_ttl_s:
            since = now - CREDIT_WINDOW
            credits = await run_in_session(
                database, lambda s: self._settled_since(s, account_id, since))
            if len(self._readings) > 100_000:
                self._readings.clear()
            reading = self._readings[account_id] = [time.monotonic(), credits]
        return int(reading[1]) + self._in_flight[account_id]

    def start(self, account_id: str, credits: int) -> None:
        self._in_flight[account_id] += credits

    def finish(self, account_id: str, reserved: int, spent: int) -> None:
        self._in_flight[account_id] -= reserved
        if self._in_flight[account_id] <= 0:
            del self._in_flight[account_id]
        reading = self._readings.get(account_id)
        if reading is not None and spent:
            reading[1] = int(reading[1]) + spent
