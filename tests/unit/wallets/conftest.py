"""Fixtures of the in-process wallet tests: the development facilitator and a fake Solana
node on loopback sockets, a fake JSON-RPC node, and the wallet gateway (wallet_gateway.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.wallets.x402 import dev_facilitator
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.wallets.wallet_gateway import wallet_settings
from tests.x402_fakes import FakeSolanaRpc


@pytest.fixture(scope="module")
def facilitator() -> Iterator[str]:
    url, stop = dev_facilitator.start_in_thread()
    yield url
    stop()


@pytest.fixture(scope="module")
def solana_rpc() -> Iterator[FakeSolanaRpc]:
    with FakeSolanaRpc() as node:
        yield node


@pytest.fixture
def node() -> Iterator[RpcNode]:
    with RpcNode() as running:
        yield running


@pytest.fixture
def gw(tmp_path: Path, node: RpcNode, facilitator: str) -> Iterator[Gateway]:
    yield from make_gateway(wallet_settings(tmp_path, node, facilitator))


@pytest.fixture
def each_db_gw(database_url: str, tmp_path: Path, node: RpcNode,
               facilitator: str) -> Iterator[Gateway]:
    """The wallet gateway on SQLite and on PostgreSQL (nonces, claims and row locks)."""
    yield from make_gateway(wallet_settings(tmp_path, node, facilitator,
                                            database_url=database_url))
