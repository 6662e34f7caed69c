"""The money writer's answers reach every caller still waiting, whatever happened to others."""

from __future__ import annotations

import asyncio
import threading

from sqlalchemy import text

from serve_app.billing.writer import BatchWriter
from serve_app.db.engine import make_engine


def test_a_caller_whose_loop_closed_does_not_cost_the_others_of_its_batch_their_answer(
        tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'w.db'}")
    writer = BatchWriter(engine)
    gate = threading.Event()

    def blocked(session):
        gate.wait(10)
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
        return await asyncio.wait_for(future, 10)

    assert asyncio.run(wait_for_answer()) == 1
    writer.close()
    engine.dispose()
