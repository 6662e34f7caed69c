"""A job failed while its runner kept going (worn out, or withdrawn because its client left)
leaves no media in the store: the runner's late `put` wrote it after the failure had deleted
the job's files and marked them deleted, so no sweep would have looked again (issue 25, item
4). A runner that lost its lease to another that made the job leaves that job's media alone.
On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from serve_app.accounts.provisioning import bootstrap
from serve_app.billing.ledger import Payer
from serve_app.billing.service import Billing
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, JobRow, LedgerEntry, Reservation
from serve_app.jobs.job_queue import JobQueue, JobView, input_key, result_key
from serve_app.jobs.store import DirectoryStore
from serve_app.jobs.worker import JobWorker
from serve_app.models.catalog import load_catalog
from serve_app.models.router import ModelRouter
from serve_app.settings import Settings
from tests.fakes import FakeVideoDeployment

CATALOG = load_catalog(Path(__file__).parents[1] / "video" / "catalog.yaml")
MODEL = "clip-maker"


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def account(database_url: str, tmp_path: Path):
    bootstrap(Settings(data_dir=tmp_path, database_url=database_url))
    engine = make_engine(database_url)
    with Session(engine) as session:
        row = Account(usd_balance_nanos=1_000_000_000)
        session.add(row)
        session.commit()
        account_id = row.id
    yield engine, account_id
    engine.dispose()


async def _queued(queue: JobQueue, store: DirectoryStore, billing: Billing,
                  account_id: str) -> JobView:
    hold = await billing.hold(f"req-{uuid.uuid4().hex}", Payer(account_id), 10_000_000)
    job = JobRow(kind="video", model_id=MODEL, account_id=account_id,
                   request_id=hold.request_id, stored_bytes=4,
                   params={"prompt": "rain", "seconds": 1.0, "width": 64, "height": 64,
                           "fps": 8.0}, cost_lines=[["video_seconds", 1, 10_000_000, 0.01]])
    job.inputs = {"image": input_key(job.queue_id, "image")}
    await store.put(job.inputs["image"], b"\x89PNG", "image/png")
    return await queue.add(job)


async def _called(video: FakeVideoDeployment, calls: int) -> None:
    """Until the deployment has been called `calls` times (its calls are paused)."""
    while len(video.calls) < calls:
        await asyncio.sleep(0.01)


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize("how", ["worn out", "withdrawn"])
def test_media_put_after_the_job_failed_is_deleted(account, database_url, tmp_path, how):
    engine, account_id = account
    clock = Clock()
    store = DirectoryStore(tmp_path / "results")
    video = FakeVideoDeployment("video-generation", [MODEL])

    async def main() -> JobView:
        billing = Billing(database_url)
        queue = JobQueue(engine, clock=clock, max_attempts=1)
        runner = JobWorker(queue, store, billing, CATALOG,
                           ModelRouter(CATALOG, {"video-generation": video}))
        job = await _queued(queue, store, billing, account_id)
        video.pause()
        await runner.fill()
        await _called(video, 1)
        if how == "worn out":  # its lease ran out on its last try: the sweep fails it
            clock.now += queue.lease + timedelta(seconds=1)
            await runner.sweep()
        else:  # its client left before hearing of it: what intake.py then does
            assert await queue.withdraw(job.queue_id, "The client left")
            await runner._settle(job, None)
            await store.delete(job.inputs["image"])
            await queue.mark_deleted(job.queue_id)
        assert (await queue.get(job.queue_id)).status == "FAILED"
        video.resume()  # the runner kept going: it makes the media and stores it
        await asyncio.gather(*runner._running["video-generation"])
        billing.close()
        return await queue.get(job.queue_id)

    job = asyncio.run(main())

    assert job.status == "FAILED" and job.media_deleted
    assert video.made  # the media was made and put...
    assert _files(tmp_path / "results") == []  # ...and deleted (it stayed, with no expiry)
    with Session(engine) as session:  # nothing charged, nothing held
        assert session.exec(select(LedgerEntry).where(
            col(LedgerEntry.account_id) == account_id)).all() == []
        assert session.exec(select(Reservation)).all() == []


def test_a_runner_that_lost_its_lease_leaves_the_new_runners_media(account, database_url,
                                                                   tmp_path):
    engine, account_id = account
    clock = Clock()
    store = DirectoryStore(tmp_path / "results")
    video = FakeVideoDeployment("video-generation", [MODEL])

    async def main() -> tuple[JobView, bytes | None]:
        billing = Billing(database_url)
        queue = JobQueue(engine, clock=clock, max_attempts=2)
        router = ModelRouter(CATALOG, {"video-generation": video})
        first = JobWorker(queue, store, billing, CATALOG, router)
        second = JobWorker(queue, store, billing, CATALOG, router)
        job = await _queued(queue, store, billing, account_id)
        video.pause()
        await first.fill()
        await _called(video, 1)
        clock.now += queue.lease + timedelta(seconds=1)  # the first seems dead
        await second.fill()
        await _called(video, 2)
        video.resume()
        await asyncio.gather(*first._running["video-generation"],
                             *second._running["video-generation"])
        made = await store.get(result_key(job.queue_id))
        billing.close()
        return await queue.get(job.queue_id), made

    job, made = asyncio.run(main())

    assert job.status == "COMPLETED" and not job.media_deleted
    assert made is not None and made in video.made
