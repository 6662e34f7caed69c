"""The charge metrics follow the ledger: a settlement repeated by another replica (a worker that
lost its lease settling after a takeover did) counts nothing again, and a charge capped at its
hold counts what the ledger charged."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlmodel import Session

from serve_app.billing import service
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import price
from serve_app.billing.service import Billing
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account
from serve_app.models.catalog import load_catalog
from serve_app.money import NANOS_PER_UNIT, to_nanos
from serve_app.settings import PROJECT_ROOT

MODEL = load_catalog(PROJECT_ROOT / "configs" / "models.yaml").by_id["smollm2-135m-instruct"]


class Counted:
    """Stands in for the metrics: every counter increment, with its tags."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def __getattr__(self, name: str) -> Any:
        counted = self

        class Metric:
            def inc(self, value: float = 1, tags: dict | None = None) -> None:
                counted.calls.append((name, value, tags or {}))

            def observe(self, value: float, tags: dict | None = None) -> None:
                pass

        return Metric()

    def total(self, name: str, **tags: str) -> float:
        return sum(v for n, v, t in self.calls if n == name and t.items() >= tags.items())


@pytest.fixture
def counted(monkeypatch) -> Counted:
    recorder = Counted()
    monkeypatch.setattr(service, "metrics", lambda: recorder)
    return recorder


def _account(url: str, usd: str) -> str:
    with Session(make_engine(url)) as s:
        account = Account(usd_balance_nanos=to_nanos(usd))
        s.add(account)
        s.commit()
        return account.id


def test_a_settlement_repeated_after_a_takeover_is_not_counted_again(database_url, counted):
    payer = Payer(_account(database_url, "1"))
    cost = price(MODEL, {"input": 1000, "output": 500})

    async def main():
        first_replica, taker = Billing(database_url), Billing(database_url)
        try:
            hold = await first_replica.hold("taken-over", payer, to_nanos("0.01"))
            settled = await first_replica.settle(hold, cost)
            # The replica that took the request over settles it again from its record.
            again = await taker.held_since("taken-over", payer, hold.started_at).finish(cost)
            return settled, again
        finally:
            first_replica.close()
            taker.close()

    settled, _ = asyncio.run(main())
    assert settled.usd_nanos == cost.nanos
    model = MODEL.id
    assert counted.total("charged_usd", model=model) == pytest.approx(cost.nanos / NANOS_PER_UNIT)
    assert counted.total("tokens", model=model, direction="input") == 1000
    assert counted.total("tokens", model=model, direction="output") == 500
    assert len([c for c in counted.calls if c[0] == "charged_usd"]) == 1


def test_a_charge_capped_at_its_hold_counts_what_the_ledger_charged(database_url, counted):
    payer = Payer(_account(database_url, "1"))
    cost = price(MODEL, {"input": 1000, "output": 500})
    held = cost.nanos // 2

    async def main():
        billing = Billing(database_url)
        try:
            hold = await billing.hold("capped", payer, held)
            return await billing.settle(hold, cost)
        finally:
            billing.close()

    settled = asyncio.run(main())
    assert settled.usd_nanos + settled.diem_nanos == held
    assert counted.total("charged_usd", model=MODEL.id) == pytest.approx(held / NANOS_PER_UNIT)
