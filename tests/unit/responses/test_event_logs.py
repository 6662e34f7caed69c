"""The event logs of background responses, on each store they may live in (the database of
each kind, Redis): events read back in order after any number, an event appended twice kept
once, deleted with their response, and Redis's expiring."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
import redis
from sqlmodel import Session

from serve_app.db.engine import make_engine, migrate
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_unavailable() -> str | None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return None
    except Exception as exc:  # any failure means: skip with the reason
        return f"Redis not reachable at {REDIS_URL}: {exc}"


@pytest.fixture(params=["table", "redis"])
def open_log(request, tmp_path) -> Callable[[], EventLog]:
    """Opens the log in the test's own event loop (a Redis client is bound to its loop)."""
    if request.param == "redis":
        reason = _redis_unavailable()
        if reason:
            pytest.skip(reason)
        prefix = f"test-{uuid.uuid4().hex[:8]}"
        return lambda: RedisEventLog(REDIS_URL, prefix=prefix, kept_s=60)
    url = f"sqlite:///{tmp_path / 'test.db'}"
    migrate(url)
    engine = make_engine(url)
    return lambda: TableEventLog(engine)


def _run(open_log: Callable[[], EventLog],
         scenario: Callable[[EventLog], Awaitable[None]]) -> None:
    async def main() -> None:
        log = open_log()
        try:
            await scenario(log)
        finally:
            await log.close()
    asyncio.run(main())


def test_events_are_read_in_order_after_any_number(open_log):
    _run(open_log, _events_are_read_in_order_after_any_number)


async def _events_are_read_in_order_after_any_number(log: EventLog) -> None:
    for seq in range(5):
        await log.append("resp_a", seq, f'{{"n":{seq}}}')
    await log.append("resp_b", 0, '{"other":0}')

    assert [seq for seq, _ in await log.read("resp_a", -1)] == [0, 1, 2, 3, 4]
    assert await log.read("resp_a", 2) == [(3, '{"n":3}'), (4, '{"n":4}')]
    assert await log.read("resp_a", 4) == []
    assert await log.read("resp_b", -1) == [(0, '{"other":0}')]


def test_an_event_appended_twice_is_kept_once(open_log):
    _run(open_log, _an_event_appended_twice_is_kept_once)


async def _an_event_appended_twice_is_kept_once(log: EventLog) -> None:
    await log.append("resp_a", 0, "first")
    await log.append("resp_a", 0, "again")
    await log.append("resp_a", 1, "second")

    assert await log.read("resp_a", -1) == [(0, "first"), (1, "second")]


def test_events_are_deleted_with_their_response(open_log):
    _run(open_log, _events_are_deleted_with_their_response)


async def _events_are_deleted_with_their_response(log: EventLog) -> None:
    await log.append("resp_a", 0, "kept")
    await log.delete("resp_a")

    assert await log.read("resp_a", -1) == []


def test_an_ended_log_takes_no_more_appends(open_log):
    _run(open_log, _an_ended_log_takes_no_more_appends)


async def _an_ended_log_takes_no_more_appends(log: EventLog) -> None:
    assert await log.append("resp_a", 0, "first")
    assert await log.append("resp_a", 0, "again")  # kept before: not a refusal

    assert await log.end("resp_a", lambda seq: f"end {seq}") == 1
    assert not await log.append("resp_a", 2, "late")  # its writer, after the end
    assert not await log.append("resp_a", 1, "late")

    assert await log.read("resp_a", -1) == [(0, "first"), (1, "end 1")]
    assert await log.append("resp_b", 0, "another's")  # other logs go on


def test_redis_keeps_events_for_a_bounded_time():
    reason = _redis_unavailable()
    if reason:
        pytest.skip(reason)

    async def main() -> None:
        log = RedisEventLog(REDIS_URL, prefix=f"test-{uuid.uuid4().hex[:8]}", kept_s=30)
        try:
            await log.append("resp_a", 0, "kept")
            ttl_ms = await log.redis.pttl(log._key("resp_a"))
            assert 0 < ttl_ms <= 30_000
        finally:
            await log.delete("resp_a")
            await log.close()
    asyncio.run(main())


async def _a_claimed_log_refuses_its_former_writer(log: EventLog,
                                                   claim: Callable[[str], Awaitable[None]]
                                                   ) -> None:
    await claim("worker-a")
    assert await log.append("resp_a", 0, "a's", "worker-a")
    await claim("worker-b")  # another replica took the response over
    assert not await log.append("resp_a", 1, "a's late", "worker-a")
    assert await log.append("resp_a", 1, "b's", "worker-b")

    assert await log.read("resp_a", -1) == [(0, "a's"), (1, "b's")]


def test_a_claimed_table_log_refuses_its_former_writer(tmp_path):
    """The table's writer is the response's lease owner, which the store's claim changes."""
    url = f"sqlite:///{tmp_path / 'test.db'}"
    migrate(url)
    engine = make_engine(url)

    async def claim(writer: str) -> None:
        def write() -> None:
            with Session(engine) as session:
                row = session.get(StoredResponse, "resp_a") or StoredResponse(
                    id="resp_a", account_id="acct", request_id="req", status="in_progress",
                    response="{}", expires_at=utcnow() + timedelta(hours=1))
                row.lease_owner = writer
                session.add(row)
                session.commit()
        await asyncio.to_thread(write)

    async def main() -> None:
        await _a_claimed_log_refuses_its_former_writer(TableEventLog(engine), claim)
    asyncio.run(main())


def test_a_claimed_redis_log_refuses_its_former_writer():
    reason = _redis_unavailable()
    if reason:
        pytest.skip(reason)

    async def main() -> None:
        log = RedisEventLog(REDIS_URL, prefix=f"test-{uuid.uuid4().hex[:8]}", kept_s=30)
        try:
            await _a_claimed_log_refuses_its_former_writer(
                log, lambda writer: log.claim("resp_a", writer))
        finally:
            await log.delete("resp_a")
            await log.close()
    asyncio.run(main())
