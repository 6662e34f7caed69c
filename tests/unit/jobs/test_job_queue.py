"""The job table's state machine and leases, on SQLite and PostgreSQL, and the runner's
recovery: a runner that dies mid-job leaves the job to the next one, which makes it and
charges it once; a job that used its tries is failed and its hold released."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from serve_app.accounts.provisioning import bootstrap
from serve_app.billing.ledger import Payer, stale_holds
from serve_app.billing.service import Billing
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, JobRow, LedgerEntry, Reservation
from serve_app.jobs.job_queue import JobQueue, result_key
from serve_app.jobs.store import DirectoryStore, open_result_store
from serve_app.jobs.worker import JobWorker
from serve_app.models.catalog import load_catalog
from serve_app.models.router import ModelRouter
from serve_app.settings import PROJECT_ROOT, Settings

CATALOG = load_catalog(PROJECT_ROOT / "configs" / "models.yaml")


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def _job(account_id: str, model_id: str = "piper-narrator", **fields: Any) -> JobRow:
    fields.setdefault("request_id", f"req-{uuid.uuid4().hex}")
    return JobRow(kind="audio", model_id=model_id, account_id=account_id,
                    params={"prompt": "Hello there.", "voice": "joe", "format": "wav"},
                    cost_lines=[["queued_characters", 12, 180_000, 0.015]], **fields)


@pytest.fixture
def books(database_url: str, tmp_path: Path):
    bootstrap(Settings(data_dir=tmp_path, database_url=database_url))
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = Account(usd_balance_nanos=1_000_000_000)
        session.add(account)
        session.commit()
        account_id = account.id
    yield engine, account_id
    engine.dispose()


def test_one_claim_per_job_and_leases_decide_who_writes(books):
    engine, account_id = books
    clock = Clock()
    queue = JobQueue(engine, clock=clock, lease=timedelta(seconds=30), max_attempts=2)

    async def main() -> None:
        job = await queue.add(_job(account_id))
        assert job.status == "QUEUED" and job.attempts == 0
        claims = await asyncio.gather(*(queue.claim(f"runner-{i}", ["piper-narrator"])
                                        for i in range(4)))
        taken = [c for c in claims if c is not None]
        assert len(taken) == 1 and taken[0].status == "PROCESSING" and taken[0].attempts == 1
        owner = next(f"runner-{i}" for i, c in enumerate(claims) if c is not None)
        assert await queue.claim("late", ["piper-narrator"]) is None  # lease still good
        assert not await queue.renew(job.queue_id, "someone-else")
        assert await queue.renew(job.queue_id, owner)

        clock.now += timedelta(seconds=31)  # the owner stopped renewing: it died
        again = await queue.claim("next", ["piper-narrator"])
        assert again is not None and again.attempts == 2
        assert not await queue.complete(job.queue_id, owner, "k", "audio/wav", 10)  # lost it
        assert await queue.complete(job.queue_id, "next", "k", "audio/wav", 10)
        done = await queue.get(job.queue_id)
        assert done.status == "COMPLETED" and done.result_key == "k"
        assert not await queue.withdraw(job.queue_id, "too late")

    asyncio.run(main())


def test_worn_out_jobs_are_not_claimed_and_a_full_model_does_not_count_a_try(books):
    engine, account_id = books
    clock = Clock()
    queue = JobQueue(engine, clock=clock, lease=timedelta(seconds=10), max_attempts=2)

    async def main() -> None:
        job = await queue.add(_job(account_id))
        await queue.claim("a", ["piper-narrator"])
        assert await queue.requeue(job.queue_id, "a", count_try=False)
        assert (await queue.get(job.queue_id)).attempts == 0
        await queue.claim("a", ["piper-narrator"])
        clock.now += timedelta(seconds=11)
        await queue.claim("b", ["piper-narrator"])  # second try
        clock.now += timedelta(seconds=11)
        assert await queue.claim("c", ["piper-narrator"]) is None
        assert [j.queue_id for j in await queue.worn_out(["piper-narrator"])] == [job.queue_id]
        assert await queue.claim("d", ["other-model"]) is None

    asyncio.run(main())


def test_the_hold_sweeper_leaves_the_holds_of_open_jobs(books):
    engine, account_id = books
    now = datetime.now(UTC)
    open_job, orphan = _job(account_id), f"req-{uuid.uuid4().hex}"
    with Session(engine) as session:
        for request_id in (open_job.request_id, orphan):
            session.add(Reservation(request_id=request_id, account_id=account_id,
                                    usd_nanos=1, diem_nanos=0,
                                    created_at=now - timedelta(hours=3)))
        session.add(open_job)
        session.commit()
        assert stale_holds(session, now, timedelta(hours=1)) == [orphan]


class _InProcess:
    """A deployment class's method as the runner calls a Serve handle's (`.remote`)."""

    def __init__(self, target: Any, name: str, gate: asyncio.Event | None = None) -> None:
        self.target, self.name, self.gate = target, name, gate
        self.deployment_name = "speech"
        self.calls = 0

    async def remote(self, *args: Any) -> Any:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        return await getattr(self.target, self.name)(*args)


class _Handle:
    def __init__(self, method: _InProcess) -> None:
        self.synthesize = method


@pytest.fixture(scope="module")
def speech():
    from deployments.audio import SpeechDeployment
    from deployments.spec import model_specs

    cls = SpeechDeployment.func_or_class
    return cls(model_specs([CATALOG.by_id["piper-narrator"]], {"data_dir": "/tmp"}))


def test_a_runner_that_dies_mid_job_leaves_it_to_the_next_which_charges_once(
        books, database_url, tmp_path, speech):
    engine, account_id = books

    async def main() -> None:
        billing = Billing(database_url)
        store = DirectoryStore(tmp_path / "results")
        clock = Clock()
        clock.now = datetime.now(UTC)
        # A lease far longer than the test: no renewal runs, and the lease runs out only
        # when the clock is moved past it.
        queue = JobQueue(engine, clock=clock, lease=timedelta(minutes=10), max_attempts=2)
        stuck = _InProcess(speech, "synthesize", gate=asyncio.Event())  # never finishes
        dying = JobWorker(queue, store, billing, CATALOG,
                          ModelRouter(CATALOG, {"speech": _Handle(stuck)}))
        hold = await billing.hold(f"req-{uuid.uuid4().hex}", Payer(account_id), 180_000)
        job = await queue.add(_job(account_id, request_id=hold.request_id))
        await dying.fill()
        while stuck.calls == 0:
            await asyncio.sleep(0.01)
        dead = list(dying._running["speech"])
        for task in dead:  # the replica dies: nothing is written
            task.cancel()
        await asyncio.gather(*dead, return_exceptions=True)
        working = _InProcess(speech, "synthesize")
        next_runner = JobWorker(queue, store, billing, CATALOG,
                                ModelRouter(CATALOG, {"speech": _Handle(working)}))
        await next_runner.fill()
        assert not next_runner._running["speech"], "taken while its lease still ran"
        clock.now += timedelta(minutes=11)  # the dead runner's lease runs out
        await next_runner.fill()
        assert next_runner._running["speech"], "the job was not taken again"
        await asyncio.gather(*next_runner._running["speech"])
        done = await queue.get(job.queue_id)
        assert (done.status, done.attempts) == ("COMPLETED", 2), done
        audio = await store.get(result_key(job.queue_id))
        assert audio[:4] == b"RIFF" and len(audio) > 10_000
        billing.close()

    asyncio.run(main())
    with Session(engine) as session:
        entries = session.exec(select(LedgerEntry).where(
            col(LedgerEntry.account_id) == account_id)).all()
        assert [e.usd_nanos for e in entries] == [180_000]
        assert session.get(Account, account_id).usd_balance_nanos == 1_000_000_000 - 180_000
        assert session.exec(select(Reservation).where(
            col(Reservation.account_id) == account_id)).all() == []


def test_a_job_whose_engine_refuses_it_fails_and_is_released(books, database_url, tmp_path,
                                                             speech):
    engine, account_id = books

    async def main() -> None:
        billing = Billing(database_url)
        queue = JobQueue(engine)
        runner = JobWorker(queue, DirectoryStore(tmp_path), billing, CATALOG,
                           ModelRouter(CATALOG, {"speech": _Handle(
                               _InProcess(speech, "synthesize"))}))
        hold = await billing.hold(f"req-{uuid.uuid4().hex}", Payer(account_id), 180_000)
        bad = _job(account_id, request_id=hold.request_id)
        bad.params = {**bad.params, "voice": "nobody"}
        job = await queue.add(bad)
        await runner.fill()
        await asyncio.gather(*runner._running["speech"])
        failed = await queue.get(job.queue_id)
        assert (failed.status, failed.error_status) == ("FAILED", 400)
        assert "nobody" in failed.error
        billing.close()

    asyncio.run(main())
    with Session(engine) as session:
        assert session.get(Account, account_id).usd_balance_nanos == 1_000_000_000
        assert session.exec(select(LedgerEntry).where(
            col(LedgerEntry.account_id) == account_id)).all() == []


def test_result_store_urls(tmp_path):
    assert isinstance(open_result_store(None, tmp_path), DirectoryStore)
    assert open_result_store(str(tmp_path / "r"), tmp_path).root == tmp_path / "r"
    with pytest.raises(ValueError, match="scheme"):
        open_result_store("ftp://x/y", tmp_path)

    async def main() -> None:
        store = DirectoryStore(tmp_path)
        await store.put("jobs/a/result", b"data", "video/mp4")
        assert await store.get("jobs/a/result") == b"data"
        await store.delete("jobs/a/result")
        assert await store.get("jobs/a/result") is None
        for bad in ("../escape", "/abs", "jobs/../../x"):
            with pytest.raises(ValueError):
                await store.put(bad, b"x", "text/plain")

    asyncio.run(main())


def test_result_store_in_an_s3_bucket(monkeypatch):
    """The bucket store against an S3-compatible server on a socket (moto's)."""
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="results")
        store = open_result_store(f"s3://results/platform-a?endpoint={endpoint}", Path("."))

        async def main() -> None:
            await store.put("jobs/q1/result", b"\x00mp4 bytes", "video/mp4")
            assert await store.get("jobs/q1/result") == b"\x00mp4 bytes"
            stored = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="results")
            assert [o["Key"] for o in stored["Contents"]] == ["platform-a/jobs/q1/result"]
            await store.delete("jobs/q1/result")
            assert await store.get("jobs/q1/result") is None
            with pytest.raises(ValueError):
                await store.put("../other-prefix/x", b"x", "text/plain")

        asyncio.run(main())
        listed = boto3.client("s3", endpoint_url=endpoint).list_objects_v2(Bucket="results")
        assert listed.get("KeyCount", 0) == 0
    finally:
        server.stop()


def test_delivery_links_are_signed_per_job_and_expire():
    from serve_app.jobs.downloads import VALID_FOR_S, download_url, is_valid

    url = download_url("https://api.example.com/api/v1", "s3cret", "job-1", now=1000.0)
    assert url.startswith("https://api.example.com/api/v1/video/download/job-1?expires=")
    query = dict(part.split("=") for part in url.split("?")[1].split("&"))
    expires, signature = int(query["expires"]), query["signature"]
    assert expires == 1000 + VALID_FOR_S
    assert is_valid("s3cret", "job-1", expires, signature, now=1000.0)
    assert not is_valid("s3cret", "job-2", expires, signature, now=1000.0)  # another job
    assert not is_valid("other", "job-1", expires, signature, now=1000.0)
    assert not is_valid("s3cret", "job-1", expires + 3600, signature, now=1000.0)  # extended
    assert not is_valid("s3cret", "job-1", expires, signature, now=expires + 1.0)  # expired


def test_delivery_links_use_the_public_api_url_when_one_is_set():
    """Behind a TLS-terminating proxy the request arrives as plain HTTP on an inner host: the
    configured public base is what the client can reach."""
    from starlette.requests import Request

    from serve_app.jobs.service import delivery_url

    inner = Request({"type": "http", "method": "POST", "scheme": "http", "query_string": b"",
                     "server": ("10.0.0.7", 8000), "path": "/api/v1/video/queue",
                     "headers": [(b"host", b"10.0.0.7:8000")]})
    assert delivery_url(inner, None, "s", "job-1").startswith(
        "http://10.0.0.7:8000/api/v1/video/download/job-1?")
    assert delivery_url(inner, "https://api.example.com/api/v1/", "s", "job-1").startswith(
        "https://api.example.com/api/v1/video/download/job-1?")


def test_the_sweep_settles_completed_jobs_and_releases_stranded_ones(books, database_url,
                                                                     tmp_path):
    """A runner that died between COMPLETED and its settlement, and jobs no runner will take
    (their model left the catalog, or waited a day): the sweep of any runner finishes them."""
    engine, account_id = books

    async def main() -> tuple[str, str, str]:
        billing = Billing(database_url)
        queue = JobQueue(engine)
        runner = JobWorker(queue, DirectoryStore(tmp_path), billing, CATALOG,
                           ModelRouter(CATALOG, {}))
        views = []
        for model_id, status, age in (("piper-narrator", "COMPLETED", 0),
                                      ("model-removed-since", "QUEUED", 0),
                                      ("piper-narrator", "QUEUED", 25)):
            hold = await billing.hold(f"req-{uuid.uuid4().hex}", Payer(account_id), 180_000)
            job = _job(account_id, model_id, request_id=hold.request_id, status=status,
                       created_at=datetime.now(UTC) - timedelta(hours=age))
            views.append(await queue.add(job))
        await runner.sweep()
        await runner.sweep()  # twice: nothing changes the second time
        states = [(await queue.get(v.queue_id)).status for v in views]
        billing.close()
        return tuple(states)

    assert asyncio.run(main()) == ("COMPLETED", "FAILED", "FAILED")
    with Session(engine) as session:
        charged = session.exec(select(LedgerEntry.usd_nanos).where(
            col(LedgerEntry.account_id) == account_id)).all()
        assert charged == [180_000]
        assert session.get(Account, account_id).usd_balance_nanos == 1_000_000_000 - 180_000
        assert session.exec(select(Reservation).where(
            col(Reservation.account_id) == account_id)).all() == []
