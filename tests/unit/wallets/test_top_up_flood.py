"""Top-ups flooded with fresh payer addresses (issue 35, item 6): a payer address costs nothing
to make, so attempts are counted per client address and for all clients together before the
payment header is decoded; a payment is claimed only once the facilitator (here a fake on a
loopback socket: no chain offline) has verified it, so a refused one writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.db.tables import PaymentStatus, X402Payment
from serve_app.wallets.x402 import BASE_NETWORK
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.wallets.wallet_gateway import TOP_UP, wallet_settings
from tests.wallets import Wallet
from tests.x402_fakes import FakeFacilitator

PER_CLIENT = 4


@pytest.fixture
def facilitator() -> Iterator[FakeFacilitator]:
    with FakeFacilitator(valid=False) as fake:
        yield fake


def _gateway(tmp_path: Path, node: RpcNode, facilitator: FakeFacilitator,
             **settings) -> Iterator[tuple[Gateway, list[int]]]:
    """The wallet gateway paying through `facilitator`, and the number of claims written by
    the time of each of its verify calls."""
    settings_of = wallet_settings(tmp_path, node, facilitator.url, **settings)
    claims_at_verify: list[int] = []
    for gw in make_gateway(settings_of):
        facilitator.before_verify = lambda gw=gw: claims_at_verify.append(_claims(gw))
        yield gw, claims_at_verify


def _claims(gw: Gateway, status: PaymentStatus | None = None) -> int:
    query = select(func.count()).select_from(X402Payment)
    if status is not None:
        query = query.where(X402Payment.status == status)
    with Session(gw.services.engine) as session:
        return session.execute(query).scalar_one()


def _from_address(gw: Gateway, address: str, headers: dict[str, str]) -> httpx.Response:
    """POST /x402/top-up as a client at `address`, on the loop that serves the gateway."""

    async def post(app) -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=(address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.post(TOP_UP, headers=headers)

    return gw.client.portal.call(post, gw.client.app)


def test_fresh_payers_from_one_client_address_are_refused_before_decoding(
        tmp_path: Path, node: RpcNode, facilitator: FakeFacilitator) -> None:
    for gw, claims_at_verify in _gateway(tmp_path, node, facilitator,
                       x402_top_ups_per_client_per_minute=PER_CLIENT):
        asked = gw.client.post(f"{TOP_UP}?amount=5")
        for _ in range(PER_CLIENT):  # each a new, unfunded wallet: refused by the facilitator
            resp = gw.client.post(TOP_UP, headers=Wallet().pay(asked, BASE_NETWORK))
            assert resp.status_code == 402, resp.text
            assert "insufficient_funds" in resp.text

        flood = gw.client.post(TOP_UP, headers=Wallet().pay(asked, BASE_NETWORK))
        garbage = gw.client.post(TOP_UP, headers={"PAYMENT-SIGNATURE": "not a payment"})

        assert flood.status_code == 429, flood.text
        assert flood.json()["code"] == "RATE_LIMIT_EXCEEDED"
        assert "client address" in flood.json()["error"]
        assert 1 <= int(flood.headers["Retry-After"]) <= 60
        assert garbage.status_code == 429  # counted before the header is decoded (else 400)
        assert facilitator.calls == ["verify"] * PER_CLIENT  # none for the refused ones
        assert claims_at_verify == [0] * PER_CLIENT
        assert _claims(gw) == 0 and not gw.cli("pending-payments")
        assert not [a for a in gw.cli("accounts") if a["walletAddress"]]
        # Another client address is not held back by this one.
        elsewhere = _from_address(gw, "192.0.2.9", Wallet().pay(asked, BASE_NETWORK))
        assert elsewhere.status_code == 402, elsewhere.text
        assert facilitator.calls == ["verify"] * (PER_CLIENT + 1)
        assert facilitator.verify_failures == []


def test_all_clients_together_have_a_bucket_too(tmp_path: Path, node: RpcNode,
                                                facilitator: FakeFacilitator) -> None:
    for gw, _ in _gateway(tmp_path, node, facilitator, x402_top_ups_per_minute=3):
        asked = gw.client.post(f"{TOP_UP}?amount=5")
        for n in range(3):
            resp = _from_address(gw, f"192.0.2.{n + 1}", Wallet().pay(asked, BASE_NETWORK))
            assert resp.status_code == 402, resp.text

        resp = _from_address(gw, "192.0.2.200", Wallet().pay(asked, BASE_NETWORK))

        assert resp.status_code == 429, resp.text
        assert "on this server" in resp.json()["error"]
        assert facilitator.calls == ["verify"] * 3
        assert _claims(gw) == 0


def test_a_verified_payment_is_claimed_after_the_verify_and_credited_once(
        tmp_path: Path, node: RpcNode, facilitator: FakeFacilitator) -> None:
    facilitator.valid = True
    for gw, claims_at_verify in _gateway(tmp_path, node, facilitator):
        wallet = Wallet()
        paid = wallet.pay(gw.client.post(f"{TOP_UP}?amount=5"), BASE_NETWORK)

        first = gw.client.post(TOP_UP, headers=paid)
        replay = gw.client.post(TOP_UP, headers=paid)

        assert first.status_code == 200, first.text
        assert replay.status_code == 409 and replay.json()["error"] == "X402_PAYMENT_ALREADY_USED"
        assert facilitator.calls == ["verify", "settle"]  # the replay refused from a read
        assert claims_at_verify == [0]
        assert _claims(gw, PaymentStatus.CREDITED) == 1 and _claims(gw) == 1
        account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
        assert account["usd"] == 5
        assert facilitator.verify_failures == []
