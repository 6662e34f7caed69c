"""`Idempotency-Key` of the crypto RPC proxy, as published: a retry within 24 hours with the
same key and body on the same network is answered from the first answer
(`Idempotent-Replayed: true`), neither forwarded nor charged again; the same key with another
body is a 400; a retry while the first request is still running is a 429 (the per-caller
collision the reference names).

Keys are per account and network, kept in SQL so every replica and node sees them. A request
first looks its key up (a read: a finished entry is replayed, a running one is a 429, another
body a 400), and claims it only once it is admitted (counted by the caps and held: a caller
refused with 429 or 402 writes nothing), before it forwards; if it fails, the claim is dropped
and a retry runs afresh. These writes run in sessions of their own, off the money writer. An
answer over `max_stored_bytes` is answered but not kept (its claim is dropped: a retry is
forwarded again). Every entry is deleted 24 hours after it was made: on the next claim
of its key, and by each replica's sweep (`sweep`, every few minutes, in bounded batches).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy import delete, select, tuple_, update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.db.engine import dialect_insert, run_in_session
from serve_app.db.tables import RpcIdempotency
from serve_app.errors import ApiError, invalid_request

T = TypeVar("T")
KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,255}")
KEPT_FOR = timedelta(hours=24)
SWEEP_BATCH = 500  # rows one sweep statement deletes at most


@dataclass(frozen=True, slots=True)
class Replay:
    response: bytes
    credits: int
    cost_usd: str


def check_key(value: str) -> str:
    if not KEY_PATTERN.fullmatch(value):
        raise invalid_request("Idempotency-Key must be 1 to 255 letters, digits, '_' or '-'",
                              "Idempotency-Key")
    return value


def body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _this(account_id: str, network: str, key: str) -> tuple:
    return (RpcIdempotency.account_id == account_id, RpcIdempotency.network == network,
            RpcIdempotency.key == key)


def claim(session: Session, account_id: str, network: str, key: str, digest: str,
          now: datetime) -> Replay | None:
    """Claim `key` on `network` for this request (None), or the answer to replay; 400 or 429
    otherwise."""
    session.execute(delete(RpcIdempotency).where(
        *_this(account_id, network, key), RpcIdempotency.created_at < now - KEPT_FOR))
    claimed = session.execute(
        dialect_insert(session)(RpcIdempotency)
        .values(account_id=account_id, network=network, key=key, body_sha256=digest,
                done=False, credits=0, cost_usd="", created_at=now)
        .on_conflict_do_nothing(index_elements=["account_id", "network", "key"])
        .returning(RpcIdempotency.key)).first()
    if claimed is not None:
        return None
    found = session.execute(select(RpcIdempotency).where(
        *_this(account_id, network, key))).scalar_one()
    return _existing(found, digest)


def look(session: Session, account_id: str, network: str, key: str, digest: str,
         now: datetime) -> Replay | None:
    """Without writing: the answer to replay, 400 or 429 as `claim` would; None when the key
    is free (or its entry is past its 24 hours)."""
    found = session.execute(select(RpcIdempotency).where(
        *_this(account_id, network, key), RpcIdempotency.created_at >= now - KEPT_FOR)
    ).scalar_one_or_none()
    return None if found is None else _existing(found, digest)


def _existing(found: RpcIdempotency, digest: str) -> Replay:
    """An entry of the key: its answer to replay, or 400 (another body) or 429 (running)."""
    if found.body_sha256 != digest:
        raise invalid_request("This Idempotency-Key was used with a different body in the "
                              "last 24 hours", "Idempotency-Key")
    if not found.done:
        message = ("A request with this Idempotency-Key is still running; retry when it has "
                   "answered")
        raise ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                       extra={"customMessage": message})
    return Replay((found.response or "").encode(), found.credits, found.cost_usd)


def complete(session: Session, account_id: str, network: str, key: str, response: bytes,
             credits: int, cost_usd: str) -> None:
    session.execute(update(RpcIdempotency).where(*_this(account_id, network, key)).values(
        done=True, response=response.decode("utf-8", "replace"), credits=credits,
        cost_usd=cost_usd))


def drop(session: Session, account_id: str, network: str, key: str) -> None:
    session.execute(delete(RpcIdempotency).where(
        *_this(account_id, network, key), RpcIdempotency.done.is_(False)))


def sweep(session: Session, now: datetime, batch: int = SWEEP_BATCH) -> int:
    """Delete up to `batch` entries older than 24 hours (finished or not: a claim that old
    belongs to a request that died); returns how many. The caller commits."""
    c = RpcIdempotency.__table__.c
    oldest = (select(c.account_id, c.network, c.key)
              .where(c.created_at < now - KEPT_FOR).limit(batch))
    gone = session.execute(delete(RpcIdempotency).where(
        tuple_(c.account_id, c.network, c.key).in_(oldest)))
    return int(gone.rowcount or 0)


class IdempotentCall:
    """One request's Idempotency-Key on one network: looked up, claimed, completed or dropped,
    each in a session of its own on `database` (never the money writer's)."""

    def __init__(self, database: Engine, account_id: str, network: str, key: str,
                 body: bytes, clock: Callable[[], datetime]) -> None:
        self.database, self.account_id, self.network = database, account_id, network
        self.key, self.digest, self.clock = check_key(key), body_digest(body), clock
        self.claimed = False

    async def _run(self, work: Callable[[Session], T]) -> T:
        def run(session: Session) -> T:
            out = work(session)
            session.commit()
            return out
        return await run_in_session(self.database, run)

    async def look(self) -> Replay | None:
        now = self.clock()
        return await run_in_session(self.database, lambda s: look(
            s, self.account_id, self.network, self.key, self.digest, now))

    async def claim(self) -> Replay | None:
        """Claim the key (None), or the answer of a twin that finished meanwhile."""
        now = self.clock()
        replay = await self._run(lambda s: claim(s, self.account_id, self.network, self.key,
                                                 self.digest, now))
        self.claimed = replay is None
        return replay

    async def complete(self, response: bytes, credits: int, cost_usd: str) -> None:
        await self._run(lambda s: complete(s, self.account_id, self.network, self.key,
                                           response, credits, cost_usd))

    async def drop(self) -> None:
        if self.claimed:
            await self._run(lambda s: drop(s, self.account_id, self.network, self.key))
            self.claimed = False
