"""Signing in with a wallet writes nothing but its expiring nonce: fresh keypairs with bodies
the route refuses, without funds, or reading their credit leave the accounts, holds, ledger
and payments as they were, and a replay is refused; the account is written at the first
top-up. A valid wallet header beside a Bearer key makes the wallet the caller; a bad one is a
401 whatever the key."""

from __future__ import annotations

import base64
import json

import pytest
from sqlalchemy import select

from serve_app.db.tables import Account as AccountRow
from serve_app.db.tables import LedgerEntry, Reservation, X402Payment
from tests.unit.conftest import Gateway
from tests.unit.wallets.wallet_gateway import (
    CALL,
    CHAT_URL,
    NANOS_PER_CALL,
    ORIGIN,
    RPC_URL,
    nanos,
    rpc_call,
    top_up,
)
from tests.wallets import Wallet, signed_in


def _books(gw: Gateway) -> dict[str, list]:
    """Every row a sign-in must not write: accounts, holds, ledger entries, payments."""
    with gw.services.engine.connect() as db:
        return {table: sorted(tuple(row) for row in db.execute(select(model)))
                for table, model in (("accounts", AccountRow), ("holds", Reservation),
                                     ("ledger", LedgerEntry), ("payments", X402Payment))}


SIGN_IN_ATTACKS = {  # what each fresh wallet sends, signed in: (method, url, body)
    "invalid rpc body": ("POST", RPC_URL, {"jsonrpc": "1.0"}),
    "invalid chat body": ("POST", CHAT_URL, {"messages": "not a list"}),
    "no funds": ("POST", RPC_URL, CALL),
    "balance read": ("GET", f"{ORIGIN}/api/v1/x402/balance/{{address}}", None),
    "transactions read": ("GET", f"{ORIGIN}/api/v1/x402/transactions/{{address}}", None),
}


def test_fresh_wallets_signing_in_write_no_account_and_a_replay_is_refused(
        each_db_gw: Gateway) -> None:
    """The attack: fresh keypairs sign in, one request each, with bodies the route refuses,
    with no funds, or to read their credit. Before: each made a permanent account row (and a
    write on the money thread) at sign-in. Now: nothing but the expiring nonce."""
    gw = each_db_gw
    before = _books(gw)
    answers: dict[str, list[int]] = {}
    replayable: tuple[str, str, dict] | None = None
    for name, (method, url, body) in SIGN_IN_ATTACKS.items():
        for _ in range(3):
            wallet = Wallet()
            target = url.format(address=wallet.address)
            headers = signed_in(gw.client, wallet, target, CHAT_URL)
            resp = gw.client.request(method, target, json=body, headers=headers)
            answers.setdefault(name, []).append(resp.status_code)
            if name == "balance read":
                data = resp.json()["data"]
                assert (data["balanceUsd"], data["canConsume"]) == (0, False)
                assert nanos(resp.headers["X-Balance-Remaining"]) == 0
            if name == "transactions read":
                data = resp.json()["data"]
                assert (data["currentBalance"], data["transactions"]) == (0, [])
            replayable = (method, target, headers)
    assert answers == {"invalid rpc body": [400] * 3, "invalid chat body": [400] * 3,
                       "no funds": [402] * 3, "balance read": [200] * 3,
                       "transactions read": [200] * 3}
    assert _books(gw) == before
    assert replayable is not None
    method, target, headers = replayable
    again = gw.client.request(method, target, headers=headers)
    assert again.status_code == 401
    assert again.json()["error"] == "This nonce has already been used"


def test_a_wallet_account_is_written_at_its_first_top_up(gw: Gateway) -> None:
    wallet = Wallet()
    assert rpc_call(gw, wallet).status_code == 402
    assert not [a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address]
    assert top_up(gw, wallet, "5").status_code == 200
    accounts = [a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address]
    assert len(accounts) == 1 and accounts[0]["kind"] == "WALLET"
    assert rpc_call(gw, wallet).status_code == 200  # the account signed in before pays


@pytest.mark.parametrize("bearer", ["a key of another account", "no key of ours"])
def test_a_wallet_header_beside_a_bearer_makes_the_wallet_the_caller(gw: Gateway,
                                                                      bearer: str) -> None:
    """Clients send their usual Authorization header to every route; with a valid
    SIGN-IN-WITH-X beside it, the wallet is the caller (and pays)."""
    wallet = Wallet()
    assert top_up(gw, wallet, "5").status_code == 200
    secret = gw.create_key()["apiKey"] if bearer.startswith("a key") else "sk-" + "x" * 40

    def both(url: str) -> dict[str, str]:
        return {**signed_in(gw.client, wallet, url, CHAT_URL),
                "Authorization": f"Bearer {secret}"}

    key_account = next(a for a in gw.cli("accounts") if a["id"] == gw.account_id)

    paid = gw.client.post(RPC_URL, json=CALL, headers=both(RPC_URL))

    assert paid.status_code == 200, paid.text
    left = 5 * 10**9 - NANOS_PER_CALL
    assert nanos(paid.headers["X-Balance-Remaining"]) == left
    assert paid.headers["x-ratelimit-type"] == "user"
    for route in ("balance", "transactions"):
        url = f"{ORIGIN}/api/v1/x402/{route}/{wallet.address}"
        read = gw.client.get(url, headers=both(url))
        assert read.status_code == 200, read.text
        assert read.json()["data"]["walletAddress"] == wallet.address
        assert nanos(read.headers["X-Balance-Remaining"]) == left
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert nanos(account["usd"]) == left
    assert next(a for a in gw.cli("accounts") if a["id"] == gw.account_id) == key_account


def test_a_bad_wallet_header_is_a_401_whatever_the_bearer_key(gw: Gateway) -> None:
    wallet = Wallet()
    header = signed_in(gw.client, wallet, RPC_URL, CHAT_URL)["SIGN-IN-WITH-X"]
    fields = json.loads(base64.b64decode(header + "=="))
    fields["nonce"] = "0123456789abcdef"  # the signature no longer matches
    forged = base64.b64encode(json.dumps(fields).encode()).decode()
    headers = {"SIGN-IN-WITH-X": forged, **gw.auth()}  # the operator's own ADMIN key
    key_account = next(a for a in gw.cli("accounts") if a["id"] == gw.account_id)
    for method, url, body in (("POST", RPC_URL, CALL), ("POST", CHAT_URL, {}),
                              ("GET", f"/api/v1/x402/balance/{wallet.address}", None),
                              ("GET", f"/api/v1/x402/transactions/{wallet.address}", None)):
        resp = gw.client.request(method, url, json=body, headers=headers)
        assert resp.status_code == 401, (url, resp.text)
        assert resp.json()["code"] == "AUTHENTICATION_FAILED"
    assert next(a for a in gw.cli("accounts") if a["id"] == gw.account_id) == key_account
