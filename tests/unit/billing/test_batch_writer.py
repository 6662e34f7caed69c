"""The money writer's answers reach every caller still waiting, whatever happened to others."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import event, text

from serve_app.billing.writer import BatchWriter
from serve_app.db.engine import make_engine
from serve_app.errors import ApiError


def test_a_caller_whose_loop_closed_does_not_cost_the_others_of_its_batch_their_answer(
        tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    writer = BatchWriter(engine)
    gate = threading.Event()

    def blocked(session):
        gate.wait()
        return "first"

    def one(session):
        return session.execute(text("select 1")).scalar()

    async def leave_early() -> None:
        writer.submit(blocked)  # keeps the writer busy while the next two queue up
        writer.submit(one)      # its caller's loop closes before the answer (a stopped replica)

    asyncio.run(leave_early())

    async def wait_for_answer() -> int:
        future = writer.submit(one)  # batched with the abandoned operation
        gate.set()
        return await asyncio.wait_for(future, 120)

    assert asyncio.run(wait_for_answer()) == 1
    writer.close()
    engine.dispose()


def _ledger_writer(tmp_path) -> tuple[BatchWriter, str]:
    """A writer as the Gateway's billing builds it on SQLite: queued batches, and operations
    that find it idle committed on the caller's thread without waiting for the lock."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url, write_transactions=True)
    with engine.begin() as conn:
        conn.execute(text("create table entries (n integer)"))
    inline = make_engine(url, write_transactions=True, lock_wait_s=0)
    return BatchWriter(engine, inline_engine=inline), url


def _entries(url: str) -> list[int]:
    with make_engine(url).connect() as conn:
        return [row[0] for row in conn.execute(text("select n from entries order by rowid"))]


def _insert(n: int):
    def op(session):
        session.execute(text("insert into entries values (:n)"), {"n": n})
        return n
    return op


def test_an_operation_that_finds_the_writer_idle_is_durable_when_it_returns(tmp_path):
    writer, url = _ledger_writer(tmp_path)

    async def main() -> tuple[int, list[int]]:
        result = await writer.run(_insert(1), quiet=True)
        return result, _entries(url)  # read through another connection, before any await

    assert asyncio.run(main()) == (1, [1])
    assert writer.inline == 1 and writer.batches == 0
    writer.close()


def test_a_refusal_on_the_callers_thread_writes_nothing(tmp_path):
    writer, url = _ledger_writer(tmp_path)

    def refused(session):
        raise ApiError(402, "Insufficient balance")

    async def main() -> None:
        await writer.run(refused, quiet=True)

    with pytest.raises(ApiError) as caught:
        asyncio.run(main())
    assert caught.value.status == 402
    assert _entries(url) == []
    writer.close()


def test_an_operation_that_finds_the_database_locked_waits_in_the_queue_and_commits(tmp_path):
    writer, url = _ledger_writer(tmp_path)
    other = make_engine(url, write_transactions=True)  # another process's writer, say
    worker_took_it = threading.Event()  # the queue's worker has a connection: it is at the lock
    event.listen(writer._engine, "checkout", lambda *args: worker_took_it.set())

    async def main() -> int:
        with other.connect() as conn:
            transaction = conn.begin()  # BEGIN IMMEDIATE: holds the write lock
            conn.execute(text("insert into entries values (0)"))
            pending = asyncio.ensure_future(writer.run(_insert(1), quiet=True))
            while not worker_took_it.is_set():  # tried on this thread, found the lock taken
                await asyncio.sleep(0.01)
            # not refused, not lost: queued behind the lock (which its worker waits for)
            assert not pending.done() and writer.inline == 0
            transaction.commit()
        return await asyncio.wait_for(pending, 120)

    assert asyncio.run(main()) == 1
    assert _entries(url) == [0, 1]
    assert writer.inline == 0 and writer.batches == 1
    writer.close()


def test_operations_keep_their_order_while_the_queue_is_busy(tmp_path):
    writer, url = _ledger_writer(tmp_path)
    gate = threading.Event()

    def slow_first(session):
        gate.wait()
        return _insert(1)(session)

    async def main() -> list[int]:
        first = writer.submit(slow_first)
        second = asyncio.ensure_future(writer.run(_insert(2), quiet=True))  # queue busy
        await asyncio.sleep(0)  # `second` decides (inline or queued) while `first` runs
        gate.set()
        return [await first, await second]

    assert asyncio.run(main()) == [1, 2]
    assert _entries(url) == [1, 2]
    assert writer.inline == 0
    writer.close()


def test_a_busy_replicas_operations_share_the_queues_commits(tmp_path):
    writer, url = _ledger_writer(tmp_path)

    async def main() -> list[int]:
        return [await writer.run(_insert(n), quiet=False) for n in range(3)]

    assert asyncio.run(main()) == [0, 1, 2]
    assert _entries(url) == [0, 1, 2]
    assert writer.inline == 0 and writer.operations == 3
    writer.close()
