"""What the crypto RPC proxy keeps for `Idempotency-Key` replays, attacked: the same key on two
networks, entries past their 24 hours, and answers too big to keep."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.crypto import idempotency
from serve_app.db.engine import make_engine
from serve_app.db.tables import RpcIdempotency, utcnow
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway
from tests.unit.crypto.test_crypto_rpc import RPC, call, rpc_gateway


@pytest.fixture
def node() -> Iterator[RpcNode]:
    with RpcNode() as running:
        yield running


def _kept(gw: Gateway) -> int:
    engine = make_engine(gw.settings.resolved_database_url)
    try:
        with Session(engine) as session:
            return session.execute(select(func.count()).select_from(RpcIdempotency)
                                   ).scalar_one()
    finally:
        engine.dispose()


def _post(gw: Gateway, network: str, body, key: str):
    return gw.client.post(f"{RPC}/{network}", json=body,
                          headers={**gw.auth(), "Idempotency-Key": key})


def test_the_same_key_on_two_networks_gets_each_networks_answer(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch):
        body = call("eth_chainId")
        ethereum = _post(gw, "ethereum-mainnet", body, "same-key")
        zksync = _post(gw, "zksync-mainnet", body, "same-key")
        assert ethereum.status_code == zksync.status_code == 200
        assert "idempotent-replayed" not in zksync.headers  # forwarded, not ethereum's answer
        assert len(node.requests) == 2
        # Each network's price, each charged once; a retry on either replays its own.
        assert (ethereum.headers["x-venice-rpc-credits"],
                zksync.headers["x-venice-rpc-credits"]) == ("20", "30")
        again = _post(gw, "zksync-mainnet", body, "same-key")
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["x-venice-rpc-credits"] == "30"
        assert len(node.requests) == 2


def test_an_entry_is_gone_after_its_24_hours(tmp_path: Path, node: RpcNode,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch):
        for i in range(3):
            assert _post(gw, "ethereum-mainnet", call("eth_blockNumber"),
                         f"old-{i}").status_code == 200
        assert _kept(gw) == 3
        crypto = gw.services.crypto_rpc
        assert asyncio.run(crypto.sweep_idempotency()) == 0  # not old yet: kept
        crypto.clock = lambda: utcnow() + timedelta(hours=24, seconds=1)
        assert _post(gw, "ethereum-mainnet", call("eth_blockNumber"), "new").status_code == 200
        assert asyncio.run(crypto.sweep_idempotency()) == 3
        assert _kept(gw) == 1  # the new one stays
        # A retry of a swept key is a new request: forwarded and charged again.
        resp = _post(gw, "ethereum-mainnet", call("eth_blockNumber"), "old-0")
        assert resp.status_code == 200 and "idempotent-replayed" not in resp.headers
        assert len(node.requests) == 5


def test_an_answer_too_big_to_keep_is_answered_and_not_kept(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch, max_stored_bytes=200):
        small = _post(gw, "ethereum-mainnet", call("eth_chainId"), "small")
        # 100 answers of about 60 bytes: over the 200 kept.
        batch = [call("eth_blockNumber", id=i) for i in range(100)]
        big = _post(gw, "ethereum-mainnet", batch, "big")
        assert small.status_code == big.status_code == 200
        assert len(big.content) > 200 and len(big.json()) == 100
        assert _kept(gw) == 1  # the small one only
        retry = _post(gw, "ethereum-mainnet", batch, "big")
        assert retry.status_code == 200 and "idempotent-replayed" not in retry.headers
        assert retry.json() == big.json()
        assert len(node.requests) == 3  # the big one forwarded twice
        assert _post(gw, "ethereum-mainnet", call("eth_chainId"),
                     "small").headers["idempotent-replayed"] == "true"


def test_the_sweep_deletes_in_bounded_batches(tmp_path: Path, node: RpcNode,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch):
        for i in range(5):
            assert _post(gw, "solana-mainnet", {"jsonrpc": "2.0", "method": "getBalance",
                                                "params": ["x"], "id": i},
                         f"k{i}").status_code == 200
        later = utcnow() + timedelta(days=2)
        engine = make_engine(gw.settings.resolved_database_url)
        try:
            with Session(engine) as session:
                assert [idempotency.sweep(session, later, batch=2) for _ in range(4)] == [
                    2, 2, 1, 0]
                session.commit()
        finally:
            engine.dispose()
        assert _kept(gw) == 0
