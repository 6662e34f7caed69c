"""The floor under `embeddings_c1_added_ms`: what any request to a model deployment pays on this
machine before auth, limits or the engine's own work, whichever way the platform is built —
one Serve handle call to a separate deployment, and a charge written durably before the answer.

- The Serve hop: p50 of an HTTP route that awaits a handle call to a no-op deployment, minus
  p50 of the same ingress's route that answers itself (both at concurrency 1, wrk).
- The durable charge: p50 of `Billing.settle` (after its hold), one request at a time, on a
  fresh SQLite ledger (the benchmark platform's database), in this process.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from clients import wrk


def serve_hop_ms(noop_url: str, seconds: int) -> float:
    """p50 of `/noop/hop` (a handle call to a no-op deployment) minus p50 of `/noop/ping`."""
    hop_url = noop_url.rsplit("/", 1)[0] + "/hop"
    wrk(hop_url, 1, 2)  # warm-up
    return wrk(hop_url, 1, seconds)["p50_ms"] - wrk(noop_url, 1, seconds)["p50_ms"]


def durable_charge_ms(catalog_path: Path, model_id: str, count: int = 200) -> float:
    """p50 of one settle (the charge written and committed before the answer)."""
    from sqlmodel import Session

    from serve_app.billing.ledger import Payer
    from serve_app.billing.pricing import price
    from serve_app.billing.service import Billing
    from serve_app.db.engine import make_engine, migrate
    from serve_app.db.tables import Account
    from serve_app.models.catalog import load_catalog
    from serve_app.money import to_nanos

    url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='bench-floor-')) / 'ledger.db'}"
    migrate(url)
    model = load_catalog(catalog_path).by_id[model_id]
    billing = Billing(url)
    with Session(make_engine(url)) as session:
        account = Account(usd_balance_nanos=to_nanos(10**6))
        session.add(account)
        session.commit()
        payer = Payer(account.id)
    cost = price(model, {"input": 12})

    async def run() -> list[float]:
        await billing.beat()  # as in a Gateway replica: its holds name it
        times = []
        for _ in range(count + 20):
            hold = await billing.hold(uuid.uuid4().hex, payer, to_nanos("0.001"))
            started = time.perf_counter()
            await billing.settle(hold, cost)
            times.append((time.perf_counter() - started) * 1000)
        return times[20:]

    try:
        return statistics.median(asyncio.run(run()))
    finally:
        billing.close()
