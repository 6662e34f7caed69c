"""The numbered events of stored responses (`sequence_number` from 0, one after another): kept
in Redis where `REDIS_URL` is set (one list per response, expiring), else in the database's
`response_events` table (deleted with their response by the sweep). Any Gateway replica reads
what any other appended.

An event is appended once: an append whose number is already kept is ignored, so a writer
that repeats itself (a retry) cannot number two events alike."""

from __future__ import annotations

import asyncio
from typing import Protocol

import redis.asyncio as aioredis
from sqlalchemy import Engine, delete
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from serve_app.db.tables import ResponseEvent


class EventLog(Protocol):
    async def append(self, response_id: str, sequence_number: int, data: str) -> None: ...
    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]: ...
    async def delete(self, response_id: str) -> None: ...
    async def close(self) -> None: ...


class TableEventLog:
    """The events in the database (no Redis configured)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def append(self, response_id: str, sequence_number: int, data: str) -> None:
        def write() -> None:
            with Session(self.engine) as session:
                session.add(ResponseEvent(response_id=response_id,
                                          sequence_number=sequence_number, data=data))
                try:
                    session.commit()
                except IntegrityError:  # already kept
                    session.rollback()
        await asyncio.to_thread(write)

    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]:
        def fetch() -> list[tuple[int, str]]:
            with Session(self.engine) as session:
                rows = session.exec(select(ResponseEvent.sequence_number, ResponseEvent.data)
                                    .where(col(ResponseEvent.response_id) == response_id,
                                           col(ResponseEvent.sequence_number) > after)
                                    .order_by(col(ResponseEvent.sequence_number))).all()
                return [(int(seq), data) for seq, data in rows]
        return await asyncio.to_thread(fetch)

    async def delete(self, response_id: str) -> None:
        def remove() -> None:
            with Session(self.engine) as session:
                session.execute(delete(ResponseEvent).where(
                    col(ResponseEvent.response_id) == response_id))
                session.commit()
        await asyncio.to_thread(remove)

    async def close(self) -> None:
        """Nothing to close: the engine is the services'."""


# KEYS[1] the response's list; ARGV: sequence number, event, time to live (ms). The list's
# index is the sequence number: an event is added only in its place.
APPEND = """
if redis.call('LLEN', KEYS[1]) == tonumber(ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""


class RedisEventLog:
    """The events in Redis: a list per response, its index the sequence number, expiring
    `kept_s` after its last append (the stored response outlives its events by no more)."""

    def __init__(self, url: str, *, prefix: str = "", kept_s: float) -> None:
        self.redis = aioredis.from_url(url, decode_responses=True)
        self.prefix = prefix
        self.kept_ms = int(kept_s * 1000)
        self._append = self.redis.register_script(APPEND)

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}:responses:{{{response_id}}}:events"

    async def append(self, response_id: str, sequence_number: int, data: str) -> None:
        await self._append(keys=[self._key(response_id)],
                           args=[sequence_number, data, self.kept_ms])

    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]:
        first = max(after + 1, 0)
        kept = await self.redis.lrange(self._key(response_id), first, -1)
        return [(first + i, str(data)) for i, data in enumerate(kept)]

    async def delete(self, response_id: str) -> None:
        await self.redis.delete(self._key(response_id))

    async def close(self) -> None:
        await self.redis.aclose()
