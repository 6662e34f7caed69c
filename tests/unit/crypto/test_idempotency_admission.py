"""An Idempotency-Key costs a refused caller nothing (issue 25, item 5): the key is claimed
only once the caller is admitted (the per-minute and daily caps, then the hold), so a 429 or a
402, a fresh wallet's included, writes no Idempotency-Key row and adds no money-writer
operation (it claimed and dropped the key on the money writer first). A retry of a finished
call is still replayed without being counted again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine
from sqlmodel import Session

from serve_app.db.engine import make_engine
from serve_app.db.tables import Account
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.crypto.test_crypto_rpc import RPC, call, post, rpc_gateway
from tests.unit.wallets.wallet_gateway import CALL, CHAT_URL, RPC_URL, wallet_settings
from tests.wallets import Wallet, signed_in


@pytest.fixture
def node() -> Iterator[RpcNode]:
    with RpcNode() as running:
        yield running


@contextmanager
def money_operations(writer: Any) -> Iterator[list[str]]:
    """The money-writer operations requests asked for meanwhile, by name; the billing
    heartbeat (a background beat that may land at any moment) is left out."""
    asked: list[str] = []
    seen: list[Callable] = []  # `run` queues through `submit`: one operation, seen twice
    run, submit = writer.run, writer.submit

    def note(op: Callable) -> None:
        if not op.__qualname__.startswith("Billing.beat") and \
                not any(op is other for other in seen):
            seen.append(op)
            asked.append(op.__qualname__)

    async def counted_run(op: Callable, **kwargs: Any) -> Any:
        note(op)
        return await run(op, **kwargs)

    def counted_submit(op: Callable) -> Any:
        note(op)
        return submit(op)

    writer.run, writer.submit = counted_run, counted_submit
    try:
        yield asked
    finally:
        del writer.run, writer.submit


@contextmanager
def idempotency_writes() -> Iterator[list[str]]:
    """The statements that write the Idempotency-Key table, on any engine, meanwhile."""
    seen: list[str] = []

    def record(conn, cursor, statement: str, *args) -> None:
        words = statement.lstrip().split(None, 1)
        if "rpc_idempotency" in statement and words and \
                words[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            seen.append(statement)

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def _post(gw: Gateway, body, key: str, api_key: str | None = None):
    return gw.client.post(f"{RPC}/ethereum-mainnet", json=body,
                          headers={**gw.auth(api_key), "Idempotency-Key": key})


def test_a_caller_over_its_request_cap_writes_nothing_and_a_retry_is_still_replayed(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch,
                          limits={"requests_per_minute": 1, "credits_per_day": 1000}):
        first = _post(gw, call("eth_chainId"), "first")
        assert first.status_code == 200, first.text
        with idempotency_writes() as writes, \
                money_operations(gw.services.billing.writer) as operations:
            refused = [_post(gw, call("eth_chainId", id=i), f"fresh-{i}") for i in range(5)]
            retried = _post(gw, call("eth_chainId"), "first")

        assert [r.status_code for r in refused] == [429] * 5
        assert writes == []  # was: a claim and its drop for each refusal
        assert operations == []  # was: 2 money-writer operations each
        assert retried.status_code == 200 and retried.headers["idempotent-replayed"] == "true"
        assert retried.json() == first.json() and len(node.requests) == 1


def test_a_caller_without_balance_writes_no_idempotency_key(
        tmp_path: Path, node: RpcNode, monkeypatch: pytest.MonkeyPatch) -> None:
    for gw in rpc_gateway(tmp_path, node, monkeypatch, initial_credit_usd=0):
        writer = gw.services.billing.writer
        assert post(gw, "ethereum-mainnet", call("eth_blockNumber")).status_code == 402
        with money_operations(writer) as without_key:
            plain = post(gw, "ethereum-mainnet", call("eth_blockNumber"))
        with idempotency_writes() as writes, money_operations(writer) as with_key:
            resp = _post(gw, call("eth_blockNumber"), "broke-1")

        assert plain.status_code == resp.status_code == 402, resp.text
        assert writes == []
        assert with_key == without_key  # the key adds no money-writer operation (it added 2)
        assert node.requests == []


def test_a_fresh_wallet_writes_no_idempotency_key_and_no_account(tmp_path: Path,
                                                                  node: RpcNode) -> None:
    for gw in make_gateway(wallet_settings(tmp_path, node, None)):
        wallet = Wallet()
        headers = {**signed_in(gw.client, wallet, RPC_URL, CHAT_URL),
                   "Idempotency-Key": "wallet-1"}
        with idempotency_writes() as writes:
            resp = gw.client.post(RPC_URL, json=CALL, headers=headers)

        assert resp.status_code == 402, resp.text
        assert resp.json()["reason"] == "insufficient_balance"
        assert writes == []  # was: a claim row for an account that does not exist, dropped
        engine = make_engine(gw.settings.resolved_database_url)
        with Session(engine) as session:
            accounts = session.execute(select(func.count()).select_from(Account)).scalar_one()
        engine.dispose()
        assert accounts == 1  # the operator's, no row for the wallet
        assert node.requests == []
