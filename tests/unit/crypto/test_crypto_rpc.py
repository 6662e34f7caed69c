"""`GET /crypto/rpc/networks` and `POST /crypto/rpc/{network}`: the gateway in process, its
networks pointed at a fake JSON-RPC node on a loopback socket (tests/rpc_node.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from serve_app.crypto.methods import ADVANCED, LARGE, STANDARD, Refusal, classify
from serve_app.crypto.networks import load_nodes, parse_nodes
from serve_app.settings import Settings
from tests.rpc_node import RpcNode, closed_port_url
from tests.unit.conftest import Gateway, make_gateway

RPC = "/api/v1/crypto/rpc"
NANOS_PER_CREDIT = 700  # 7e-7 USD
DAY = 24 * 3600


def call(method: str, params: list | None = None, id: int | str = 1) -> dict:
    return {"jsonrpc": "2.0", "method": method, "params": params or [], "id": id}


def write_config(path: Path, node_url: str, **overrides) -> Path:
    config = {
        "price_per_credit_usd": "0.0000007",
        # Generous: a loaded machine (Ray shutting down after the integration suite) must not
        # turn the fake node's instant answers into timeouts.
        "timeout_s": 3,
        "networks": {
            "ethereum-mainnet": {"url": node_url, "family": "evm", "base_credits": 20},
            "base-mainnet": {"url": "${CRYPTO_RPC_TEST_BASE_URL}", "family": "evm"},
            "zksync-mainnet": {"url": node_url, "family": "evm", "base_credits": 30},
            "solana-mainnet": {"url": node_url, "family": "solana", "base_credits": 30},
            "starknet-mainnet": {"url": node_url, "family": "starknet", "base_credits": 20},
            "arbitrum-mainnet": {"url": closed_port_url(), "family": "evm"},
            "polygon-mainnet": {"url": "${CRYPTO_RPC_TEST_UNSET_URL}", "family": "evm"},
            "linea-mainnet": {"url": "", "family": "evm"},
        },
        **overrides,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def node() -> Iterator[RpcNode]:
    with RpcNode() as running:
        yield running


def rpc_gateway(tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch,
                initial_credit_usd: float = 10, **overrides) -> Iterator[Gateway]:
    monkeypatch.setenv("CRYPTO_RPC_TEST_BASE_URL", node.url)
    monkeypatch.delenv("CRYPTO_RPC_TEST_UNSET_URL", raising=False)
    nodes = write_config(tmp_path / "crypto_rpc.yaml", node.url, **overrides)
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=initial_credit_usd,
                                     rate_limit_backend="local", crypto_rpc_nodes=nodes))


@pytest.fixture
def gw(tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    yield from rpc_gateway(tmp_path, node, monkeypatch)


def usd_nanos(gw: Gateway) -> int:
    resp = gw.client.get("/api/v1/billing/balance", headers=gw.auth())
    assert resp.status_code == 200, resp.text
    return int(Decimal(str(resp.json()["balances"]["usd"])) * 10**9)


def post(gw: Gateway, network: str, body, key: str | None = None):
    return gw.client.post(f"{RPC}/{network}", headers=gw.auth(key), json=body)


# --- networks -------------------------------------------------------------------------------

def test_networks_are_public_sorted_and_only_those_with_a_url(gw: Gateway) -> None:
    resp = gw.client.get(f"{RPC}/networks")  # no credentials
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"networks": ["arbitrum-mainnet", "base-mainnet", "ethereum-mainnet",
                                        "solana-mainnet", "starknet-mainnet", "zksync-mainnet"]}


def test_the_shipped_config_loads_and_offers_nothing_without_urls() -> None:
    config = load_nodes(Path(__file__).parents[3] / "configs" / "crypto_rpc.yaml", environ={})
    assert config.networks == {}
    assert config.requests_per_minute == 100 and config.credits_per_day == 10_000_000
    assert config.price_per_credit_usd == Decimal("0.0000007")
    env = {"CRYPTO_RPC_SOLANA_MAINNET_URL": "https://sol.example/key123",
           "CRYPTO_RPC_ZKSYNC_MAINNET_URL": "https://zk.example",
           "CRYPTO_RPC_BASE_MAINNET_URL": "https://base.example"}
    config = load_nodes(Path(__file__).parents[3] / "configs" / "crypto_rpc.yaml", environ=env)
    assert config.slugs == ["base-mainnet", "solana-mainnet", "zksync-mainnet"]
    assert [(n.family, n.base_credits) for n in config.networks.values()] == [
        ("evm", 20), ("solana", 30), ("evm", 30)]
    assert "key123" not in repr(config.networks["solana-mainnet"])


def test_a_node_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http"):
        parse_nodes({"networks": {"x-net": {"url": "file:///etc/passwd", "family": "evm"}}})
    with pytest.raises(ValueError, match="family"):
        parse_nodes({"networks": {"x-net": {"url": "http://a", "family": "bitcoin"}}})


def test_method_tiers_and_refusals() -> None:
    assert classify("eth_blockNumber", "evm", "n") == STANDARD
    assert classify("eth_sendRawTransaction", "evm", "n") == STANDARD
    assert classify("eth_sendUserOperation", "evm", "n") == STANDARD
    assert classify("zks_getL1BatchDetails", "evm", "n") == STANDARD
    assert classify("trace_block", "evm", "n") == ADVANCED
    assert classify("debug_traceTransaction", "evm", "n") == ADVANCED
    assert classify("txpool_status", "evm", "n") == ADVANCED
    assert classify("arbtrace_block", "evm", "n") == ADVANCED
    assert classify("trace_replayTransaction", "evm", "n") == LARGE
    assert classify("arbtrace_replayBlockTransactions", "evm", "n") == LARGE
    assert classify("txpool_content", "evm", "n") == LARGE
    assert classify("getBalance", "solana", "n") == STANDARD
    assert classify("getSupply", "solana", "n") == LARGE
    assert classify("starknet_call", "starknet", "n") == STANDARD
    kinds = {m: classify(m, "evm", "n") for m in (
        "eth_sign", "eth_signTransaction", "eth_sendTransaction", "eth_accounts",
        "personal_sign", "admin_addPeer", "miner_start", "debug_setHead", "eth_newFilter",
        "eth_getFilterChanges", "eth_subscribe", "getBalance", "eth_foo")}
    assert all(isinstance(r, Refusal) for r in kinds.values())
    assert {m: r.kind for m, r in kinds.items()} == {
        "eth_sign": "forbidden", "eth_signTransaction": "forbidden",
        "eth_sendTransaction": "forbidden", "eth_accounts": "forbidden",
        "personal_sign": "forbidden", "admin_addPeer": "forbidden", "miner_start": "forbidden",
        "debug_setHead": "forbidden", "eth_newFilter": "filter",
        "eth_getFilterChanges": "filter", "eth_subscribe": "websocket",
        "getBalance": "family", "eth_foo": "unmapped"}
    assert classify("accountSubscribe", "solana", "n").kind == "websocket"
    assert classify("starknet_subscribeNewHeads", "starknet", "n").kind == "websocket"
    assert classify("eth_call", "starknet", "starknet-mainnet").message == (
        "eth_call is an EVM method; starknet-mainnet is a Starknet network")


# --- forwarding and billing -----------------------------------------------------------------

def test_single_call_is_forwarded_answered_and_billed(gw: Gateway, node: RpcNode) -> None:
    before = usd_nanos(gw)
    resp = post(gw, "ethereum-mainnet", call("eth_blockNumber", id=7))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert resp.json() == {"jsonrpc": "2.0", "id": 7, "result": "0x10d4f"}
    assert resp.headers["x-venice-rpc-credits"] == "20"
    assert resp.headers["x-venice-rpc-cost-usd"] == "0.00001400"
    assert "x-ratelimit-limit" not in resp.headers  # set on 429 only
    assert usd_nanos(gw) == before - 20 * NANOS_PER_CREDIT
    # The node got the call as sent, and none of the caller's credentials.
    [received] = node.requests
    assert received.body == call("eth_blockNumber", id=7)
    assert "authorization" not in received.headers
    assert received.headers["content-type"] == "application/json"


def test_an_inference_key_may_call_and_its_usage_is_in_the_history(gw: Gateway) -> None:
    key = gw.create_key()["apiKey"]
    resp = post(gw, "solana-mainnet", call("getBalance", ["11111111111111111111111111111111"]),
                key=key)
    assert resp.status_code == 200, resp.text
    assert resp.json()["result"]["value"] == 1_000_000_000
    assert resp.headers["x-venice-rpc-credits"] == "30"
    assert resp.headers["x-venice-rpc-cost-usd"] == "0.00002100"
    history = gw.client.get("/api/v1/billing/usage-history", headers=gw.auth()).json()["data"]
    [line] = history
    assert line["sku"].startswith("crypto-rpc-solana-mainnet-")
    assert line["units"] == 30 and line["currency"] == "USD"
    assert line["pricePerUnitUsd"] == pytest.approx(7e-7)


def test_batch_with_tiers_and_an_rpc_error_item(gw: Gateway, node: RpcNode) -> None:
    before = usd_nanos(gw)
    body = [call("eth_chainId", id=1), call("eth_blockNumber", id=2),
            call("eth_call", [{"to": "0x0"}, "latest"], id="three"),
            call("trace_block", ["latest"], id=4), call("trace_replayTransaction", ["0x1"], id=5)]
    resp = post(gw, "ethereum-mainnet", body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert [a["id"] for a in answer] == [1, 2, "three", 4, 5]
    assert answer[2]["error"]["message"] == "execution reverted"
    credits = 20 + 20 + 5 + 40 + 80
    assert resp.headers["x-venice-rpc-credits"] == str(credits)
    assert resp.headers["x-venice-rpc-cost-usd"] == f"{Decimal(credits) * Decimal('7e-7'):.8f}"
    assert usd_nanos(gw) == before - credits * NANOS_PER_CREDIT
    assert node.requests[0].body == body


def test_rpc_level_error_is_billed_five_credits(gw: Gateway) -> None:
    before = usd_nanos(gw)
    resp = post(gw, "zksync-mainnet", call("eth_call", [{"to": "0x0"}, "latest"]))
    assert resp.status_code == 200, resp.text
    assert resp.json()["error"]["code"] == -32000
    assert resp.headers["x-venice-rpc-credits"] == "5"
    assert resp.headers["x-venice-rpc-cost-usd"] == "0.00000350"
    assert usd_nanos(gw) == before - 5 * NANOS_PER_CREDIT


def test_send_raw_transaction_and_starknet_are_forwarded(gw: Gateway) -> None:
    resp = post(gw, "base-mainnet", call("eth_sendRawTransaction", ["0x02f8"]))
    assert resp.status_code == 200, resp.text
    assert resp.json()["result"].startswith("0xab")
    resp = post(gw, "starknet-mainnet", call("starknet_blockNumber"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-venice-rpc-credits"] == "20"
    resp = post(gw, "solana-mainnet", call("getSupply"))
    assert resp.headers["x-venice-rpc-credits"] == "120"


def test_a_notification_is_forwarded_and_billed_in_full(gw: Gateway, node: RpcNode) -> None:
    before = usd_nanos(gw)
    resp = post(gw, "ethereum-mainnet", {"jsonrpc": "2.0", "method": "eth_sendRawTransaction",
                                         "params": ["0x02f8"]})
    assert resp.status_code == 200, resp.text
    assert resp.content == b""  # JSON-RPC answers no notification; the node did the work
    assert resp.headers["x-venice-rpc-credits"] == "20"
    assert usd_nanos(gw) == before - 20 * NANOS_PER_CREDIT
    assert len(node.requests) == 1


# --- refused before the node: 400, nothing charged ------------------------------------------

@pytest.mark.parametrize(("network", "body", "status", "words"), [
    ("ethereum-mainnet", call("eth_sign", ["0x0", "0x1"]), 400, ["eth_sign", "signing"]),
    ("ethereum-mainnet", call("personal_unlockAccount"), 400, ["personal_unlockAccount"]),
    ("ethereum-mainnet", call("debug_setHead", ["0x1"]), 400, ["debug_setHead"]),
    ("ethereum-mainnet", call("eth_newFilter", [{}]), 400, ["eth_newFilter", "eth_getLogs"]),
    ("ethereum-mainnet", call("eth_subscribe", ["newHeads"]), 400, ["eth_subscribe",
                                                                     "WebSocket"]),
    ("solana-mainnet", call("accountSubscribe", ["x"]), 400, ["accountSubscribe", "WebSocket"]),
    ("starknet-mainnet", call("eth_blockNumber"), 400, ["eth_blockNumber", "Starknet"]),
    ("ethereum-mainnet", call("eth_madeUp"), 400, ["eth_madeUp"]),
    ("ethereum-mainnet", [call("eth_blockNumber", id=i) for i in range(101)], 400,
     ["101", "100"]),
    ("ethereum-mainnet", [], 400, ["Empty batch"]),
    ("ethereum-mainnet", 42, 400, ["JSON-RPC"]),
    ("ethereum-mainnet", {"jsonrpc": "2.0", "id": 1}, 400, ["Invalid JSON-RPC request"]),
    ("dogecoin-mainnet", call("eth_blockNumber"), 400, ["dogecoin-mainnet", "networks"]),
    ("polygon-mainnet", call("eth_blockNumber"), 400, ["polygon-mainnet"]),
])
def test_refused_requests_name_the_problem_and_cost_nothing(
        gw: Gateway, node: RpcNode, network: str, body, status: int, words: list[str]) -> None:
    before = usd_nanos(gw)
    resp = post(gw, network, body)
    assert resp.status_code == status, resp.text
    error = resp.json()
    assert set(error) >= {"error", "details"}  # DetailedError
    text = resp.text
    for word in words:
        assert word in text, (word, text)
    assert "x-venice-rpc-credits" not in resp.headers
    assert node.requests == []
    assert usd_nanos(gw) == before


def test_a_batch_with_forbidden_methods_lists_each_and_is_rejected_whole(
        gw: Gateway, node: RpcNode) -> None:
    body = [call("eth_blockNumber", id=1), call("eth_sign", id=2), call("eth_newFilter", id=3),
            call("eth_sign", id=4)]
    resp = post(gw, "ethereum-mainnet", body)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["error"] == ("Unsupported methods for ethereum-mainnet: eth_sign, "
                              "eth_newFilter; the whole batch is rejected")
    assert error["details"]["1"]["method"]["_errors"][0].startswith("eth_sign is not offered")
    assert "eth_getLogs" in error["details"]["2"]["method"]["_errors"][0]
    assert "0" not in error["details"]
    assert node.requests == []


def test_empty_and_malformed_bodies(gw: Gateway, node: RpcNode) -> None:
    headers = {**gw.auth(), "content-type": "application/json"}
    resp = gw.client.post(f"{RPC}/ethereum-mainnet", headers=headers, content=b"")
    assert resp.status_code == 400, resp.text
    assert "empty" in resp.json()["error"]
    resp = gw.client.post(f"{RPC}/ethereum-mainnet", headers=headers,
                          content=b'{"jsonrpc": "2.0", "method": ')
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == "Malformed JSON in request body"
    assert resp.json()["details"]["_errors"] == ["Request body is not valid JSON"]
    assert node.requests == []


def test_a_batch_with_duplicate_ids_is_refused_uncounted_and_uncharged(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attack: two calls share an id, so their answers cannot be told apart and an error
    answer could be matched to the cheaper call (billing the expensive one at 5 credits)."""
    notification = {"jsonrpc": "2.0", "method": "eth_chainId", "params": []}
    for gw in rpc_gateway(tmp_path, node, monkeypatch,
                          limits={"requests_per_minute": 1, "credits_per_day": 10_000}):
        before = usd_nanos(gw)
        for body in ([call("eth_getLogs", id=7), call("eth_chainId", id=7)],
                     [call("eth_chainId", id="a"), notification, call("eth_chainId", id=2),
                      call("eth_blockNumber", id="a"), call("eth_chainId", id=2)]):
            resp = post(gw, "ethereum-mainnet", body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["code"] == "INVALID_REQUEST"
            assert "x-venice-rpc-credits" not in resp.headers
        error = resp.json()
        assert error["error"] == ('Duplicate ids in the batch: "a", 2; each call needs its '
                                  "own id")
        assert error["details"]["0"]["id"]["_errors"] == ['Duplicate id "a"']
        assert error["details"]["4"]["id"]["_errors"] == ["Duplicate id 2"]
        assert "1" not in error["details"]  # the notification
        assert node.requests == []
        assert usd_nanos(gw) == before
        # Nothing was counted: the one request of the minute is still there, and 1 and "1"
        # are different ids, notifications (no id) share none.
        resp = post(gw, "ethereum-mainnet",
                    [call("eth_chainId", id=1), call("eth_chainId", id="1"), notification,
                     notification])
        assert resp.status_code == 200, resp.text
        assert len(node.requests) == 1
        assert post(gw, "ethereum-mainnet", call("eth_chainId")).status_code == 429


# --- the node failing: 500, nothing charged -------------------------------------------------

def test_upstream_down_is_a_clear_500_and_costs_nothing(gw: Gateway) -> None:
    before = usd_nanos(gw)
    resp = post(gw, "arbitrum-mainnet", call("eth_blockNumber"))
    assert resp.status_code == 500, resp.text
    assert resp.json() == {"error": "The arbitrum-mainnet node could not be reached; you were "
                                    "not charged", "code": "UPSTREAM_ERROR"}
    assert "127.0.0.1" not in resp.text
    assert usd_nanos(gw) == before


@pytest.mark.parametrize(("mode", "words"), [
    ("html", "something other than a JSON-RPC response"),
    ("not_rpc", "something other than a JSON-RPC response"),
    ("status500", "answered HTTP 500"),
])
def test_a_node_answer_that_is_not_json_rpc_is_a_500(gw: Gateway, node: RpcNode, mode: str,
                                                     words: str) -> None:
    before = usd_nanos(gw)
    node.mode = mode
    resp = post(gw, "ethereum-mainnet", call("eth_blockNumber"))
    assert resp.status_code == 500, resp.text
    assert words in resp.json()["error"]
    assert resp.json()["code"] == "UPSTREAM_ERROR"
    assert usd_nanos(gw) == before


# --- caps and credentials -------------------------------------------------------------------

def test_the_101st_request_in_a_minute_is_refused(gw: Gateway) -> None:
    now = time.time()
    gw.services.crypto_rpc.limits.clock = lambda: now  # the 101 within the minute, however slow
    for i in range(100):
        resp = post(gw, "ethereum-mainnet", call("eth_chainId", id=i))
        assert resp.status_code == 200, (i, resp.text)
        assert "x-ratelimit-limit" not in resp.headers
    before = usd_nanos(gw)
    resp = post(gw, "ethereum-mainnet", call("eth_chainId", id=100))
    assert resp.status_code == 429, resp.text
    assert resp.headers["x-ratelimit-limit"] == "100"
    assert resp.headers["x-ratelimit-remaining"] == "0"
    reset = int(resp.headers["x-ratelimit-reset"])  # Unix seconds
    assert now < reset <= now + 61
    assert abs(int(resp.headers["retry-after"]) - (reset - now)) <= 1  # seconds from now
    body = resp.json()
    assert "100 requests per minute" in body["customMessage"]
    assert body["error"] == body["customMessage"]
    assert usd_nanos(gw) == before


def test_the_daily_credit_cap(tmp_path: Path, node: RpcNode,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch,
                          limits={"requests_per_minute": 100, "credits_per_day": 50}):
        now = [datetime.now(UTC) - timedelta(hours=3)]
        gw.services.billing.clock = gw.services.crypto_rpc.clock = lambda now=now: now[0]
        first_at = now[0]
        assert post(gw, "ethereum-mainnet", call("eth_chainId")).status_code == 200
        now[0] += timedelta(hours=1)
        second_at = now[0]
        assert post(gw, "ethereum-mainnet", call("eth_chainId")).status_code == 200
        now[0] += timedelta(hours=2)
        before = usd_nanos(gw)
        resp = post(gw, "ethereum-mainnet", call("eth_chainId"))
        assert resp.status_code == 429, resp.text
        assert "50 credits per rolling 24 hours" in resp.json()["customMessage"]
        # In credits: 50 a day, 10 left; this call (20) fits once the first call's credits
        # leave the rolling window, 24 hours after it was settled.
        assert resp.headers["x-ratelimit-limit"] == "50"
        assert resp.headers["x-ratelimit-remaining"] == "10"
        assert abs(int(resp.headers["x-ratelimit-reset"])
                   - (first_at + timedelta(days=1)).timestamp()) <= 1
        assert abs(int(resp.headers["retry-after"])  # 24 h after the first call, from now
                   - (first_at + timedelta(days=1) - now[0]).total_seconds()) <= 1
        assert "X-RateLimit-Reset" in resp.json()["customMessage"]
        assert len(node.requests) == 2
        assert usd_nanos(gw) == before
        # A batch of two calls (40) fits only once the second call's credits leave too.
        resp = post(gw, "ethereum-mainnet", [call("eth_chainId", id=i) for i in range(2)])
        assert resp.status_code == 429, resp.text
        assert resp.headers["x-ratelimit-remaining"] == "10"
        assert abs(int(resp.headers["x-ratelimit-reset"])
                   - (second_at + timedelta(days=1)).timestamp()) <= 1


def test_the_daily_credit_cap_resets_when_the_calls_in_flight_settle_at_the_latest(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch,
                          limits={"requests_per_minute": 100, "credits_per_day": 10}):
        before = time.time()
        resp = post(gw, "ethereum-mainnet", call("eth_chainId"))  # 20 credits: never fits
        assert resp.status_code == 429, resp.text
        assert resp.headers["x-ratelimit-limit"] == "10"
        assert resp.headers["x-ratelimit-remaining"] == "10"
        assert before + DAY - 1 <= int(resp.headers["x-ratelimit-reset"]) <= time.time() + DAY + 1
        assert node.requests == []


def test_no_credentials(gw: Gateway, node: RpcNode) -> None:
    resp = gw.client.post(f"{RPC}/ethereum-mainnet", json=call("eth_blockNumber"))
    # As published: 401 for missing credentials (a key or a wallet sign-in), not the
    # discovery 402 of inference routes.
    assert resp.status_code == 401, resp.text
    assert "SIGN-IN-WITH-X" in resp.json()["error"]
    resp = gw.client.post(f"{RPC}/ethereum-mainnet", json=call("eth_blockNumber"),
                          headers={"Authorization": "Bearer sk-not-a-key"})
    assert resp.status_code == 401, resp.text
    assert node.requests == []


def test_insufficient_balance_is_402_and_the_node_is_not_called(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch, initial_credit_usd=0):
        resp = post(gw, "ethereum-mainnet", call("eth_blockNumber"))
        assert resp.status_code == 402, resp.text
        assert node.requests == []


# --- Idempotency-Key ------------------------------------------------------------------------


def test_an_idempotent_retry_is_replayed_without_a_second_charge(gw: Gateway,
                                                                 node: RpcNode) -> None:
    before = usd_nanos(gw)
    headers = {**gw.auth(), "Idempotency-Key": "retry-1"}
    body = call("eth_blockNumber", id=3)
    first = gw.client.post(f"{RPC}/ethereum-mainnet", headers=headers, json=body)
    again = gw.client.post(f"{RPC}/ethereum-mainnet", headers=headers, json=body)
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["x-venice-rpc-credits"] == "20"
    assert len(node.requests) == 1  # forwarded once
    assert usd_nanos(gw) == before - 20 * NANOS_PER_CREDIT  # charged once
    other = gw.client.post(f"{RPC}/ethereum-mainnet", headers=headers,
                           json=call("eth_chainId", id=3))
    assert other.status_code == 400
    assert "different body" in other.json()["details"]["Idempotency-Key"]["_errors"][0]
    bad = gw.client.post(f"{RPC}/ethereum-mainnet", json=body,
                         headers={**gw.auth(), "Idempotency-Key": "no spaces allowed"})
    assert bad.status_code == 400


def test_a_failed_idempotent_request_may_be_retried(tmp_path: Path, node: RpcNode,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch):
        headers = {**gw.auth(), "Idempotency-Key": "down-then-up"}
        down = gw.client.post(f"{RPC}/arbitrum-mainnet", headers=headers,
                              json=call("eth_blockNumber"))
        assert down.status_code == 500  # its node is a closed port: not charged, not kept
        retry = gw.client.post(f"{RPC}/arbitrum-mainnet", headers=headers,
                               json=call("eth_blockNumber"))
        assert retry.status_code == 500
        assert "idempotent-replayed" not in retry.headers


def test_crypto_usage_is_counted_in_credits_by_the_analytics(gw: Gateway) -> None:
    assert post(gw, "ethereum-mainnet", call("eth_blockNumber")).status_code == 200
    resp = gw.client.get("/api/v1/billing/usage-analytics", headers=gw.auth())
    assert resp.status_code == 200, resp.text
    [entry] = [m for m in resp.json()["byModel"]
               if m["modelName"] == "crypto-rpc-ethereum-mainnet"]
    assert (entry["unitType"], entry["totalUnits"]) == ("credits", 20)
