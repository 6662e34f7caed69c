"""The job table of queued media generations (`media_jobs`): its state machine and its leases.

    QUEUED --claim--> PROCESSING --complete--> COMPLETED
                          |  \\--fail-------> FAILED
                          \\--lease ran out--> PROCESSING again (a new runner, a new attempt),
                                              or FAILED once the attempts are used up

Every move is one conditional UPDATE (compare-and-set on the status and the lease owner), so
any number of runners on any number of replicas can share the table: a job is run by one
runner at a time, and a runner that lost its lease cannot write over the new owner's work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, and_, func, insert, literal, or_, text, true, update
from sqlmodel import Session, col, select

from serve_app.db.engine import run_in_session
from serve_app.db.tables import (
    OPEN_STATUSES,
    JobRow,
    JobStatus,
    LedgerEntry,
    Reservation,
    as_utc,
    utcnow,
)

T = TypeVar("T")

# A runner renews its lease every third of this; a lease that ran out means the runner died.
LEASE = timedelta(seconds=30)
# A job is tried this many times (a runner that died counts as a try) before it fails.
MAX_ATTEMPTS = 2
# The P80 of execution times is taken over this many recent jobs of the model.
TIMING_WINDOW = 50


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as the routes and the runner read it (detached from any session)."""

    queue_id: str
    kind: str
    model_id: str
    status: str
    request_id: str
    account_id: str
    api_key_id: str | None
    wallet_address: str | None
    params: dict[str, Any]
    inputs: dict[str, str]
    cost_lines: list[list[Any]]
    attempts: int
    result_key: str | None
    media_type: str | None
    error_status: int | None
    error_code: str | None
    error: str | None
    media_deleted: bool
    stored_bytes: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, row: JobRow) -> JobView:
        return cls(row.queue_id, row.kind, row.model_id, row.status, row.request_id,
                   row.account_id, row.api_key_id, row.wallet_address, dict(row.params),
                   dict(row.inputs), list(row.cost_lines), row.attempts, row.result_key,
                   row.media_type, row.error_status, row.error_code, row.error,
                   row.media_deleted, row.stored_bytes,
                   as_utc(row.created_at),  # type: ignore[arg-type]
                   as_utc(row.started_at), as_utc(row.finished_at))


class JobQueue:
    """The job table's operations; blocking ones run in a worker thread."""

    def __init__(self, engine: Engine, *, clock: Callable[[], datetime] = utcnow,
                 lease: timedelta = LEASE, max_attempts: int = MAX_ATTEMPTS) -> None:
        self.engine, self.clock = engine, clock
        self.lease, self.max_attempts = lease, max_attempts

    async def _run(self, work: Callable[[Session], T]) -> T:
        def run(session: Session) -> T:
            out = work(session)
            session.commit()
            return out
        return await run_in_session(self.engine, run)

    async def add(self, job: JobRow) -> JobView:
        def write(session: Session) -> JobView:
            session.add(job)
            session.flush()
            return JobView.of(job)
        return await self._run(write)

    async def add_within(self, job: JobRow, open_jobs: int, stored_bytes: int
                         ) -> JobView | None:
        """Write `job` only if its account then has fewer than `open_jobs` open jobs and
        keeps, with this job's bytes, at most `stored_bytes`; None when it would not. One
        conditional INSERT (SQLite runs it under its write lock), after a transaction lock
        on the account on PostgreSQL (whose INSERT would not see a concurrent one's row):
        replicas racing for an account's last place cannot both take it."""
        table = JobRow.__table__  # type: ignore[attr-defined]
        values = {column.name: getattr(job, column.name) for column in table.columns}
        account = col(JobRow.account_id) == job.account_id
        open_count = select(func.count()).select_from(JobRow).where(
            account, col(JobRow.status).in_(OPEN_STATUSES)).scalar_subquery()
        stored = select(func.coalesce(func.sum(JobRow.stored_bytes), 0)).where(
            account, col(JobRow.media_deleted).is_(False)).scalar_subquery()
        row = select(*(literal(values[c.name], type_=c.type) for c in table.columns)).where(
            open_count < open_jobs, stored + job.stored_bytes <= stored_bytes)

        def write(session: Session) -> JobView | None:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                                {"k": f"media_jobs:{job.account_id}"})
            written = session.execute(insert(table).from_select(list(values), row)
                                      .returning(table.c.queue_id)).first()
            return JobView.of(job) if written is not None else None
        return await self._run(write)

    async def get(self, queue_id: str) -> JobView | None:
        def read(session: Session) -> JobView | None:
            row = session.get(JobRow, queue_id)
            return JobView.of(row) if row is not None else None
        return await self._run(read)

    async def claim(self, owner: str, model_ids: list[str]) -> JobView | None:
        """Take a job of `model_ids` that is queued, or whose runner's lease ran out (another
        attempt), for `owner`; None when there is none.

        Accounts take turns: the job comes from the account served least recently (one never
        served first, then the one whose last job started longest ago), its oldest job first.
        One account's thousand queued jobs then wait beside another's one, not before it."""
        now = self.clock()
        claimable = and_(col(JobRow.model_id).in_(model_ids), or_(
            col(JobRow.status) == JobStatus.QUEUED,
            and_(col(JobRow.status) == JobStatus.PROCESSING,
                 col(JobRow.lease_expires_at) < now,
                 col(JobRow.attempts) < self.max_attempts)))

        def take(session: Session) -> JobView | None:
            for account_id in _accounts_in_turn(session, claimable):
                candidates = session.exec(
                    select(JobRow.queue_id).where(claimable,
                                                    col(JobRow.account_id) == account_id)
                    .order_by(col(JobRow.created_at)).limit(2)).all()
                for queue_id in candidates:
                    taken = session.execute(
                        update(JobRow).where(col(JobRow.queue_id) == queue_id, claimable)
                        .values(status=JobStatus.PROCESSING, lease_owner=owner,
                                lease_expires_at=now + self.lease,
                                attempts=JobRow.attempts + 1,  # type: ignore[operator]
                                started_at=now))
                    if taken.rowcount == 1:  # type: ignore[attr-defined]
                        session.commit()
                        row = session.get(JobRow, queue_id)
                        assert row is not None
                        session.refresh(row)
                        return JobView.of(row)
            return None
        return await self._run(take)

    async def renew(self, queue_id: str, owner: str) -> bool:
        """Extend `owner`'s lease; False when the job is no longer its own."""
        now = self.clock()
        return await self._owned_update(queue_id, owner, lease_expires_at=now + self.lease)

    async def requeue(self, queue_id: str, owner: str, *, count_try: bool) -> bool:
        """Give a job back to the queue: its model was full (the try does not count) or went
        away mid-job (it does)."""
        values: dict[str, Any] = {"status": JobStatus.QUEUED, "lease_owner": None,
                                  "lease_expires_at": None}
        if not count_try:
            values["attempts"] = JobRow.attempts - 1  # type: ignore[operator]
        return await self._owned_update(queue_id, owner, **values)

    async def complete(self, queue_id: str, owner: str, result_key: str,
                       media_type: str, stored_bytes: int) -> bool:
        """`stored_bytes`: what the job keeps in the store now (its inputs and media)."""
        return await self._owned_update(
            queue_id, owner, status=JobStatus.COMPLETED, result_key=result_key,
            media_type=media_type, finished_at=self.clock(), lease_owner=None,
            lease_expires_at=None, stored_bytes=stored_bytes)

    def _failed(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"status": JobStatus.FAILED, "error_status": status, "error_code": code,
                "error": message[:2000], "finished_at": self.clock(), "lease_owner": None,
                "lease_expires_at": None}

    async def fail(self, queue_id: str, owner: str, status: int, code: str,
                   message: str) -> bool:
        """Fail `owner`'s job (False: it is no longer `owner`'s)."""
        return await self._owned_update(queue_id, owner, **self._failed(status, code, message))

    async def fail_if(self, queue_id: str, condition: Any, status: int, code: str,
                      message: str) -> bool:
        """Fail a job still open that meets `condition` (checked in the same UPDATE)."""
        values = self._failed(status, code, message)

        def write(session: Session) -> bool:
            done = session.execute(update(JobRow).where(
                col(JobRow.queue_id) == queue_id,
                col(JobRow.status).in_(OPEN_STATUSES), condition).values(**values))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    def worn_out_condition(self) -> Any:
        """Its runner died (the lease ran out) on its last try."""
        return and_(col(JobRow.status) == JobStatus.PROCESSING,
                    col(JobRow.lease_expires_at) < self.clock(),
                    col(JobRow.attempts) >= self.max_attempts)

    async def withdraw(self, queue_id: str, message: str) -> bool:
        """Fail an open job whoever runs it (its client left before it learned the id)."""
        return await self.fail_if(queue_id, true(), 499, "CLIENT_CLOSED_REQUEST", message)

    async def _owned_update(self, queue_id: str, owner: str, **values: Any) -> bool:
        def write(session: Session) -> bool:
            done = session.execute(update(JobRow).where(
                col(JobRow.queue_id) == queue_id,
                col(JobRow.status) == JobStatus.PROCESSING,
                col(JobRow.lease_owner) == owner).values(**values))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def worn_out(self, model_ids: list[str]) -> list[JobView]:
        """Jobs whose runner died on their last attempt: to be failed and released."""

        def read(session: Session) -> list[JobView]:
            rows = session.exec(select(JobRow).where(
                col(JobRow.model_id).in_(model_ids), self.worn_out_condition())).all()
            return [JobView.of(row) for row in rows]
        return await self._run(read)

    async def stranded(self, known_models: list[str], queued_before: datetime
                       ) -> list[JobView]:
        """Open jobs no runner will take: of a model no longer in the catalog, or queued
        before `queued_before` (their model's deployment never came back)."""
        def read(session: Session) -> list[JobView]:
            rows = session.exec(select(JobRow).where(
                col(JobRow.status).in_(OPEN_STATUSES),
                or_(col(JobRow.model_id).not_in(known_models),
                    and_(col(JobRow.status) == JobStatus.QUEUED,
                         col(JobRow.created_at) < queued_before)))).all()
            return [JobView.of(row) for row in rows]
        return await self._run(read)

    async def completed_unsettled(self) -> list[JobView]:
        """Completed jobs whose hold is still there: their runner died between marking the
        job complete and settling it."""
        def read(session: Session) -> list[JobView]:
            rows = session.exec(select(JobRow).where(
                col(JobRow.status) == JobStatus.COMPLETED,
                col(JobRow.request_id).in_(select(Reservation.request_id)))).all()
            return [JobView.of(row) for row in rows]
        return await self._run(read)

    async def charged(self, request_id: str) -> bool:
        """Whether the job of `request_id` was charged (its ledger entry was written)."""
        def read(session: Session) -> bool:
            return session.exec(select(LedgerEntry.request_id).where(
                col(LedgerEntry.request_id) == request_id)).first() is not None
        return await self._run(read)

    async def mark_deleted(self, queue_id: str) -> bool:
        """Note that the job keeps nothing in the store any more: its media was deleted
        (`complete`, retrieve with deletion, expiry), or it failed and its inputs went."""
        def write(session: Session) -> bool:
            done = session.execute(update(JobRow).where(
                col(JobRow.queue_id) == queue_id,
                col(JobRow.media_deleted).is_(False)).values(media_deleted=True,
                                                               stored_bytes=0))
            return done.rowcount == 1  # type: ignore[attr-defined]
        return await self._run(write)

    async def set_stored_bytes(self, queue_id: str, stored_bytes: int) -> None:
        """What a finished job keeps once its inputs were deleted (its media)."""
        def write(session: Session) -> None:
            session.execute(update(JobRow).where(
                col(JobRow.queue_id) == queue_id,
                col(JobRow.media_deleted).is_(False)).values(stored_bytes=stored_bytes))
        await self._run(write)

    async def account_usage(self, account_id: str) -> tuple[int, int]:
        """The account's open jobs, and the bytes its jobs keep in the store."""
        def read(session: Session) -> tuple[int, int]:
            open_jobs = session.exec(select(func.count()).select_from(JobRow).where(
                col(JobRow.account_id) == account_id,
                col(JobRow.status).in_(OPEN_STATUSES))).one()
            stored = session.exec(select(func.coalesce(func.sum(JobRow.stored_bytes), 0))
                                  .where(col(JobRow.account_id) == account_id,
                                         col(JobRow.media_deleted).is_(False))).one()
            return int(open_jobs), int(stored)
        return await self._run(read)

    async def expired(self, made_before: datetime, limit: int = 100) -> list[JobView]:
        """Ended jobs that still keep files: failed ones (their inputs), and completed ones
        made before `made_before` (their media, past its download link's lifetime)."""
        def read(session: Session) -> list[JobView]:
            rows = session.exec(select(JobRow).where(
                col(JobRow.media_deleted).is_(False),
                or_(col(JobRow.status) == JobStatus.FAILED,
                    and_(col(JobRow.status) == JobStatus.COMPLETED,
                         col(JobRow.finished_at) < made_before)))
                .order_by(col(JobRow.finished_at)).limit(limit)).all()
            return [JobView.of(row) for row in rows]
        return await self._run(read)

    async def p80_execution_ms(self, model_id: str) -> float | None:
        """The 80th percentile of the model's recent completed jobs' run times (ms)."""
        def read(session: Session) -> float | None:
            rows = session.exec(select(JobRow.started_at, JobRow.finished_at).where(
                col(JobRow.model_id) == model_id,
                col(JobRow.status) == JobStatus.COMPLETED)
                .order_by(col(JobRow.finished_at).desc()).limit(TIMING_WINDOW)).all()
            times = sorted((as_utc(end) - as_utc(start)).total_seconds() * 1000
                           for start, end in rows if start and end)
            if not times:
                return None
            return times[min(len(times) - 1, int(0.8 * len(times)))]
        return await self._run(read)


def _accounts_in_turn(session: Session, claimable: Any) -> list[str]:
    """The accounts with a claimable job, least recently served first (never served before
    served; then the oldest last start), ties to the one waiting longest."""
    waiting = session.exec(select(JobRow.account_id, func.min(JobRow.created_at))
                           .where(claimable).group_by(col(JobRow.account_id))).all()
    if not waiting:
        return []
    served = dict(session.exec(
        select(JobRow.account_id, func.max(JobRow.started_at))
        .where(col(JobRow.account_id).in_([account for account, _ in waiting]))
        .group_by(col(JobRow.account_id))).all())

    def turn(entry: tuple[str, datetime]) -> tuple[bool, datetime, datetime]:
        account, oldest = entry
        last = as_utc(served.get(account))
        return last is not None, last or _EPOCH, as_utc(oldest) or _EPOCH
    return [account for account, _ in sorted(waiting, key=turn)]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def input_key(queue_id: str, name: str) -> str:
    """Where a job's input file is kept in the result store."""
    return f"jobs/{queue_id}/input-{name}"


def result_key(queue_id: str) -> str:
    """Where a job's media is kept in the result store."""
    return f"jobs/{queue_id}/result"
