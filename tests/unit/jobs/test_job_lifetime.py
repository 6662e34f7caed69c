"""Every stored byte expires, and accounts take turns: on SQLite and PostgreSQL, a job's
inputs go when it ends (made or failed), its media once its download link's lifetime has
passed, an account's open jobs and stored bytes are counted for its caps, and the runners
claim jobs round-robin by account, so one account's thousand jobs do not starve another's."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from serve_app.accounts.provisioning import bootstrap
from serve_app.billing.ledger import Payer
from serve_app.billing.service import Billing
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, JobRow, LedgerEntry, Reservation
from serve_app.jobs.job_queue import JobQueue, JobView, input_key, result_key
from serve_app.jobs.store import DirectoryStore
from serve_app.jobs.worker import RESULT_LIFETIME_S, JobWorker
from serve_app.models.catalog import load_catalog
from serve_app.models.router import ModelRouter
from serve_app.settings import Settings
from tests.fakes import FakeVideoDeployment, crashed

CATALOG = load_catalog(Path(__file__).parents[1] / "video" / "catalog.yaml")
MODEL = "clip-maker"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def _job(account_id: str, **fields: Any) -> JobRow:
    fields.setdefault("request_id", f"req-{uuid.uuid4().hex}")
    return JobRow(kind="video", model_id=MODEL, account_id=account_id,
                    params={"prompt": "rain", "seconds": 1.0, "width": 64, "height": 64,
                            "fps": 8.0}, cost_lines=[["video_seconds", 1, 10_000_000, 0.01]],
                    **fields)


@pytest.fixture
def accounts(database_url: str, tmp_path: Path):
    """The database and two accounts with $1 each."""
    bootstrap(Settings(data_dir=tmp_path, database_url=database_url))
    engine = make_engine(database_url)
    with Session(engine) as session:
        rows = [Account(usd_balance_nanos=1_000_000_000) for _ in range(2)]
        session.add_all(rows)
        session.commit()
        ids = [row.id for row in rows]
    yield engine, ids
    engine.dispose()


async def _queued_with_input(queue: JobQueue, store: DirectoryStore, billing: Billing,
                             account_id: str) -> JobView:
    """A job as /video/queue leaves it: its price held, an input kept in the store."""
    hold = await billing.hold(f"req-{uuid.uuid4().hex}", Payer(account_id), 10_000_000)
    job = _job(account_id, request_id=hold.request_id)
    job.inputs = {"image": input_key(job.queue_id, "image")}
    job.stored_bytes = 1000
    await store.put(job.inputs["image"], b"\x89PNG" + b"\x00" * 996, "image/png")
    return await queue.add(job)


def test_a_made_job_keeps_its_media_until_its_link_expires_and_a_failed_one_nothing(
        accounts, database_url, tmp_path):
    engine, (account_id, _) = accounts
    clock = Clock()
    store = DirectoryStore(tmp_path / "results")
    video = FakeVideoDeployment("video-generation", [MODEL])

    async def main() -> None:
        billing = Billing(database_url)
        queue = JobQueue(engine, clock=clock)
        runner = JobWorker(queue, store, billing, CATALOG,
                           ModelRouter(CATALOG, {"video-generation": video}))
        made = await _queued_with_input(queue, store, billing, account_id)
        await runner.fill()
        await asyncio.gather(*runner._running["video-generation"])
        video.fail_with(crashed())
        failed = await _queued_with_input(queue, store, billing, account_id)
        await runner.fill()
        await asyncio.gather(*runner._running["video-generation"])

        done = await queue.get(made.queue_id)
        media = await store.get(result_key(made.queue_id))
        assert done.status == "COMPLETED" and media == video.made[0]
        assert await store.get(made.inputs["image"]) is None  # its input went once it was made
        assert done.stored_bytes == len(media)
        gone = await queue.get(failed.queue_id)
        assert gone.status == "FAILED" and gone.media_deleted and gone.stored_bytes == 0
        assert await store.get(failed.inputs["image"]) is None
        assert await queue.account_usage(account_id) == (0, len(media))

        clock.now += timedelta(seconds=RESULT_LIFETIME_S - 60)  # its link still works
        await runner.sweep()
        assert await store.get(result_key(made.queue_id)) == media
        clock.now += timedelta(seconds=120)  # past the link's lifetime
        await runner.sweep()
        expired = await queue.get(made.queue_id)
        assert expired.media_deleted and expired.stored_bytes == 0
        assert await store.get(result_key(made.queue_id)) is None
        assert await queue.account_usage(account_id) == (0, 0)
        billing.close()

    asyncio.run(main())
    assert sorted(p.name for p in (tmp_path / "results").rglob("*") if p.is_file()) == []
    with Session(engine) as session:  # the made one charged once, the failed one released
        charged = session.exec(select(LedgerEntry.usd_nanos).where(
            col(LedgerEntry.account_id) == account_id)).all()
        assert charged == [10_000_000]
        assert session.exec(select(Reservation)).all() == []


def test_the_sweep_deletes_what_a_runner_that_died_left_of_a_failed_job(accounts,
                                                                       database_url,
                                                                       tmp_path):
    """A runner that died between failing a job and deleting its inputs: the next sweep of
    any runner deletes them."""
    engine, (account_id, _) = accounts
    store = DirectoryStore(tmp_path / "results")

    async def main() -> None:
        billing = Billing(database_url)
        queue = JobQueue(engine)
        job = await _queued_with_input(queue, store, billing, account_id)
        with Session(engine) as session:
            row = session.get(JobRow, job.queue_id)
            row.status, row.finished_at = "FAILED", datetime.now(UTC)
            session.add(row)
            session.commit()
        assert await queue.account_usage(account_id) == (0, 1000)
        await JobWorker(queue, store, billing, CATALOG, ModelRouter(CATALOG, {})).sweep()
        assert await store.get(job.inputs["image"]) is None
        assert await queue.account_usage(account_id) == (0, 0)
        billing.close()

    asyncio.run(main())


def test_accounts_take_turns_one_accounts_thousand_jobs_do_not_starve_anothers_one(
        accounts):
    engine, (busy, other) = accounts
    clock = Clock()
    queue = JobQueue(engine, clock=clock)
    start = clock.now - timedelta(minutes=10)
    with Session(engine) as session:  # a thousand jobs queued first, then one of another
        session.add_all(_job(busy, created_at=start + timedelta(milliseconds=i))
                        for i in range(1000))
        session.add(_job(other, created_at=start + timedelta(seconds=5)))
        session.commit()

    async def main() -> list[str]:
        order = []
        for _ in range(4):
            job = await queue.claim("runner", [MODEL])
            order.append(job.account_id)
            clock.now += timedelta(seconds=1)
        return order

    order = asyncio.run(main())
    assert order[:2] in ([busy, other], [other, busy]), order  # the one waits one turn at most
    assert order.count(other) == 1 and order[2:] == [busy, busy]
    with Session(engine) as session:
        first = session.exec(select(JobRow).where(col(JobRow.account_id) == busy)
                             .order_by(col(JobRow.created_at))).first()
        assert first.status == "PROCESSING"  # within an account, the oldest first
