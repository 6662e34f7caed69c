"""Wallets signed in with SIGN-IN-WITH-X through every flow: a wallet without an account row
gets its 402 before any model is called with nothing written (no account, hold or charge);
a wallet with credit is charged like a key, its ledger entry naming the wallet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from serve_app.db.tables import Account, LedgerEntry
from serve_app.settings import Settings
from tests.fakes import DeploymentHandle
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.books import Books, per_million
from tests.unit.flows.test_payment_required import FLOWS
from tests.wallets import Wallet, signed_in

ORIGIN = "http://testserver/api/v1"


@pytest.fixture
def wallet_gateway(tmp_path: Path, gateway_catalog: Path,
                   fakes: dict[str, DeploymentHandle]) -> Iterator[Gateway]:
    """The fake-deployment gateway, accepting sign-ins for the test client's host."""
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     model_catalog=gateway_catalog, siwx_domains="testserver",
                                     rate_limit_backend="local"), handles=fakes)


@pytest.fixture
def wallet_books(wallet_gateway: Gateway) -> Iterator[Books]:
    books = Books(wallet_gateway)
    yield books
    books.close()


def _accounts(gateway: Gateway) -> list[tuple]:
    with gateway.services.engine.connect() as db:
        return sorted(tuple(row) for row in db.execute(select(Account)))


@pytest.mark.parametrize("flow", FLOWS)
def test_a_wallet_without_an_account_gets_402_and_nothing_is_written(
        wallet_gateway, fakes, wallet_books, flow):
    deployment, path, body = FLOWS[flow]
    before = _accounts(wallet_gateway)
    headers = signed_in(wallet_gateway.client, Wallet(), f"{ORIGIN}{path}",
                        f"{ORIGIN}/chat/completions")

    resp = wallet_gateway.client.post(f"/api/v1{path}", headers=headers, json=body)

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "PAYMENT_REQUIRED"
    assert resp.json()["currentBalanceUsd"] == 0
    assert fakes[deployment].calls == []
    assert wallet_books.entries() == 0 and wallet_books.open_holds() == 0
    assert _accounts(wallet_gateway) == before


def test_a_wallet_with_credit_is_charged_for_its_embeddings(wallet_gateway, wallet_books):
    wallet = Wallet()
    staked = wallet_gateway.cli("stake", "--wallet", wallet.address, "--tokens", "2")
    url = f"{ORIGIN}/embeddings"
    headers = signed_in(wallet_gateway.client, wallet, url, f"{ORIGIN}/chat/completions")

    resp = wallet_gateway.client.post(url, headers=headers,
                                      json={"model": "embed-small", "input": "hello there"})

    assert resp.status_code == 200, resp.text
    tokens = resp.json()["usage"]["prompt_tokens"]
    charge = wallet_books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {"input": (tokens, per_million(5, tokens))}
    assert wallet_books.balance_nanos(staked["id"]) == 2 * 10**9 - charge.total_nanos
    with wallet_gateway.services.engine.connect() as db:
        payer = db.execute(select(LedgerEntry.wallet_address, LedgerEntry.api_key_id).where(
            LedgerEntry.request_id == resp.headers["cf-ray"])).one()
    assert tuple(payer) == (wallet.address, None)


def test_a_bearer_key_beside_a_wallet_sign_in_leaves_the_wallet_paying(wallet_gateway,
                                                                        wallet_books):
    """A client that sends its usual Authorization header with a valid SIGN-IN-WITH-X: the
    wallet is the caller, and the key's account is not charged."""
    wallet = Wallet()
    staked = wallet_gateway.cli("stake", "--wallet", wallet.address, "--tokens", "2")
    key = wallet_gateway.create_key()["apiKey"]
    key_balance = wallet_books.balance_nanos()
    url = f"{ORIGIN}/embeddings"
    headers = {**signed_in(wallet_gateway.client, wallet, url, f"{ORIGIN}/chat/completions"),
               **wallet_gateway.auth(key)}

    resp = wallet_gateway.client.post(url, headers=headers,
                                      json={"model": "embed-small", "input": "hello there"})

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-ratelimit-type"] == "user"
    charge = wallet_books.only_charge(resp.headers["cf-ray"])
    assert wallet_books.balance_nanos(staked["id"]) == 2 * 10**9 - charge.total_nanos
    assert wallet_books.balance_nanos() == key_balance
