"""The reference's wallet limits, as a client of the reference meets them: at most five
requests of one wallet in flight (the sixth 429 X402_CONCURRENCY_LIMIT, nothing charged), and
the per-minute caps of /x402/top-up (per client address), /x402/balance and
/x402/transactions (per wallet): 429 RATE_LIMIT_EXCEEDED with Retry-After."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway
from tests.unit.wallets.wallet_gateway import (
    CALL,
    CHAT_URL,
    NANOS_PER_CALL,
    RPC_URL,
    TOP_UP,
    nanos,
    top_up,
)
from tests.wallets import Wallet, signed_in

ARRIVAL_TIMEOUT_S = 120  # a hang guard only: the test waits for arrivals, not for time


def _transactions(gw: Gateway, wallet: Wallet) -> dict:
    resp = gw.client.get(f"/api/v1/x402/transactions/{wallet.address}", headers=gw.auth())
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]


def test_the_sixth_request_in_flight_of_a_wallet_is_refused_and_charged_nothing(
        gw: Gateway, node: RpcNode) -> None:
    wallet = Wallet()
    assert top_up(gw, wallet, "5").status_code == 200
    headers = [signed_in(gw.client, wallet, RPC_URL, CHAT_URL) for _ in range(7)]
    node.gate = threading.Event()
    with ThreadPoolExecutor(5) as pool:
        held = [pool.submit(gw.client.post, RPC_URL, json=CALL, headers=h)
                for h in headers[:5]]
        for _ in range(5):  # five calls are at the node, their answers held
            assert node.arrivals.acquire(timeout=ARRIVAL_TIMEOUT_S)
        sixth = gw.client.post(RPC_URL, json=CALL, headers=headers[5])
        node.gate.set()
        answers = [future.result() for future in held]

    assert sixth.status_code == 429, sixth.text
    assert sixth.json()["code"] == "X402_CONCURRENCY_LIMIT"
    assert sixth.json()["error"] and sixth.headers["Retry-After"] == "1"
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers]
    assert len(node.requests) == 5  # the sixth never reached the node
    data = _transactions(gw, wallet)
    assert [t["type"] for t in data["transactions"]] == ["CHARGE"] * 5 + ["TOP_UP"]
    assert nanos(data["currentBalance"]) == 5 * 10**9 - 5 * NANOS_PER_CALL
    # The slots are free once the answers have ended.
    assert gw.services.wallets.in_flight.open_requests(wallet.address.lower()) == 0
    node.gate = None
    assert gw.client.post(RPC_URL, json=CALL, headers=headers[6]).status_code == 200


def test_a_wallet_reads_its_balance_30_times_a_minute(gw: Gateway) -> None:
    wallet = Wallet()
    url = f"/api/v1/x402/balance/{wallet.address}"
    for _ in range(30):
        resp = gw.client.get(url, headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))
        assert resp.status_code == 200, resp.text

    refused = gw.client.get(url, headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert refused.json()["error"].startswith("Rate limit exceeded. Please try again later")
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Another wallet is not throttled by it, and a minute later the wallet reads again.
    other = Wallet()
    assert gw.client.get(f"/api/v1/x402/balance/{other.address}", headers=signed_in(
        gw.client, other, RPC_URL, CHAT_URL)).status_code == 200
    limits = gw.services.limits
    real_clock = limits.clock
    limits.clock = lambda: real_clock() + 61
    assert gw.client.get(url, headers=signed_in(
        gw.client, wallet, RPC_URL, CHAT_URL)).status_code == 200


def test_transactions_are_read_20_times_a_minute(gw: Gateway) -> None:
    wallet = Wallet()
    url = f"/api/v1/x402/transactions/{wallet.address}"
    for _ in range(20):
        resp = gw.client.get(url, headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))
        assert resp.status_code == 200, resp.text

    refused = gw.client.get(url, headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # The balance has its own count.
    assert gw.client.get(f"/api/v1/x402/balance/{wallet.address}", headers=signed_in(
        gw.client, wallet, RPC_URL, CHAT_URL)).status_code == 200


def test_one_client_address_makes_10_top_up_attempts_a_minute(gw: Gateway) -> None:
    for _ in range(10):
        resp = gw.client.post(TOP_UP, headers={"PAYMENT-SIGNATURE": "not-a-payment"})
        assert resp.status_code == 400, resp.text

    refused = gw.client.post(TOP_UP, headers={"PAYMENT-SIGNATURE": "not-a-payment"})

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Discovery (no payment header) is not an attempt.
    assert gw.client.post(TOP_UP).status_code == 402


def test_sign_ins_from_one_client_address_are_capped_before_a_nonce_is_written(
        gw: Gateway) -> None:
    """A client making fresh wallets to sign in with: past its address's sign-ins a minute,
    429 before the signature is checked or a nonce written; a minute later it signs in
    again."""
    from sqlalchemy import func
    from sqlmodel import Session, select

    from serve_app.db.tables import SiwxNonce
    from serve_app.wallets.limits import SignInsPerClient

    now = [1000.0]
    gw.services.wallets.sign_ins = SignInsPerClient(3, clock=lambda: now[0])

    def nonces() -> int:
        with Session(gw.services.engine) as session:
            return session.exec(select(func.count()).select_from(SiwxNonce)).one()

    def balance(wallet: Wallet):
        return gw.client.get(f"/api/v1/x402/balance/{wallet.address}",
                             headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))

    for _ in range(3):
        assert balance(Wallet()).status_code == 200
    written = nonces()

    refused = balance(Wallet())

    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert int(refused.headers["Retry-After"]) == 60
    assert nonces() == written  # nothing written for it
    now[0] += 60
    assert balance(Wallet()).status_code == 200
