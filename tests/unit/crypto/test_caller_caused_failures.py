"""Crypto RPC failures the caller's request causes are charged and counted (issue 35, item 7):
an answer over the size cap, or none within the timeout once the request was sent, costs the
error rate of each call and counts toward the daily credit cap (they were free 500s, outside
the cap: a caller could have the node scan and send gigabytes for nothing); an `"id": null` is
refused (a node error about an unreadable call has a null id too, and was priced as a
notification's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.crypto.calls import count_credits, parse_request
from serve_app.crypto.networks import Network
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway
from tests.unit.crypto.test_crypto_rpc import (
    NANOS_PER_CREDIT,
    call,
    post,
    rpc_gateway,
    usd_nanos,
)
from tests.unit.flows.books import Books

ETHEREUM = Network("ethereum-mainnet", "http://node.invalid/", "evm", 20)


@pytest.fixture
def node() -> Iterator[RpcNode]:
    with RpcNode() as running:
        yield running


@pytest.fixture
def gw(tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    yield from rpc_gateway(tmp_path, node, monkeypatch)


@pytest.fixture
def books_of() -> Iterator[list[Books]]:
    opened: list[Books] = []
    yield opened
    for books in opened:
        books.close()


def test_answers_over_the_size_cap_are_charged_and_reach_the_daily_cap(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch,
        books_of: list[Books]) -> None:
    """Each eth_getBalance answer is over the 40 bytes returned: 5 credits each; with 25 a
    day, two such calls (10) leave no room for a third call's 20."""
    for gw in rpc_gateway(tmp_path, node, monkeypatch, max_response_bytes=40,
                          limits={"requests_per_minute": 100, "credits_per_day": 25}):
        books = Books(gw)
        books_of.append(books)
        before = usd_nanos(gw)
        for n in range(2):
            resp = post(gw, "ethereum-mainnet", call("eth_getBalance", ["0x0", "latest"], id=n))
            assert resp.status_code == 413, resp.text
            assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"
            assert "charged 5 credits" in resp.json()["error"]
            assert resp.headers["x-venice-rpc-credits"] == "5"
            assert resp.headers["x-venice-rpc-cost-usd"] == "0.00000350"
            assert books.only_charge(resp.headers["cf-ray"]).lines["credits"][0] == 5

        capped = post(gw, "ethereum-mainnet", call("eth_getBalance", ["0x0", "latest"], id=2))

        assert capped.status_code == 429, capped.text
        assert "credits per rolling 24 hours" in capped.json()["customMessage"]
        assert len(node.requests) == 2  # the third never reached the node
        assert usd_nanos(gw) == before - 10 * NANOS_PER_CREDIT
        assert books.open_holds() == 0


def test_a_batch_over_the_size_cap_pays_the_error_rate_of_each_call(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch, max_response_bytes=40):
        before = usd_nanos(gw)
        batch = [call("eth_getBalance", ["0x0", "latest"], id=i) for i in range(3)]

        resp = post(gw, "ethereum-mainnet", batch)

        assert resp.status_code == 413, resp.text
        assert resp.headers["x-venice-rpc-credits"] == "15"
        assert usd_nanos(gw) == before - 15 * NANOS_PER_CREDIT


def test_no_answer_within_the_timeout_once_sent_is_a_charged_504(
        gw: Gateway, node: RpcNode) -> None:
    """The node holds the request past the proxy's 3 s (it got the whole request: the node
    works on it); a node that cannot be reached stays free (test_crypto_rpc)."""
    before = usd_nanos(gw)
    node.delay = 30.0

    resp = post(gw, "ethereum-mainnet", call("eth_blockNumber"))

    assert resp.status_code == 504, resp.text
    assert resp.json()["code"] == "REQUEST_TIMEOUT"
    assert resp.json()["error"].startswith("The ethereum-mainnet node did not answer within 3 "
                                           "seconds")
    assert resp.headers["x-venice-rpc-credits"] == "5"
    assert usd_nanos(gw) == before - 5 * NANOS_PER_CREDIT
    assert len(node.requests) == 1


@pytest.mark.parametrize("body", [
    {"jsonrpc": "2.0", "method": "eth_call", "params": [{"to": "0x0"}, "latest"], "id": None},
    [{"jsonrpc": "2.0", "method": "eth_sendRawTransaction", "params": ["0x02f8"]},
     {"jsonrpc": "2.0", "method": "eth_call", "params": [{"to": "0x0"}, "latest"], "id": None}],
])
def test_a_null_id_is_refused_before_anything_is_counted(gw: Gateway, node: RpcNode,
                                                          body) -> None:
    before = usd_nanos(gw)

    resp = post(gw, "ethereum-mainnet", body)

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert "null id" in resp.text
    where = resp.json()["details"]
    if isinstance(body, list):
        where = where["1"]
    assert "id" in where
    assert node.requests == [] and usd_nanos(gw) == before


def test_a_node_error_with_a_null_id_never_prices_a_notification() -> None:
    """The node's own error about something it could not read carries a null id: it is not
    the notification's answer (the notification did its work: full price)."""
    rpc = parse_request(b'[{"jsonrpc": "2.0", "method": "eth_sendRawTransaction", '
                        b'"params": ["0x02f8"]}, {"jsonrpc": "2.0", "method": "eth_chainId", '
                        b'"id": 1}]', ETHEREUM)
    answer = [{"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "invalid"}},
              {"jsonrpc": "2.0", "id": 1, "result": "0x1"}]

    assert count_credits(rpc, answer) == 20 + 20
