"""The numbered events of stored responses (`sequence_number` from 0, one after another): kept
in Redis where `REDIS_URL` is set (one list per response, expiring), else in the database's
`response_events` table (deleted with their response by the sweep). Any Gateway replica reads
what any other appended.

An event is appended once: an append whose number is already kept is ignored, so a writer
that repeats itself (a retry) cannot number two events alike. A log ended by another than its
writer (`end`: the sweep failed the response of a worker taken for dead) takes no more of the
writer's appends: its terminal event stays the last. An append names its writer (the worker's
lease owner): once another has `claim`ed the log (a replica took the response over), the
former writer's appends are refused, so two workers never number events alike.

In Redis each append is also announced on the log's channel (in the same script, no round
trip more), as is a response's end (`announce_end`): every replica listens there once
(`listen`) and wakes its own readers of that response (follow.py). The table has no channel:
its readers in other processes look again now and then."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis
from sqlalchemy import Engine, delete, exists, insert, literal
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from serve_app.db.tables import ResponseEvent, StoredResponse

logger = logging.getLogger("serve_app.responses")

# How long a replica waits before listening again to a Redis channel it lost.
RELISTEN_S = 1.0

# The table's mark of an ended log: a row numbered before the first event (never read).
ENDED_MARK = -1


class EventLog(Protocol):
    async def append(self, response_id: str, sequence_number: int, data: str,
                     writer: str | None = None) -> bool:
        """Keep the event (once); False: the log was ended, or `writer` is no longer its
        writer (another claimed it), nothing is kept."""
    async def claim(self, response_id: str, writer: str) -> None:
        """From now on only `writer` appends (None writers aside)."""
    async def end(self, response_id: str, last: Callable[[int], str]) -> int:
        """End the log with the event `last(number)` after the last kept one (its number
        returned): no append is taken after it."""
    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]: ...
    async def delete(self, response_id: str) -> None: ...
    async def announce_end(self, response_id: str, origin: str) -> None:
        """Tell the other replicas' readers that the response ended (or was deleted)."""
    async def listen(self, origin: str, wake: Callable[[str, bool], None]) -> None:
        """Call `wake(response_id, ended)` for each append or end announced by a replica
        other than `origin`, until cancelled (a log with no channel returns at once)."""
    async def close(self) -> None: ...


class TableEventLog:
    """The events in the database (no Redis configured). Its writer is the response's
    lease owner (`claim` is the row's lease, taken by the store)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def append(self, response_id: str, sequence_number: int, data: str,
                     writer: str | None = None) -> bool:
        table = ResponseEvent.__table__  # type: ignore[attr-defined]
        ended = exists().where(table.c.response_id == response_id,
                               table.c.sequence_number == ENDED_MARK)
        values = select(literal(response_id), literal(sequence_number),
                        literal(data)).where(~ended)
        if writer is not None:
            values = values.where(exists().where(col(StoredResponse.id) == response_id,
                                                 col(StoredResponse.lease_owner) == writer))

        def write() -> bool:
            with Session(self.engine) as session:
                try:
                    done = session.execute(insert(table).from_select(
                        ["response_id", "sequence_number", "data"], values))
                    session.commit()
                except IntegrityError:  # already kept
                    session.rollback()
                    return True
                return done.rowcount == 1  # type: ignore[attr-defined]
        return await asyncio.to_thread(write)

    async def claim(self, response_id: str, writer: str) -> None:
        """Nothing to write: the row's lease names the writer."""

    async def end(self, response_id: str, last: Callable[[int], str]) -> int:
        def write() -> int:
            with Session(self.engine) as session:
                session.add(ResponseEvent(response_id=response_id,
                                          sequence_number=ENDED_MARK, data=""))
                try:
                    session.commit()
                except IntegrityError:  # ended before: the mark stays
                    session.rollback()
            while True:  # after the writer's append under way, if one commits meanwhile
                kept = self._last(response_id)
                with Session(self.engine) as session:
                    session.add(ResponseEvent(response_id=response_id,
                                              sequence_number=kept + 1, data=last(kept + 1)))
                    try:
                        session.commit()
                        return kept + 1
                    except IntegrityError:
                        session.rollback()
        return await asyncio.to_thread(write)

    def _last(self, response_id: str) -> int:
        with Session(self.engine) as session:
            found = session.exec(select(ResponseEvent.sequence_number)
                                 .where(col(ResponseEvent.response_id) == response_id)
                                 .order_by(col(ResponseEvent.sequence_number).desc())
                                 .limit(1)).first()
            return int(found) if found is not None else ENDED_MARK

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

    async def announce_end(self, response_id: str, origin: str) -> None:
        """No channel: the readers of other processes find the end as they look again."""

    async def listen(self, origin: str, wake: Callable[[str, bool], None]) -> None:
        """No channel to listen to."""

    async def close(self) -> None:
        """Nothing to close: the engine is the services'."""


# KEYS[1] the response's list, KEYS[2] its mark of an end, KEYS[3] its writer; ARGV: sequence
# number, event, time to live (ms), writer ('' for none), the announcement of the event and
# its channel. The list's index is the sequence number: an event is added (and announced) only
# in its place, and none once the log was ended or claimed by another writer.
APPEND = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[4] then
  return 0
end
if redis.call('LLEN', KEYS[1]) == tonumber(ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[2])
  redis.call('PUBLISH', ARGV[6], ARGV[5])
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
        self.channel = f"{prefix}:responses:announced"
        self._append = self.redis.register_script(APPEND)

    def _key(self, response_id: str) -> str:
        return f"{self.prefix}:responses:{{{response_id}}}:events"

    def _ended_key(self, response_id: str) -> str:
        return f"{self.prefix}:responses:{{{response_id}}}:ended"

    def _writer_key(self, response_id: str) -> str:
        return f"{self.prefix}:responses:{{{response_id}}}:writer"

    async def append(self, response_id: str, sequence_number: int, data: str,
                     writer: str | None = None) -> bool:
        return bool(await self._append(
            keys=[self._key(response_id), self._ended_key(response_id),
                  self._writer_key(response_id)],
            args=[sequence_number, data, self.kept_ms, writer or "",
                  _announcement(response_id, writer or "", ended=False), self.channel]))

    async def claim(self, response_id: str, writer: str) -> None:
        await self.redis.set(self._writer_key(response_id), writer, px=self.kept_ms)

    async def end(self, response_id: str, last: Callable[[int], str]) -> int:
        """The mark first: the list then grows no more but by this event."""
        key = self._key(response_id)
        await self.redis.set(self._ended_key(response_id), 1, px=self.kept_ms)
        seq = int(await self.redis.llen(key))
        await self.redis.rpush(key, last(seq))
        await self.redis.pexpire(key, self.kept_ms)
        return seq

    async def read(self, response_id: str, after: int) -> list[tuple[int, str]]:
        first = max(after + 1, 0)
        kept = await self.redis.lrange(self._key(response_id), first, -1)
        return [(first + i, str(data)) for i, data in enumerate(kept)]

    async def delete(self, response_id: str) -> None:
        await self.redis.delete(self._key(response_id), self._ended_key(response_id),
                                self._writer_key(response_id))

    async def announce_end(self, response_id: str, origin: str) -> None:
        await self.redis.publish(self.channel, _announcement(response_id, origin, ended=True))

    async def listen(self, origin: str, wake: Callable[[str, bool], None]) -> None:
        """One subscription for the replica, made again after a lost connection (its readers
        meanwhile look again now and then, as the table's do)."""
        while True:
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as channel:
                    await channel.subscribe(self.channel)
                    async for message in channel.listen():
                        heard = json.loads(message["data"])
                        if heard["from"] != origin:  # its own readers were woken at once
                            wake(heard["id"], heard["ended"])
            except Exception:
                logger.warning("listening to %s failed: listening again in %.0f s",
                               self.channel, RELISTEN_S, exc_info=True)
            await asyncio.sleep(RELISTEN_S)

    async def close(self) -> None:
        await self.redis.aclose()


def _announcement(response_id: str, origin: str, *, ended: bool) -> str:
    return json.dumps({"id": response_id, "from": origin, "ended": ended},
                      separators=(",", ":"))
