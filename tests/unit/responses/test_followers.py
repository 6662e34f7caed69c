"""Followers of a background response (serve_app/responses/follow.py) on each event log: a
reader waiting for events is woken by its writer (its own replica's worker, or with Redis the
announcement of another replica's) and receives each event written after it began to wait;
it ends when the response ends, whether by a last event, a cancel that writes none, or a
deletion. Without Redis a reader in another process finds new events and the end by looking
again.

Where a wake-up is what is tested, the readers' fallback look is set to an hour: the event can
then only come by the wake-up (`WAIT_S` bounds a broken build only)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from serve_app.db.engine import make_engine, migrate
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses import follow
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog
from serve_app.responses.follow import Followers
from serve_app.responses.progress import compact
from serve_app.responses.store import ResponseStore
from tests.unit.responses.test_event_logs import REDIS_URL, _redis_unavailable

WAIT_S = 15
LEASE = timedelta(minutes=5)
WRITER = "replica-a"  # the worker's replica (its lease owner)


@dataclass
class Setup:
    engine: Engine
    open_log: Callable[[], EventLog]


def _engine(tmp_path: Path) -> Engine:
    url = f"sqlite:///{tmp_path / 'test.db'}"
    migrate(url)
    return make_engine(url)


@pytest.fixture
def table_setup(tmp_path) -> Setup:
    """The events in the database (no Redis)."""
    engine = _engine(tmp_path)
    return Setup(engine, lambda: TableEventLog(engine))


@pytest.fixture
def redis_setup(tmp_path) -> Setup:
    reason = _redis_unavailable()
    if reason:
        pytest.skip(reason)
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    return Setup(_engine(tmp_path),
                 lambda: RedisEventLog(REDIS_URL, prefix=prefix, kept_s=60))


@pytest.fixture(params=["table_setup", "redis_setup"])
def setup(request) -> Setup:
    """Each event log."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def woken_only(monkeypatch) -> None:
    """Readers never look by themselves: only a wake-up brings them anything."""
    monkeypatch.setattr(follow, "FALLBACK_S", 3600.0)


class Replica:
    """A replica's readers (`Followers`) on its own clients of the shared database and log."""

    def __init__(self, setup: Setup, origin: str) -> None:
        self.log = setup.open_log()
        self.store = ResponseStore(setup.engine, lease=LEASE)
        self.followers = Followers(self.store, self.log, followers_per_account=4,
                                   origin=origin)

    async def close(self) -> None:
        await self.log.close()


def _add_row(engine: Engine) -> str:
    response_id = f"resp_{uuid.uuid4().hex}"
    now = utcnow()
    with Session(engine) as session:
        session.add(StoredResponse(
            id=response_id, account_id="acct", request_id=response_id, status="in_progress",
            response=compact({"id": response_id, "object": "response"}), lease_owner=WRITER,
            lease_expires_at=now + LEASE, expires_at=now + timedelta(hours=1)))
        session.commit()
    return response_id


def _event(seq: int, kind: str = "response.output_text.delta") -> str:
    return compact({"type": kind, "sequence_number": seq, "delta": f"w{seq} "})


async def _write(writer: Replica, response_id: str, seq: int,
                 kind: str = "response.output_text.delta") -> None:
    """What a worker does per event: append it, then wake its replica's readers."""
    assert await writer.log.append(response_id, seq, _event(seq, kind), WRITER)
    writer.followers.notify(response_id)


async def _complete(writer: Replica, response_id: str) -> None:
    """The worker's end: the last event, the row written ended, its readers told."""
    await _write(writer, response_id, 2, "response.completed")
    assert await writer.store.write(response_id, WRITER, status="completed", ended=True)
    await writer.followers.end(response_id)


async def _cancel(writer: Replica, response_id: str) -> None:
    """A cancel: the row written cancelled, with no last event."""
    assert await writer.store.write(response_id, WRITER, status="cancelled", ended=True)
    await writer.followers.end(response_id)


async def _delete(writer: Replica, response_id: str) -> None:
    await writer.log.delete(response_id)
    await writer.store.delete(response_id)
    await writer.followers.end(response_id)


def _seq(event: str) -> int:
    return int(event.split("\n", 1)[0].removeprefix("id: "))


async def _rest(stream: AsyncIterator[str]) -> list[int]:
    return [_seq(event) async for event in stream]


async def _waiting(step: asyncio.Future) -> None:
    """Let the reader's next step run to where it waits: having read all there is, it waits
    for a wake-up with no other await between (a step is scheduled, never timed)."""
    for _ in range(3):
        await asyncio.sleep(0)
    assert not step.done()


async def _follow_while_written(reader: Replica, writer: Replica, response_id: str,
                                end: Callable[[Replica, str], Awaitable[None]]) -> list[int]:
    """Event 0 is kept before the reader starts; event 1 is written once it has read all
    there is, then the response ends by `end`: the numbers the reader received."""
    await writer.log.claim(response_id, WRITER)
    await _write(writer, response_id, 0, "response.created")
    stream = reader.followers.follow("acct", response_id, -1, resumed=False)
    received = [_seq(await anext(stream))]
    waiting = asyncio.ensure_future(anext(stream))
    await _waiting(waiting)
    await _write(writer, response_id, 1)
    received.append(_seq(await waiting))
    rest = asyncio.ensure_future(_rest(stream))
    await _waiting(rest)
    await end(writer, response_id)
    return received + await rest


def _run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(WAIT_S):
            await scenario()
    asyncio.run(bounded())


@pytest.mark.parametrize("end, numbers", [(_complete, [0, 1, 2]), (_cancel, [0, 1]),
                                          (_delete, [0, 1])])
def test_a_follower_is_woken_by_its_writer_and_ends_with_the_response(
        setup, woken_only, end, numbers):
    async def scenario() -> None:
        replica = Replica(setup, WRITER)  # the worker's own: woken at once
        try:
            response_id = _add_row(setup.engine)
            assert await _follow_while_written(replica, replica, response_id, end) == numbers
        finally:
            await replica.close()
    _run(scenario)


async def _subscribed(reader: Replica) -> None:
    """Wait for the replica's one subscription to the log's channel."""
    log = reader.log
    assert isinstance(log, RedisEventLog)
    while (await log.redis.pubsub_numsub(log.channel))[0][1] < 1:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("end, numbers", [(_complete, [0, 1, 2]), (_cancel, [0, 1])])
def test_with_redis_a_follower_on_another_replica_is_woken_by_the_writers_announcements(
        redis_setup, woken_only, end, numbers):
    setup = redis_setup

    async def scenario() -> None:
        writer, reader = Replica(setup, WRITER), Replica(setup, "replica-b")
        listening = asyncio.create_task(reader.followers.listen())
        try:
            await _subscribed(reader)
            response_id = _add_row(setup.engine)
            assert await _follow_while_written(reader, writer, response_id, end) == numbers
        finally:
            listening.cancel()
            await writer.close()
            await reader.close()
    _run(scenario)


def test_without_redis_a_follower_in_another_process_finds_new_events_and_the_end(
        table_setup):
    """Nothing wakes it: it looks again now and then, and sees the last event and the end."""
    setup = table_setup

    async def scenario() -> None:
        writer, reader = Replica(setup, WRITER), Replica(setup, "replica-b")
        listening = asyncio.create_task(reader.followers.listen())  # nothing to hear
        try:
            response_id = _add_row(setup.engine)
            assert await _follow_while_written(reader, writer, response_id,
                                               _complete) == [0, 1, 2]
        finally:
            listening.cancel()
            await writer.close()
            await reader.close()
    _run(scenario)


def test_with_redis_a_cancel_through_another_replica_returns_once_the_end_is_announced(
        redis_setup, woken_only):
    """`ended` (a cancel of a response another replica drives) is woken by the end, not by
    the events that still come."""
    setup = redis_setup

    async def scenario() -> None:
        writer, reader = Replica(setup, WRITER), Replica(setup, "replica-b")
        listening = asyncio.create_task(reader.followers.listen())
        try:
            await _subscribed(reader)
            response_id = _add_row(setup.engine)
            await writer.log.claim(response_id, WRITER)
            waiting = asyncio.create_task(reader.followers.ended(response_id, WAIT_S * 2))
            await _write(writer, response_id, 0, "response.created")
            await _cancel(writer, response_id)
            await waiting
            view = await reader.store.get(response_id)
            assert view is not None and view.status == "cancelled"
        finally:
            listening.cancel()
            await writer.close()
            await reader.close()
    _run(scenario)


def test_a_resumed_follower_receives_the_events_after_its_number_once(setup, woken_only):
    async def scenario() -> None:
        replica = Replica(setup, WRITER)
        try:
            response_id = _add_row(setup.engine)
            await replica.log.claim(response_id, WRITER)
            await _write(replica, response_id, 0, "response.created")
            await _write(replica, response_id, 1)
            stream = replica.followers.follow("acct", response_id, 0)
            rest = asyncio.ensure_future(_rest(stream))
            await _complete(replica, response_id)
            assert await rest == [1, 2]
            events = [json.loads(data)["type"] for _, data in
                      await replica.log.read(response_id, -1)]
            assert events[-1] == "response.completed"
        finally:
            await replica.close()
    _run(scenario)
