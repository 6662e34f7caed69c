"""Signed completion webhooks of queued jobs: a job queued with a `callback_url` has a small
JSON event POSTed there once it ends (`job.completed`, `job.failed`), signed with the
account's webhook secret as Stripe signs theirs:

    X-Webhook-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>

The job runner is never involved: each replica's delivery loop (`WebhookDeliveries.run`)
turns ended jobs that name a callback into `webhook_deliveries` rows (the row written and the
job's `callback_url` cleared in one transaction: one event per job, a restart loses none),
then sends the rows that are due, each through the private-address guard (every hop checked),
claimed first so that two replicas never send the same try. A try that is not answered 2xx
is tried again after 1, 2, 4, 8 then 16 minutes (6 tries over about 31 minutes), then given
up. Every delivery row is deleted `KEPT_FOR` after it was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col

from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import (
    JobRow,
    JobStatus,
    WebhookDelivery,
    WebhookSecret,
    as_utc,
    utcnow,
)
from serve_app.errors import invalid_request
from serve_app.jobs.wake import run_rounds
from serve_app.net_guard import BlockedAddress, GuardedFetcher

logger = logging.getLogger("serve_app.jobs")
T = TypeVar("T")

SIGNATURE_HEADER = "X-Webhook-Signature"
EVENT_TYPES = {JobStatus.COMPLETED.value: "job.completed", JobStatus.FAILED.value: "job.failed"}
MAX_ATTEMPTS = 6
FIRST_RETRY = timedelta(minutes=1)  # doubled after each failed try
TRY_LEASE = timedelta(minutes=2)  # a claimed try not recorded by then is tried again
KEPT_FOR = timedelta(days=3)
POLL_INTERVAL_S = 1.0
SWEEP_INTERVAL_S = 300.0
BATCH = 20
MAX_URL_LENGTH = 2048


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The `X-Webhook-Signature` value of `body` sent at `timestamp`."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


async def check_callback_url(guard: GuardedFetcher, url: str) -> None:
    """400 unless `url` is an http(s) URL of a public host (or one the operator allows)."""
    if len(url) > MAX_URL_LENGTH:
        raise invalid_request(f"callback_url is longer than {MAX_URL_LENGTH} characters",
                              "callback_url")
    try:
        await guard.check(url)
    except (BlockedAddress, OSError, ValueError) as exc:
        raise invalid_request("callback_url must be an http or https URL of a public host "
                              f"({exc})", "callback_url") from exc


def event_of(job: JobRow, delivery_id: str, now: datetime) -> dict[str, Any]:
    """The event of an ended job."""
    event: dict[str, Any] = {
        "id": delivery_id, "type": EVENT_TYPES[job.status], "queue_id": job.queue_id,
        "model": job.model_id, "kind": job.kind, "status": job.status,
        "created": int((as_utc(job.finished_at) or now).timestamp())}
    if job.status == JobStatus.FAILED:
        event["error"] = {"code": job.error_code, "message": job.error}
        event["credits_refunded"] = True  # a failed job's hold is given back: nothing charged
    return event


class WebhookSecrets:
    """Each account's signing secret, made on first use. It is kept as it must be used (the
    platform signs with it); it is never logged, and only the account's admin keys read it."""

    def __init__(self, database: Engine) -> None:
        self.database = database

    async def get(self, account_id: str) -> str:
        def read(session: Session) -> str:
            session.execute(dialect_insert(session)(WebhookSecret)
                            .values(account_id=account_id, secret=_new_secret(),
                                    created_at=utcnow())
                            .on_conflict_do_nothing(index_elements=["account_id"]))
            session.commit()
            return session.execute(select(WebhookSecret.secret).where(
                WebhookSecret.account_id == account_id)).scalar_one()
        return await run_in_session(self.database, read)

    async def rotate(self, account_id: str) -> str:
        """A new secret: events signed from now on use it (the old one stops working)."""
        fresh = _new_secret()

        def write(session: Session) -> str:
            session.execute(dialect_insert(session)(WebhookSecret)
                            .values(account_id=account_id, secret=fresh, created_at=utcnow())
                            .on_conflict_do_update(index_elements=["account_id"],
                                                   set_={"secret": fresh,
                                                         "created_at": utcnow()}))
            session.commit()
            return fresh
        return await run_in_session(self.database, write)


def _new_secret() -> str:
    return "whsec_" + secrets.token_hex(32)


class WebhookDeliveries:
    """The delivery loop of one replica (see the module)."""

    def __init__(self, database: Engine, guard: GuardedFetcher, secrets_: WebhookSecrets, *,
                 clock: Callable[[], datetime] = utcnow, max_attempts: int = MAX_ATTEMPTS,
                 first_retry: timedelta = FIRST_RETRY,
                 poll_interval_s: float = POLL_INTERVAL_S) -> None:
        self.database, self.guard, self.secrets = database, guard, secrets_
        self.clock, self.max_attempts, self.first_retry = clock, max_attempts, first_retry
        self.poll_interval_s = poll_interval_s
        self.upkeep: list[Callable[[], Any]] = []  # other sweeps run with this one's
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self, work: Callable[[Session], T]) -> T:
        def run(session: Session) -> T:
            out = work(session)
            session.commit()
            return out
        return await run_in_session(self.database, run)

    async def run(self) -> None:
        async def deliver() -> None:
            await self.enqueue_ended()
            await self.deliver_due()

        await run_rounds(deliver, self.sweep, wake=self._wake,
                         poll_interval_s=self.poll_interval_s,
                         sweep_interval_s=SWEEP_INTERVAL_S, name="webhook delivery")

    async def enqueue_ended(self, limit: int = 100) -> int:
        """A delivery row for each ended job that names a callback; returns how many."""
        now = self.clock()

        def write(session: Session) -> int:
            jobs = session.execute(select(JobRow).where(
                col(JobRow.callback_url).is_not(None),
                col(JobRow.status).in_(list(EVENT_TYPES))).limit(limit)).scalars().all()
            for job in jobs:
                delivery = WebhookDelivery(queue_id=job.queue_id, account_id=job.account_id,
                                           url=job.callback_url or "", payload="",
                                           next_attempt_at=now, created_at=now,
                                           expires_at=now + KEPT_FOR)
                delivery.payload = orjson.dumps(event_of(job, delivery.id, now)).decode()
                values = delivery.model_dump()
                session.execute(dialect_insert(session)(WebhookDelivery).values(**values)
                                .on_conflict_do_nothing(index_elements=["queue_id"]))
                session.execute(update(JobRow).where(col(JobRow.queue_id) == job.queue_id)
                                .values(callback_url=None)
                                .execution_options(synchronize_session=False))
            return len(jobs)
        return await self._run(write)

    async def deliver_due(self) -> int:
        """Send the tries that are due (each claimed first); returns how many were sent."""
        now = self.clock()

        def take(session: Session) -> list[WebhookDelivery]:
            due = session.execute(select(WebhookDelivery).where(
                col(WebhookDelivery.next_attempt_at) <= now)
                .order_by(col(WebhookDelivery.next_attempt_at)).limit(BATCH)).scalars().all()
            taken = []
            for row in due:
                claimed = session.execute(update(WebhookDelivery).where(
                    col(WebhookDelivery.id) == row.id,
                    col(WebhookDelivery.next_attempt_at) <= now,
                    col(WebhookDelivery.attempts) == row.attempts)
                    .values(next_attempt_at=now + TRY_LEASE)
                    .execution_options(synchronize_session=False))
                if claimed.rowcount == 1:  # type: ignore[attr-defined]
                    taken.append(row)
            return taken
        rows = await self._run(take)
        await asyncio.gather(*(self._attempt(row) for row in rows))
        return len(rows)

    async def _attempt(self, row: WebhookDelivery) -> None:
        body = row.payload.encode()
        error: str | None = None
        try:
            secret = await self.secrets.get(row.account_id)
            sent_at = int(self.clock().timestamp())
            answer = await self.guard.fetch(
                row.url, method="POST", content=body,
                headers={"Content-Type": "application/json",
                         SIGNATURE_HEADER: signature(secret, sent_at, body)})
            if answer.url != row.url:
                error = f"redirected to {answer.url}"
            elif not 200 <= answer.status < 300:
                error = f"answered {answer.status}"
        except Exception as exc:  # refused by the guard, unreachable, timed out
            error = f"{type(exc).__name__}: {exc}"
        await self._record(row, error)

    async def _record(self, row: WebhookDelivery, error: str | None) -> None:
        now = self.clock()
        attempts = row.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "last_error": (error or None)
                                  and error[:500]}
        if error is None:
            values.update(delivered_at=now, next_attempt_at=None)
        elif attempts >= self.max_attempts:
            values["next_attempt_at"] = None
            logger.warning("webhook of job %s given up after %d tries: %s", row.queue_id,
                           attempts, error)
        else:
            values["next_attempt_at"] = now + self.first_retry * 2 ** (attempts - 1)
        await self._run(lambda s: s.execute(update(WebhookDelivery).where(
            col(WebhookDelivery.id) == row.id).values(**values)))

    async def sweep(self) -> int:
        """Delete delivery rows past their `expires_at`, and run the other sweeps."""
        now = self.clock()
        gone = await self._run(lambda s: int(s.execute(delete(WebhookDelivery).where(
            col(WebhookDelivery.expires_at) <= now)).rowcount or 0))  # type: ignore[attr-defined]
        for other in self.upkeep:
            with contextlib.suppress(Exception):
                await other()
        return gone
