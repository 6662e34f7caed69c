"""Signed completion webhooks of queued jobs: a job queued with a `callback_url` has a small
JSON event POSTed there once it ends (`job.completed`, `job.failed`), signed with the
account's webhook secret by the Standard Webhooks convention (https://www.standardwebhooks.com,
what the `standardwebhooks` package and OpenAI's webhooks verify):

    webhook-id: <the delivery's id, the same on every try>
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>

After a rotation the previous secret signs too, for `ROTATION_GRACE`: the header then holds
two signatures, space-separated, and a receiver holding either secret verifies the event.

The job worker is never involved: each replica's delivery loop (`WebhookDeliveries.run`)
turns ended jobs that name a callback into `webhook_deliveries` rows (the row written and the
job's `callback_url` cleared in one transaction: one event per job, a restart loses none),
then sends the rows that are due, each claimed first so that two replicas never send the same
try, each in a task of its own: the loop never waits for a receiver. A try has short connect
and read timeouts and one deadline, and one account's (and one receiver's) tries in flight are
capped, so a receiver that never answers holds only its own account's places. A
`callback_url` must name a public host, checked when the job is queued and again on every hop
of every try (net_guard.py); the operator's internal allow-list for fetches is not consulted
(only `WEBHOOK_ALLOWED_HOSTS`, empty by default). A try that is not answered 2xx is tried again
after 1, 2, 4, 8 then 16 minutes (6 tries over about 31 minutes), then given up. Every
delivery row is deleted `KEPT_FOR` after it was made.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson
from sqlalchemy import delete, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col
from standardwebhooks.webhooks import Webhook

from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import (
    JobRow,
    JobStatus,
    LedgerEntry,
    WebhookDelivery,
    WebhookSecret,
    as_utc,
    utcnow,
)
from serve_app.errors import invalid_request
from serve_app.jobs.wake import run_rounds
from serve_app.net_guard import BlockedAddress, FetchTimedOut, GuardedFetcher

logger = logging.getLogger("serve_app.jobs")
T = TypeVar("T")

ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER = (
    "webhook-id", "webhook-timestamp", "webhook-signature")
EVENT_TYPES = {JobStatus.COMPLETED.value: "job.completed", JobStatus.FAILED.value: "job.failed"}
MAX_ATTEMPTS = 6
FIRST_RETRY = timedelta(minutes=1)  # doubled after each failed try
TRY_LEASE = timedelta(minutes=2)  # a claimed try not recorded by then is tried again
KEPT_FOR = timedelta(days=3)
POLL_INTERVAL_S = 1.0
SWEEP_INTERVAL_S = 300.0
BATCH = 100  # due rows looked at per round (some may wait for their receiver's place)
MAX_URL_LENGTH = 2048
# How long the previous secret still signs after a rotation (events in flight, receivers
# being redeployed with the new secret).
ROTATION_GRACE = timedelta(hours=24)
# One try: its connect and each read, and the whole try (redirects included).
TRY_TIMEOUT_S = 5.0
TRY_DEADLINE_S = 10.0
# Tries in flight at once: per replica, per account, per receiver (scheme, host, port).
MAX_SENDING = 64
SENDING_PER_ACCOUNT = 4
SENDING_PER_RECEIVER = 2


def callback_fetcher(allowed_hosts: frozenset[str] = frozenset()) -> GuardedFetcher:
    """The fetcher that checks and sends callbacks: public hosts only (`allowed_hosts`: the
    operator's `WEBHOOK_ALLOWED_HOSTS`), short timeouts, answers read up to 64 KiB."""
    return GuardedFetcher(allowed_hosts=allowed_hosts, timeout_s=TRY_TIMEOUT_S,
                          deadline_s=TRY_DEADLINE_S, max_bytes=64 * 1024)


def sign(secrets_: list[str], delivery_id: str, sent_at: datetime, body: bytes) -> str:
    """The `webhook-signature` value of `body`: one `v1,<base64>` per secret, space-separated
    (the standard's form for a rotation's overlap)."""
    data = body.decode()
    return " ".join(Webhook(secret).sign(delivery_id, sent_at, data) for secret in secrets_)


def signed_headers(secrets_: list[str], delivery_id: str, sent_at: datetime,
                   body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", ID_HEADER: delivery_id,
            TIMESTAMP_HEADER: str(int(sent_at.timestamp())),
            SIGNATURE_HEADER: sign(secrets_, delivery_id, sent_at, body)}


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


def event_of(job: JobRow, delivery_id: str, now: datetime, *,
             charged: bool = False) -> dict[str, Any]:
    """The event of an ended job; `charged`: a failed job's price was settled (its work was
    done), else its hold was given back."""
    event: dict[str, Any] = {
        "id": delivery_id, "type": EVENT_TYPES[job.status], "queue_id": job.queue_id,
        "model": job.model_id, "kind": job.kind, "status": job.status,
        "created": int((as_utc(job.finished_at) or now).timestamp())}
    if job.status == JobStatus.FAILED:
        event["error"] = {"code": job.error_code, "message": job.error}
        event["credits_refunded"] = not charged
    return event


@dataclass(frozen=True, slots=True)
class SigningSecrets:
    """An account's secret, and the previous one while it still signs after a rotation."""

    secret: str
    previous: str | None = None
    previous_until: datetime | None = None

    def signing(self, now: datetime) -> list[str]:
        """The secrets that sign an event sent at `now`, the current one first."""
        until = as_utc(self.previous_until)
        if self.previous and until is not None and now < until:
            return [self.secret, self.previous]
        return [self.secret]


class WebhookSecrets:
    """Each account's signing secret, made on first use. It is kept as it must be used (the
    platform signs with it); it is never logged, and only the account's admin keys read it."""

    def __init__(self, database: Engine, *, clock: Callable[[], datetime] = utcnow,
                 grace: timedelta = ROTATION_GRACE) -> None:
        self.database, self.clock, self.grace = database, clock, grace

    async def current(self, account_id: str) -> SigningSecrets:
        def read(session: Session) -> SigningSecrets:
            session.execute(dialect_insert(session)(WebhookSecret)
                            .values(account_id=account_id, secret=_new_secret(),
                                    created_at=self.clock())
                            .on_conflict_do_nothing(index_elements=["account_id"]))
            session.commit()
            row = session.execute(select(WebhookSecret).where(
                WebhookSecret.account_id == account_id)).scalar_one()
            return SigningSecrets(row.secret, row.previous_secret, row.previous_until)
        return await run_in_session(self.database, read)

    async def get(self, account_id: str) -> str:
        return (await self.current(account_id)).secret

    async def rotate(self, account_id: str) -> SigningSecrets:
        """A new secret: events are signed with it from now on, and with the one it replaces
        as well until `grace` has passed."""
        fresh, now = _new_secret(), self.clock()

        def write(session: Session) -> SigningSecrets:
            row = session.get(WebhookSecret, account_id)
            if row is None:
                row = WebhookSecret(account_id=account_id, secret=fresh, created_at=now)
            else:
                row.previous_secret, row.previous_until = row.secret, now + self.grace
                row.secret, row.created_at = fresh, now
            session.add(row)
            session.commit()
            return SigningSecrets(row.secret, row.previous_secret, row.previous_until)
        return await run_in_session(self.database, write)


def _new_secret() -> str:
    """`whsec_` and 32 random bytes in base64, the standard's form of a secret."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _receiver(url: str) -> tuple[str, str, int | None]:
    """Whose server a callback reaches: its scheme, host and port."""
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def _failure(exc: BaseException) -> str:
    """What a failed try is recorded as: the kind of failure, never an exception's text."""
    if isinstance(exc, FetchTimedOut | TimeoutError | httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, BlockedAddress):
        return "refused: the callback URL does not resolve to a public address"
    if isinstance(exc, OSError | httpx.TransportError):
        return "the receiver could not be reached"
    return "the receiver could not be reached or did not answer in time"


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
        self._sending: set[asyncio.Task[None]] = set()
        self._per_account: Counter[str] = Counter()  # tries in flight
        self._per_receiver: Counter[tuple[str, str, int | None]] = Counter()

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

        try:
            await run_rounds(deliver, self.sweep, wake=self._wake,
                             poll_interval_s=self.poll_interval_s,
                             sweep_interval_s=SWEEP_INTERVAL_S, name="webhook delivery")
        finally:  # a try cut short here is claimed: its lease runs out and it is sent again
            for task in list(self._sending):
                task.cancel()

    async def enqueue_ended(self, limit: int = 100) -> int:
        """A delivery row for each ended job that names a callback; returns how many."""
        now = self.clock()

        def write(session: Session) -> int:
            jobs = session.execute(select(JobRow).where(
                col(JobRow.callback_url).is_not(None),
                col(JobRow.status).in_(list(EVENT_TYPES))).limit(limit)).scalars().all()
            for job in jobs:
                charged = job.status == JobStatus.FAILED and session.execute(
                    select(LedgerEntry.request_id).where(
                        col(LedgerEntry.request_id) == job.request_id)).first() is not None
                delivery = WebhookDelivery(queue_id=job.queue_id, account_id=job.account_id,
                                           url=job.callback_url or "", payload="",
                                           next_attempt_at=now, created_at=now,
                                           expires_at=now + KEPT_FOR)
                delivery.payload = orjson.dumps(
                    event_of(job, delivery.id, now, charged=charged)).decode()
                values = delivery.model_dump()
                session.execute(dialect_insert(session)(WebhookDelivery).values(**values)
                                .on_conflict_do_nothing(index_elements=["queue_id"]))
                session.execute(update(JobRow).where(col(JobRow.queue_id) == job.queue_id)
                                .values(callback_url=None)
                                .execution_options(synchronize_session=False))
            return len(jobs)
        return await self._run(write)

    async def deliver_due(self) -> int:
        """Start the tries that are due and have a place (claimed first, each sent in a task
        of its own); returns how many were started. Rows of an account or a receiver that has
        its most tries in flight wait for a later round."""
        now = self.clock()
        room = MAX_SENDING - len(self._sending)
        if room <= 0:
            return 0
        full_accounts = [a for a, n in self._per_account.items() if n >= SENDING_PER_ACCOUNT]
        per_account, per_receiver = Counter(self._per_account), Counter(self._per_receiver)

        def take(session: Session) -> list[WebhookDelivery]:
            due = session.execute(select(WebhookDelivery).where(
                col(WebhookDelivery.next_attempt_at) <= now,
                col(WebhookDelivery.account_id).not_in(full_accounts))
                .order_by(col(WebhookDelivery.next_attempt_at)).limit(BATCH)).scalars().all()
            taken: list[WebhookDelivery] = []
            for row in due:
                receiver = _receiver(row.url)
                if (len(taken) >= room or per_account[row.account_id] >= SENDING_PER_ACCOUNT
                        or per_receiver[receiver] >= SENDING_PER_RECEIVER):
                    continue
                claimed = session.execute(update(WebhookDelivery).where(
                    col(WebhookDelivery.id) == row.id,
                    col(WebhookDelivery.next_attempt_at) <= now,
                    col(WebhookDelivery.attempts) == row.attempts)
                    .values(next_attempt_at=now + TRY_LEASE)
                    .execution_options(synchronize_session=False))
                if claimed.rowcount == 1:  # type: ignore[attr-defined]
                    taken.append(row)
                    per_account[row.account_id] += 1
                    per_receiver[receiver] += 1
            return taken
        rows = await self._run(take)
        for row in rows:
            self._start(row)
        return len(rows)

    def _start(self, row: WebhookDelivery) -> None:
        account, receiver = row.account_id, _receiver(row.url)
        self._per_account[account] += 1
        self._per_receiver[receiver] += 1
        task = asyncio.create_task(self._attempt(row), name=f"webhook-{row.queue_id}")
        self._sending.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            self._sending.discard(finished)
            for counts, name in ((self._per_account, account),
                                 (self._per_receiver, receiver)):
                counts[name] -= 1
                if counts[name] <= 0:
                    del counts[name]
            self.wake()  # its place is free: rows waiting for it may go
        task.add_done_callback(done)

    async def settled(self) -> None:
        """Until the tries in flight have ended (tests, a graceful stop)."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def _attempt(self, row: WebhookDelivery) -> None:
        body = row.payload.encode()
        error: str | None = None
        try:
            signing = await self.secrets.current(row.account_id)
            sent_at = self.clock()
            answer = await self.guard.fetch(
                row.url, method="POST", content=body,
                headers=signed_headers(signing.signing(sent_at), row.id, sent_at, body))
            if answer.url != row.url:
                error = "redirected: a callback is never followed to another URL"
            elif not 200 <= answer.status < 300:
                error = f"answered {answer.status}"
        except Exception as exc:  # refused by the guard, unreachable, timed out
            logger.info("webhook of job %s not delivered: %s", row.queue_id, exc)
            error = _failure(exc)
        try:
            await self._record(row, error)
        except Exception:  # its lease runs out: the try is made again
            logger.exception("recording the webhook try of job %s failed", row.queue_id)

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
