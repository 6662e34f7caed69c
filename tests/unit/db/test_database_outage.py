"""PostgreSQL unreachable (its connections cut on a real socket, then restored): clients get a
503 with Retry-After instead of a 500, money operations wait for the database instead of being
lost, and everything answers again once it is back."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session

from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import price
from serve_app.billing.service import Billing
from serve_app.db.engine import is_database_outage, make_engine, migrate
from serve_app.db.tables import LedgerEntry, Reservation
from serve_app.models.catalog import CatalogModel
from serve_app.money import to_nanos
from serve_app.settings import Settings
from tests.conftest import _PG_REASON, POSTGRES_URL, drop_postgres_schema, new_postgres_schema
from tests.tcp_proxy import CuttableProxy
from tests.unit.conftest import Gateway, make_gateway

pytestmark = pytest.mark.skipif(bool(_PG_REASON), reason=_PG_REASON or "")

EMBED = CatalogModel(id="embed-b", type="embedding", name="Embed B", deployment="embedding",
                     engine="st", pricing={"input": {"usd": 0.1}})


@pytest.fixture
def proxied_url() -> Iterator[tuple[str, CuttableProxy]]:
    """A migrated schema of the test database, reached through a proxy the test can cut."""
    direct = new_postgres_schema("outage")
    migrate(direct)
    host_port = POSTGRES_URL.split("@", 1)[1].split("/", 1)[0]
    host, port = host_port.split(":")
    proxy = CuttableProxy((host, int(port)))
    try:
        yield direct.replace(host_port, f"127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.close()
        drop_postgres_schema(direct)


@pytest.fixture
def gateway(proxied_url, tmp_path: Path) -> Iterator[tuple[Gateway, CuttableProxy]]:
    url, proxy = proxied_url
    for gw in make_gateway(Settings(data_dir=tmp_path, database_url=url,
                                    initial_credit_usd=10)):
        yield gw, proxy


def test_requests_get_503_while_the_database_is_down_and_200_after(gateway):
    gw, proxy = gateway
    made = gw.create_key()
    key = made["apiKey"]
    assert gw.client.get("/api/v1/api_keys", headers=gw.auth()).status_code == 200

    proxy.cut()
    for headers in (gw.auth(), gw.auth(key)):  # the admin key was seen, the other is new too
        resp = gw.client.get("/api/v1/api_keys", headers=headers)
        assert resp.status_code == 503, resp.text
        assert resp.json() == {"error": "The service's database is unreachable; try again "
                                        "shortly", "code": "SERVICE_UNAVAILABLE"}
        assert resp.headers["retry-after"] == "5"
        assert resp.headers["cf-ray"]  # the request id still reaches the client

    proxy.restore()
    resp = gw.client.get("/api/v1/api_keys", headers=gw.auth())
    assert resp.status_code == 200, resp.text
    assert made["id"] in {k["id"] for k in resp.json()["data"]}


def _count(url: str, table) -> int:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return s.exec(select(func.count()).select_from(table)).one()[0]
    finally:
        engine.dispose()


def test_a_settle_during_a_restart_waits_for_the_database_and_is_written_once(proxied_url):
    url, proxy = proxied_url
    direct = url.replace(f"127.0.0.1:{proxy.port}",
                         POSTGRES_URL.split("@", 1)[1].split("/", 1)[0])
    from serve_app.accounts.provisioning import bootstrap

    account = bootstrap(Settings(database_url=direct, initial_credit_usd=10)).account_id

    async def main() -> None:
        billing = Billing(url)
        try:
            hold = await billing.hold("outage-1", Payer(account), to_nanos(1))
            proxy.cut()
            threading.Timer(2.0, proxy.restore).start()  # a restart of two seconds
            await billing.settle(hold, price(EMBED, {"input": 1000}))
        finally:
            billing.close()

    asyncio.run(main())
    assert _count(direct, LedgerEntry) == 1
    assert _count(direct, Reservation) == 0


def test_a_long_outage_fails_the_operation_instead_of_hanging(proxied_url):
    url, proxy = proxied_url

    async def main() -> None:
        billing = Billing(url)
        billing.writer.outage_wait_s = 1.0
        proxy.cut()
        try:
            with pytest.raises(DBAPIError) as raised:
                await billing.hold("outage-2", Payer("acct-none"), to_nanos(1))
        finally:
            billing.close()
        assert is_database_outage(raised.value)  # which the Gateway answers with a 503

    asyncio.run(main())
