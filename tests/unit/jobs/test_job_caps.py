"""Across replicas, a job's row is written only if its account's caps on open jobs and stored
bytes still hold when it is written, on SQLite and PostgreSQL (two engines standing for two
replicas): racing for the last places cannot overshoot (issue 25, item 3). One replica's own
race is tests/unit/video/test_job_caps_race.py."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, col, select

from serve_app.accounts.provisioning import bootstrap
from serve_app.db.engine import make_engine
from serve_app.db.tables import OPEN_STATUSES, Account, JobRow
from serve_app.jobs.job_queue import JobQueue
from serve_app.settings import Settings

CAP = 20


def _job(account_id: str, stored_bytes: int = 0) -> JobRow:
    return JobRow(kind="audio", model_id="piper-narrator", account_id=account_id,
                    request_id=f"req-{uuid.uuid4().hex}", stored_bytes=stored_bytes,
                    params={"prompt": "Hello."}, inputs={"a": "jobs/x/input-a"},
                    cost_lines=[["queued_characters", 6, 90_000, 0.015]])


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


def _open_jobs(engine, account_id: str) -> int:
    with Session(engine) as session:
        return session.exec(select(func.count()).select_from(JobRow).where(
            col(JobRow.account_id) == account_id,
            col(JobRow.status).in_(OPEN_STATUSES))).one()


def test_two_replicas_racing_for_the_last_places_never_pass_the_open_jobs_cap(
        account, database_url):
    engine, account_id = account
    replicas = [JobQueue(engine), JobQueue(make_engine(database_url))]

    async def main() -> list:
        return await asyncio.gather(*(replicas[i % 2].add_within(_job(account_id), CAP, 10**9)
                                      for i in range(2 * CAP)))

    written = asyncio.run(main())

    assert sum(view is not None for view in written) == CAP
    assert _open_jobs(engine, account_id) == CAP
    view = next(v for v in written if v is not None)
    assert view.inputs == {"a": "jobs/x/input-a"} and view.status == "QUEUED"
    replicas[1].engine.dispose()


def test_a_row_is_not_written_past_the_stored_bytes_cap(account):
    engine, account_id = account
    queue = JobQueue(engine)

    async def main() -> tuple:
        first = await queue.add_within(_job(account_id, 600), CAP, 1000)
        second = await queue.add_within(_job(account_id, 600), CAP, 1000)
        third = await queue.add_within(_job(account_id, 400), CAP, 1000)
        return first, second, third

    first, second, third = asyncio.run(main())

    assert first is not None and second is None and third is not None
