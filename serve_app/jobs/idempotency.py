"""`Idempotency-Key` of the queue routes (`/video/queue`, `/audio/queue`): a client that lost
the answer to a queue call retries with the same key and learns what happened, instead of
queueing (and paying for) the job twice.

The approach of the crypto RPC proxy's keys (crypto/idempotency.py), kept in SQL so every
replica sees them, with the claim moved first: a request claims its key (one INSERT on the
primary key (account, key): of two requests at once, one wins) before anything is held or
queued. Then:

- the same key with the same route and fields within 24 hours: the first answer (status and
  body, `Idempotent-Replayed: true`), nothing queued or charged again;
- the same key with another route or other fields: 409 `IDEMPOTENCY_KEY_REUSED`;
- while the first request still runs, a twin waits for its answer (up to `wait_s`), else
  409 `IDEMPOTENCY_KEY_IN_PROGRESS`.

Only an answer that queued a job is kept; a request that failed (402, 429, 400...) queued and
charged nothing, so its claim is dropped and a retry runs afresh. Every row has its
`expires_at` (24 hours after its claim): an expired row is replaced by the next claim of its
key, and deleted by the sweep (`sweep`, in bounded batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson
from fastapi import Response
from sqlalchemy import delete, select, tuple_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import QueueIdempotency, as_utc, utcnow
from serve_app.errors import ApiError, invalid_request

T = TypeVar("T")
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,255}")
KEPT_FOR = timedelta(hours=24)
WAIT_S = 10.0  # how long a twin waits for the first request's answer
WAIT_STEP_S = 0.05
SWEEP_BATCH = 500
REPLAYED_HEADER = "Idempotent-Replayed"


@dataclass(frozen=True, slots=True)
class Replay:
    status: int
    response: bytes


RUNNING = Replay(0, b"")  # the key's first request has not answered yet


def check_key(value: str) -> str:
    if not KEY_PATTERN.fullmatch(value):
        raise invalid_request("Idempotency-Key must be 1 to 255 letters, digits, '_' or '-'",
                              "Idempotency-Key")
    return value


def request_digest(route: str, fields: dict[str, Any]) -> str:
    """What makes two requests the same: the route and the fields the client sent (in any
    order, with any spacing)."""
    return hashlib.sha256(orjson.dumps({"route": route, "body": fields},
                                       option=orjson.OPT_SORT_KEYS)).hexdigest()


def _this(account_id: str, key: str) -> tuple:
    return QueueIdempotency.account_id == account_id, QueueIdempotency.key == key


def claim(session: Session, account_id: str, key: str, digest: str,
          now: datetime) -> Replay | None:
    """Claim `key` (None), or the first answer to replay (`RUNNING` while there is none);
    409 when the key was used with another request."""
    session.execute(delete(QueueIdempotency).where(*_this(account_id, key),
                                                   QueueIdempotency.expires_at <= now))
    claimed = session.execute(
        dialect_insert(session)(QueueIdempotency)
        .values(account_id=account_id, key=key, body_sha256=digest, done=False,
                status_code=0, created_at=now, expires_at=now + KEPT_FOR)
        .on_conflict_do_nothing(index_elements=["account_id", "key"])
        .returning(QueueIdempotency.key)).first()
    if claimed is not None:
        return None
    found = session.execute(select(QueueIdempotency).where(*_this(account_id, key))
                            ).scalar_one_or_none()
    if found is None:  # deleted meanwhile (its first request failed): claim again
        return RUNNING
    if found.body_sha256 != digest:
        raise ApiError(409, "This Idempotency-Key was used with another request in the last "
                            "24 hours; use a new key for a new job",
                       code="IDEMPOTENCY_KEY_REUSED")
    if not found.done:
        return RUNNING
    return Replay(found.status_code, (found.response or "").encode())


def complete(session: Session, account_id: str, key: str, status: int,
             response: bytes) -> None:
    session.execute(update(QueueIdempotency).where(*_this(account_id, key)).values(
        done=True, status_code=status, response=response.decode("utf-8", "replace")))


def drop(session: Session, account_id: str, key: str) -> None:
    session.execute(delete(QueueIdempotency).where(*_this(account_id, key),
                                                   QueueIdempotency.done.is_(False)))


def sweep(session: Session, now: datetime, batch: int = SWEEP_BATCH) -> int:
    """Delete up to `batch` rows past their `expires_at`; returns how many. The caller
    commits."""
    c = QueueIdempotency.__table__.c  # type: ignore[attr-defined]
    oldest = select(c.account_id, c.key).where(c.expires_at <= now).limit(batch)
    gone = session.execute(delete(QueueIdempotency).where(
        tuple_(c.account_id, c.key).in_(oldest)))
    return int(gone.rowcount or 0)  # type: ignore[attr-defined]


class QueueKeys:
    """The queue routes' keys on `database` (each step in a session of its own)."""

    def __init__(self, database: Engine, *, clock: Callable[[], datetime] = utcnow,
                 wait_s: float = WAIT_S) -> None:
        self.database, self.clock, self.wait_s = database, clock, wait_s

    async def _run(self, work: Callable[[Session], T]) -> T:
        def run(session: Session) -> T:
            out = work(session)
            session.commit()
            return out
        return await run_in_session(self.database, run)

    async def once(self, account_id: str, key: str | None, digest_of: Callable[[], str],
                   work: Callable[[], Awaitable[Response]]) -> Response:
        """`work`'s answer, or the first answer given to `key` (see the module).

        `digest_of` (the request's `request_digest`) runs only when a key is sent, and in a
        worker thread: a video job's body is up to 69 MB, whose hash held the event loop
        0.1-0.2 s."""
        if key is None:
            return await work()
        check_key(key)
        digest = await asyncio.to_thread(digest_of)
        give_up = time.monotonic() + self.wait_s
        while True:
            found = await self._run(lambda s, now=self.clock(): claim(s, account_id, key,
                                                                      digest, now))
            if found is None:
                break
            if found is not RUNNING:
                return Response(found.response, status_code=found.status,
                                media_type="application/json",
                                headers={REPLAYED_HEADER: "true"})
            if time.monotonic() > give_up:
                raise ApiError(409, "A request with this Idempotency-Key is still being "
                                    "queued; retry once it has answered",
                               code="IDEMPOTENCY_KEY_IN_PROGRESS")
            await asyncio.sleep(WAIT_STEP_S)
        try:
            answer = await work()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._run(lambda s: drop(s, account_id, key)))
            raise
        if answer.status_code == 200:
            body = bytes(answer.body)
            await asyncio.shield(self._run(
                lambda s: complete(s, account_id, key, answer.status_code, body)))
        else:
            await asyncio.shield(self._run(lambda s: drop(s, account_id, key)))
        return answer

    async def sweep(self) -> int:
        now = self.clock()
        return await self._run(lambda s: sweep(s, now))

    async def expires_at(self, account_id: str, key: str) -> datetime | None:
        """When the key's row expires (None: no row)."""
        def read(session: Session) -> datetime | None:
            row = session.execute(select(QueueIdempotency.expires_at).where(
                *_this(account_id, key))).scalar_one_or_none()
            return as_utc(row)
        return await self._run(read)
