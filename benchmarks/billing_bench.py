"""Billing throughput and analytics latency.

1. Settled requests per second through the ledger: `--concurrency` request loops, each
   holding, then settling (the two money transactions of a billable request), on one Billing
   service (one replica) and on two, with group commit (batches of up to 64 operations) and
   without it (batch of 1), on SQLite and on PostgreSQL.
2. Usage analytics over one million ledger lines: 90 days of a busy account (20 keys, 8
   models), filled in bulk with its daily rollups; `usage_analytics` (rollups) against the same
   answer computed by scanning the ledger.

    .venv/bin/python benchmarks/billing_bench.py [--seconds 5] [--lines 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, text  # noqa: E402
from sqlmodel import Session, select  # noqa: E402

from serve_app.billing.analytics import usage_analytics  # noqa: E402
from serve_app.billing.ledger import Payer  # noqa: E402
from serve_app.billing.pricing import price  # noqa: E402
from serve_app.billing.service import Billing  # noqa: E402
from serve_app.db.engine import make_engine, migrate  # noqa: E402
from serve_app.db.tables import Account, LedgerEntry, LedgerLine, UsageDaily  # noqa: E402
from serve_app.models.catalog import load_catalog  # noqa: E402
from serve_app.money import to_nanos  # noqa: E402

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CATALOG = load_catalog(ROOT / "configs" / "models.yaml")
MODEL = CATALOG.by_id["smollm2-135m-instruct"]


def _postgres_schema() -> str | None:
    try:
        import psycopg

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    except Exception as exc:
        print(f"PostgreSQL unavailable, skipped: {exc}")
        return None


def _drop(url: str) -> None:
    if url.startswith("postgresql"):
        import psycopg

        schema = url.rsplit("%3D", 1)[-1]
        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _account(url: str) -> str:
    with Session(make_engine(url)) as s:
        account = Account(usd_balance_nanos=to_nanos(10**6))
        s.add(account)
        s.commit()
        return account.id


async def _settle_loop(billing: Billing, payer: Payer, deadline: float,
                       latencies: list[float]) -> int:
    done = 0
    cost = price(MODEL, {"input": 300, "output": 200})
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        hold = await billing.hold(uuid.uuid4().hex, payer, to_nanos("0.001"))
        await billing.settle(hold, cost)
        latencies.append(time.perf_counter() - t)
        done += 1
    return done


def settled_per_second(url: str, replicas: int, concurrency: int, seconds: float,
                       batch: int) -> tuple[float, float, float]:
    account = _account(url)

    async def main() -> tuple[int, list[float], int]:
        services = [Billing(url) for _ in range(replicas)]
        for s in services:
            s.writer._max_batch = batch
            await s.beat()  # as in a Gateway replica: its holds name it
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds
        try:
            counts = await asyncio.gather(*[
                _settle_loop(services[i % replicas],
                             Payer(account, api_key_id=f"key-{i % 4}", limit_usd_nanos=10**15),
                             deadline, latencies)
                for i in range(concurrency)])
            batches = sum(s.writer.batches for s in services)
            return sum(counts), latencies, batches
        finally:
            for s in services:
                s.close()

    done, latencies, batches = asyncio.run(main())
    latencies.sort()
    ops_per_batch = 2 * done / max(batches, 1)
    return done / seconds, statistics.median(latencies) * 1000, ops_per_batch


def fill(url: str, lines: int) -> tuple[str, float]:
    """`lines` ledger lines over 90 days for one account, with their daily rollups."""
    account = _account(url)
    engine = make_engine(url)
    keys = [f"key-{i:02d}" for i in range(20)]
    models = [m.id for m in CATALOG.models] + [f"model-{i}" for i in range(6)]
    start = datetime.now(UTC) - timedelta(days=89)
    rng = random.Random(1)
    t0 = time.perf_counter()
    per_entry = 2
    entries = lines // per_entry
    chunk = 20_000
    with engine.begin() as conn:
        for base in range(0, entries, chunk):
            entry_rows, line_rows = [], []
            for i in range(base, min(base + chunk, entries)):
                when = start + timedelta(seconds=i * 89 * 86400 // entries)
                rid = f"r{i}"
                key, model = rng.choice(keys), rng.choice(models)
                p, c = rng.randint(50, 3000), rng.randint(10, 800)
                entry_rows.append({"request_id": rid, "account_id": account, "api_key_id": key,
                                   "model_id": model, "model_type": "text",
                                   "unit_type": "tokens", "units": {"input": p, "output": c},
                                   "usd_nanos": p * 50 + c * 100, "diem_nanos": 0,
                                   "started_at": when, "created_at": when})
                for line_type, units, nanos, unit_price in (("input", p, p * 50, 0.05),
                                                            ("output", c, c * 100, 0.1)):
                    line_rows.append({
                        "request_id": rid, "account_id": account, "api_key_id": key,
                        "model_id": model, "line_type": line_type,
                        "sku": f"{model}-llm-{line_type}-mtoken", "currency": "USD",
                        "units": units, "amount_nanos": nanos, "price_per_unit_usd": unit_price,
                        "prompt_tokens": p, "completion_tokens": c, "created_at": when})
            conn.execute(LedgerEntry.__table__.insert(), entry_rows)
            conn.execute(LedgerLine.__table__.insert(), line_rows)
        day = func.date(LedgerLine.created_at)
        rollup = select(LedgerLine.account_id, day, LedgerLine.api_key_id, LedgerLine.model_id,
                        text("'text'"), LedgerLine.line_type, func.sum(LedgerLine.amount_nanos),
                        text("0"), func.sum(LedgerLine.units), func.count()).group_by(
            LedgerLine.account_id, day, LedgerLine.api_key_id, LedgerLine.model_id,
            LedgerLine.line_type).where(LedgerLine.account_id == account)
        conn.execute(UsageDaily.__table__.insert().from_select(
            ["account_id", "day", "api_key_id", "model_id", "model_type", "line_type",
             "usd_nanos", "diem_nanos", "units", "requests"], rollup))
    if url.startswith("postgresql"):
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
    return account, time.perf_counter() - t0


def analytics_latency(url: str, account: str, runs: int = 5) -> tuple[float, float]:
    engine = make_engine(url)
    today = date.today()
    first = today - timedelta(days=89)
    rollup_times, scan_times = [], []
    for _ in range(runs):
        with Session(engine) as s:
            t = time.perf_counter()
            usage_analytics(s, CATALOG, account, first, today, "90d")
            rollup_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            day = func.date(LedgerLine.created_at)
            s.exec(select(day, LedgerLine.api_key_id, LedgerLine.model_id, LedgerLine.line_type,
                          func.sum(LedgerLine.amount_nanos), func.sum(LedgerLine.units))
                   .where(LedgerLine.account_id == account)
                   .group_by(day, LedgerLine.api_key_id, LedgerLine.model_id,
                             LedgerLine.line_type)).all()
            scan_times.append(time.perf_counter() - t)
    return statistics.median(rollup_times) * 1000, statistics.median(scan_times) * 1000


def settle_part(databases: dict[str, str], seconds: float) -> None:
    print("1. settled requests/s (hold + settle), 32 concurrent request loops")
    print(f"{'database':11} {'replicas':>8} {'batch':>5} {'req/s':>8} {'p50 ms':>8} "
          f"{'ops/commit':>10}")
    for name, url in databases.items():
        for replicas in (1, 2):
            for batch in (1, 64):
                rate, p50, per_commit = settled_per_second(url, replicas, 32, seconds, batch)
                print(f"{name:11} {replicas:>8} {batch:>5} {rate:>8.0f} {p50:>8.1f} "
                      f"{per_commit:>10.1f}", flush=True)
    print("\n   one request at a time (the latency billing adds to a request):")
    for name, url in databases.items():
        rate, p50, _ = settled_per_second(url, 1, 1, seconds, 64)
        print(f"{name:11} hold + settle p50 {p50:.1f} ms ({rate:.0f} req/s)", flush=True)


def analytics_part(databases: dict[str, str], lines: int) -> None:
    print(f"\n2. usage analytics, 90 days, {lines:,} ledger lines")
    for name, url in databases.items():
        account, fill_s = fill(url, lines)
        rollup_ms, scan_ms = analytics_latency(url, account)
        print(f"{name:11} filled in {fill_s:.0f} s; analytics from rollups "
              f"{rollup_ms:.1f} ms, ledger scan {scan_ms:.0f} ms "
              f"(scan / rollups = {scan_ms / rollup_ms:.0f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--part", choices=["all", "settle", "analytics"], default="all")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="billing-bench-"))
    databases = {"sqlite": f"sqlite:///{tmp / 'bench.db'}"}
    pg = _postgres_schema()
    if pg:
        databases["postgresql"] = pg
    try:
        for url in databases.values():
            migrate(url)
        if args.part in ("all", "settle"):
            settle_part(databases, args.seconds)
        if args.part in ("all", "analytics"):
            analytics_part(databases, args.lines)
    finally:
        for url in databases.values():
            _drop(url)


if __name__ == "__main__":
    main()
