"""The `stored_responses` table: each background response's object as it stands, whose it
is, and the lease of the worker that drives it.

    queued -> in_progress -> completed | failed | cancelled | incomplete

Every write of a driven response is conditional on the lease (the worker's `owner`), so a
worker that lost it (its replica was taken for dead) cannot write over the sweep's verdict."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, and_, delete, func, insert, literal, text, update
from sqlmodel import Session, col, select

from serve_app.db.engine import run_in_session
from serve_app.db.tables import OPEN_RESPONSE_STATUSES, StoredResponse, as_utc, utcnow

T = TypeVar("T")

ENDED = ("completed", "failed", "cancelled", "incomplete")
_UNDER_WAY = col(StoredResponse.status).in_(OPEN_RESPONSE_STATUSES)  # the rows still driven


@dataclass(frozen=True)
class ResponseView:
    id: str
    account_id: str
    request_id: str
    status: str
    response: dict[str, Any]
    stored_bytes: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    cancel_requested: bool
    expires_at: datetime
    continuation: str | None = None  # what another replica needs to continue it (JSON)
    created_at: datetime | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @classmethod
    def of(cls, row: StoredResponse) -> ResponseView:
        expires_at = as_utc(row.expires_at)
        assert expires_at is not None
        return cls(row.id, row.account_id, row.request_id, row.status, json.loads(row.response),
                   row.stored_bytes, row.lease_owner, as_utc(row.lease_expires_at),
                   row.cancel_requested, expires_at, row.continuation, as_utc(row.created_at))


class ResponseStore:
    def __init__(self, engine: Engine, *, lease: timedelta,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.engine, self.lease, self.clock = engine, lease, clock

    async def _run(self, work: Callable[[Session], T]) -> T:
        def run(session: Session) -> T:
            out = work(session)
            session.commit()
            return out
        return await run_in_session(self.engine, run)

    async def add_within(self, row: StoredResponse, most: int, most_bytes: int) -> bool:
        """Write `row` only if its account then keeps fewer than `most` responses and, with
        this one's bytes, at most `most_bytes`; False when it would not. One conditional
        INSERT (after a transaction lock on the account on PostgreSQL, whose INSERT would not
        see a concurrent one's row): replicas racing for an account's last place cannot both
        take it."""
        table = StoredResponse.__table__  # type: ignore[attr-defined]
        values = {column.name: getattr(row, column.name) for column in table.columns}
        account = col(StoredResponse.account_id) == row.account_id
        kept = select(func.count()).select_from(StoredResponse).where(account) \
            .scalar_subquery()
        stored = select(func.coalesce(func.sum(StoredResponse.stored_bytes), 0)) \
            .where(account).scalar_subquery()
        source = select(*(literal(values[c.name], type_=c.type) for c in table.columns)).where(
            kept < most, stored + row.stored_bytes <= most_bytes)

        def write(session: Session) -> bool:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                                {"k": f"stored_responses:{row.account_id}"})
            written = session.execute(insert(table).from_select(list(values), source)
                                      .returning(table.c.id)).first()
            return written is not None
        return await self._run(write)

    async def usage(self, account_id: str) -> tuple[int, int]:
        """The responses the account keeps, and their bytes."""
        def read(session: Session) -> tuple[int, int]:
            count, stored = session.exec(
                select(func.count(), func.coalesce(func.sum(StoredResponse.stored_bytes), 0))
                .where(col(StoredResponse.account_id) == account_id)).one()
            return int(count), int(stored)
        return await self._run(read)

    async def get(self, response_id: str) -> ResponseView | None:
        def read(session: Session) -> ResponseView | None:
            row = session.get(StoredResponse, response_id)
            return ResponseView.of(row) if row is not None else None
        return await self._run(read)

    async def write(self, response_id: str, owner: str, *, status: str | None = None,
                    response: dict[str, Any] | None = None, stored_bytes: int | None = None,
                    ended: bool = False, kept_for: timedelta | None = None,
                    continuation: str | None = None) -> bool:
        """Update the response `owner` drives (False: it no longer does, or it has ended).
        `ended`: the lease is given up, what would continue it is dropped, and the response
        is kept `kept_for` from now."""
        values: dict[str, Any] = {}
        if continuation is not None:
            values["continuation"] = continuation
        if status is not None:
            values["status"] = status
        if response is not None:
            values["response"] = json.dumps(response, separators=(",", ":"))
        if stored_bytes is not None:
            values["stored_bytes"] = stored_bytes
        if ended:
            values.update(lease_owner=None, lease_expires_at=None, continuation=None)
            if kept_for is not None:
                values["expires_at"] = self.clock() + kept_for
        else:
            values["lease_expires_at"] = self.clock() + self.lease

        def write(session: Session) -> bool:
            done = session.execute(update(StoredResponse).where(
                col(StoredResponse.id) == response_id,
                col(StoredResponse.lease_owner) == owner,
                _UNDER_WAY).values(**values))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def hand_over(self, response_id: str, owner: str) -> bool:
        """Give up the lease of a response `owner` drives and that keeps what would continue
        it, as run out now: the next sweep of another replica takes it over (takeover.py).
        False: it keeps no continuation, or is no longer `owner`'s."""
        def write(session: Session) -> bool:
            done = session.execute(update(StoredResponse).where(
                col(StoredResponse.id) == response_id,
                col(StoredResponse.lease_owner) == owner,
                _UNDER_WAY,
                col(StoredResponse.continuation).is_not(None)).values(
                    lease_expires_at=self.clock()))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def request_cancel(self, response_id: str) -> None:
        """Ask the worker that drives the response to stop (it reads this as it renews)."""
        def write(session: Session) -> None:
            session.execute(update(StoredResponse).where(
                col(StoredResponse.id) == response_id,
                _UNDER_WAY).values(cancel_requested=True))
        await self._run(write)

    async def delete(self, response_id: str) -> None:
        def remove(session: Session) -> None:
            session.execute(delete(StoredResponse).where(col(StoredResponse.id) == response_id))
        await self._run(remove)

    async def orphaned(self) -> list[ResponseView]:
        """Open responses whose worker's lease ran out: their replica died."""
        now = self.clock()

        def read(session: Session) -> list[ResponseView]:
            rows = session.exec(select(StoredResponse).where(
                _UNDER_WAY,
                col(StoredResponse.lease_expires_at) < now)).all()
            return [ResponseView.of(row) for row in rows]
        return await self._run(read)

    async def fail_orphan(self, view: ResponseView, response: dict[str, Any],
                          kept_for: timedelta) -> bool:
        """Fail an orphaned response, if its lease is still the one that ran out."""
        now = self.clock()

        def write(session: Session) -> bool:
            done = session.execute(update(StoredResponse).where(
                col(StoredResponse.id) == view.id, _UNDER_WAY,
                col(StoredResponse.lease_expires_at) < now).values(
                    status="failed", response=json.dumps(response, separators=(",", ":")),
                    lease_owner=None, lease_expires_at=None, expires_at=now + kept_for,
                    continuation=None))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def claim(self, view: ResponseView, owner: str) -> bool:
        """Take the lease of an orphaned response for `owner`, if it is still the one that
        ran out: one conditional update, so of replicas sweeping at once one wins."""
        now = self.clock()

        def write(session: Session) -> bool:
            done = session.execute(update(StoredResponse).where(
                col(StoredResponse.id) == view.id, _UNDER_WAY,
                col(StoredResponse.lease_expires_at) < now).values(
                    lease_owner=owner, lease_expires_at=now + self.lease))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def expired(self, limit: int = 100) -> list[str]:
        """Ended responses past their keeping time."""
        now = self.clock()

        def read(session: Session) -> list[str]:
            return list(session.exec(select(StoredResponse.id).where(
                and_(col(StoredResponse.status).in_(ENDED),
                     col(StoredResponse.expires_at) < now)).limit(limit)).all())
        return await self._run(read)
