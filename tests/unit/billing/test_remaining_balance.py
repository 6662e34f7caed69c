"""The balance a wallet's answer shows (`X-Balance-Remaining`) is the one its request left,
however long the request ran: the replica's cache of balances keeps an entry for two seconds,
and a request charged exactly what it held gives nothing back; its settlement still reads the
balance it leaves, other requests' charges included."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from sqlmodel import Session

from serve_app.billing.ledger import Balances, Payer
from serve_app.billing.pricing import Cost, PricedLine
from serve_app.billing.service import BALANCE_CACHE_TTL_S, Billing, Hold
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT

CATALOG = load_catalog(PROJECT_ROOT / "configs" / "models.yaml")
USD = 1_000_000_000
PRICE = 20_000_000  # 0.02 USD


class Timer:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _account(database_url: str) -> str:
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = Account(usd_balance_nanos=5 * USD)
        session.add(account)
        session.commit()
        account_id = account.id
    engine.dispose()
    return account_id


def _cost() -> Cost:
    model = CATALOG.of_type("upscale")[0]
    return Cost(model, (PricedLine("image", 1, PRICE, PRICE / USD),))


Requests = Callable[[Billing, Callable[[], Awaitable[Hold]], Timer], Awaitable[None]]


def _balance_known_after(database_url: str, requests: Requests) -> Balances | None:
    """The balance a replica's Billing knows for a 5 USD account once `requests` ran (given
    the service, a way to hold the price for a new request, and the cache's timer)."""
    account_id = _account(database_url)
    timer = Timer()

    async def main() -> Balances | None:
        billing = Billing(database_url, balance_timer=timer)
        try:
            await requests(billing, lambda: billing.hold(f"req-{uuid.uuid4().hex}",
                                                         Payer(account_id), PRICE), timer)
            return billing.known_balance(account_id)
        finally:
            billing.close()

    return asyncio.run(main())


def test_a_request_charged_what_it_held_shows_the_balance_it_left_after_the_cache_expired(
        database_url: str) -> None:
    async def one(billing: Billing, hold: Callable[[], Awaitable[Hold]], timer: Timer) -> None:
        held = await hold()
        timer.now += BALANCE_CACHE_TTL_S * 3  # the work outlasts the cached balance
        assert billing.known_balance(held.payer.account_id) is None
        await held.settle(_cost())

    assert _balance_known_after(database_url, one) == Balances(5 * USD - PRICE, 0)


def test_a_settlement_after_another_request_shows_both_charges(database_url: str) -> None:
    async def two(billing: Billing, hold: Callable[[], Awaitable[Hold]], timer: Timer) -> None:
        first, second = await hold(), await hold()
        await second.settle(_cost())
        timer.now += BALANCE_CACHE_TTL_S * 3  # the first outlasts the second's entry
        await first.settle(_cost())

    assert _balance_known_after(database_url, two) == Balances(5 * USD - 2 * PRICE, 0)
