"""Wallet access in process: SIGN-IN-WITH-X on an inference route, the 402 answers, x402
top-ups through the development facilitator (its own HTTP server on a loopback socket), the
wallet's balance and transactions, staking credit. The paid route is the crypto JSON-RPC
proxy, pointed at a fake node (tests/rpc_node.py); chat paid by a wallet is in
tests/integration/test_wallets.py."""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy import update

from serve_app.db.tables import Account as AccountRow
from serve_app.wallets.topups import TOP_UPS_PER_MINUTE
from serve_app.wallets.x402 import BASE_NETWORK, BASE_USDC, SOLANA_NETWORK, dev_facilitator
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.wallets.wallet_gateway import (
    CALL,
    CHAT_URL,
    NANOS_PER_CALL,
    RPC_URL,
    TOP_UP,
    nanos,
    rpc_call,
    top_up,
    wallet_settings,
)
from tests.wallets import Wallet, challenge_of, signed_in
from tests.x402_fakes import FakeSolanaRpc

# --- the 402 answers --------------------------------------------------------------------------


def test_no_credentials_get_the_discovery_402_with_its_header(gw: Gateway) -> None:
    resp = gw.client.post(CHAT_URL, json={"model": "x", "messages": []})
    assert resp.status_code == 402
    body = resp.json()
    assert set(body) == {"x402Version", "error", "resource", "accepts", "extensions",
                         "authOptions"}
    assert body["x402Version"] == 2
    assert body["resource"] == {"url": CHAT_URL, "description": "Inference API",
                                "mimeType": "application/json"}
    networks = {entry["network"]: entry for entry in body["accepts"]}
    assert set(networks) == {BASE_NETWORK, SOLANA_NETWORK}
    base = networks[BASE_NETWORK]
    assert (base["scheme"], base["asset"], base["amount"]) == ("exact", BASE_USDC, "10000000")
    assert networks[SOLANA_NETWORK]["extra"]["feePayer"] == dev_facilitator.DEV_SOLANA_FEE_PAYER
    info = body["extensions"]["sign-in-with-x"]["info"]
    assert info["domain"] == "testserver" and len(info["nonce"]) == 16
    assert body["authOptions"]["x402Wallet"]["legacyHeader"] == "X-Sign-In-With-X"
    header = json.loads(base64.b64decode(resp.headers["PAYMENT-REQUIRED"]))
    assert header["accepts"] == body["accepts"] and header["x402Version"] == 2
    # The crypto proxy is not an inference route: no credentials is a 401 there, as published.
    assert gw.client.post(RPC_URL, json=CALL).status_code == 401


def test_a_wallet_without_credit_gets_payment_required_with_instructions(gw: Gateway) -> None:
    wallet = Wallet()
    resp = rpc_call(gw, wallet)
    assert resp.status_code == 402
    body = resp.json()
    assert (body["error"], body["code"], body["reason"]) == (
        "Payment required", "PAYMENT_REQUIRED", "insufficient_balance")
    assert body["currentBalanceUsd"] == 0 and body["minimumBalanceUsd"] > 0
    assert body["minimumTopUpUsd"] == 5 and body["supportedTokens"] == ["USDC"]
    assert body["supportedChains"] == ["base", "solana"]
    assert body["topUpInstructions"]["tokenAddress"] == BASE_USDC
    assert len(body["siwxChallenge"]["info"]["nonce"]) == 16
    assert {c["type"] for c in body["siwxChallenge"]["supportedChains"]} == {"eip191", "ed25519"}
    assert resp.headers["PAYMENT-REQUIRED"]


def test_a_key_account_without_balance_keeps_insufficient_balance(
        tmp_path: Path, node: RpcNode, facilitator: str) -> None:
    for gw in make_gateway(wallet_settings(tmp_path, node, facilitator, initial_credit_usd=0)):
        resp = gw.client.post(RPC_URL, json=CALL, headers=gw.auth())
        assert resp.status_code == 402
        assert resp.json()["code"] == "INSUFFICIENT_BALANCE"


# --- sign-in ----------------------------------------------------------------------------------


def test_the_legacy_header_name_signs_in_too(gw: Gateway) -> None:
    wallet = Wallet()
    headers = signed_in(gw.client, wallet, RPC_URL, CHAT_URL)
    resp = gw.client.post(RPC_URL, json=CALL,
                          headers={"X-Sign-In-With-X": headers["SIGN-IN-WITH-X"]})
    assert resp.status_code == 402 and resp.json()["code"] == "PAYMENT_REQUIRED"


@pytest.mark.parametrize("problem", ["other-domain", "forged", "garbage"])
def test_bad_sign_ins_are_refused_with_401_and_charge_nothing(gw: Gateway,
                                                              problem: str) -> None:
    wallet = Wallet()
    gw.cli("stake", "--wallet", wallet.address, "--tokens", "5")
    answer = gw.client.post(CHAT_URL, json={})
    challenge = challenge_of(answer)
    if problem == "other-domain":
        challenge = {**challenge, "info": {**challenge["info"], "domain": "evil.example",
                                           "uri": "https://evil.example/api/v1"}}
        header = wallet.sign_in(challenge, "https://evil.example/api/v1")
    else:
        header = wallet.sign_in(challenge, RPC_URL)
        if problem == "forged":
            fields = json.loads(base64.b64decode(header + "=="))
            fields["nonce"] = "0123456789abcdef"  # the signature no longer matches
            header = base64.b64encode(json.dumps(fields).encode()).decode()
        else:
            header = "not base64 !"
    resp = gw.client.post(RPC_URL, json=CALL, headers={"SIGN-IN-WITH-X": header})
    assert resp.status_code == 401
    assert resp.json()["code"] == "AUTHENTICATION_FAILED"
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert account["usd"] == 0 and account["diem"] == 0  # never touched (DIEM resets daily)


# --- top-ups ----------------------------------------------------------------------------------


def test_top_up_requirements_and_their_amount(gw: Gateway) -> None:
    resp = gw.client.post(TOP_UP)
    assert resp.status_code == 402
    assert set(resp.json()) == {"x402Version", "accepts"}
    assert {a["amount"] for a in resp.json()["accepts"]} == {"5000000"}
    assert gw.client.post(f"{TOP_UP}?amount=12.5").json()["accepts"][0]["amount"] == "12500000"
    for bad in ("4.99", "10001", "abc"):
        refused = gw.client.post(f"{TOP_UP}?amount={bad}")
        assert refused.status_code == 400 and "amount" in refused.json()["details"]


@pytest.mark.parametrize("chain", ["evm", "solana"])
def test_top_up_credits_the_payer_and_answers_payment_response(
        gw: Gateway, solana_rpc: FakeSolanaRpc, chain: str) -> None:
    wallet = Wallet(chain=chain, solana_rpc_url=solana_rpc.url)
    network = BASE_NETWORK if chain == "evm" else SOLANA_NETWORK
    resp = top_up(gw, wallet, "7.25", network)
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert (data["walletAddress"], data["amountCredited"], data["newBalance"]) == (
        wallet.address, 7.25, 7.25)
    receipt = json.loads(base64.b64decode(resp.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] is True and receipt["network"] == network
    assert receipt["payer"] == wallet.address and receipt["transaction"]


def test_the_same_payment_twice_or_concurrently_credits_once(each_db_gw: Gateway) -> None:
    gw = each_db_gw
    wallet = Wallet()
    asked = gw.client.post(f"{TOP_UP}?amount=5")
    headers = wallet.pay(asked, BASE_NETWORK)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: gw.client.post(TOP_UP, headers=headers), range(4)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 409, 409, 409], [a.text for a in answers]
    later = gw.client.post(TOP_UP, headers={"X-PAYMENT": headers["PAYMENT-SIGNATURE"]})
    assert later.status_code == 409
    assert later.json()["error"] == "X402_PAYMENT_ALREADY_USED"
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert account["usd"] == 5


def test_a_top_up_authorized_longer_than_max_timeout_seconds_is_credited(gw: Gateway) -> None:
    """validAfter 0 and validBefore now + 600 against our maxTimeoutSeconds of 300: valid
    now, so credited; one valid for more than an hour is refused, naming the bound."""
    wallet = Wallet()
    (requirement,) = [a for a in gw.client.post(f"{TOP_UP}?amount=5").json()["accepts"]
                      if a["network"] == BASE_NETWORK]
    assert requirement["maxTimeoutSeconds"] == 300
    now = int(time.time())

    paid = gw.client.post(TOP_UP, headers=wallet.authorize(
        requirement, valid_after=0, valid_before=now + 600))

    assert paid.status_code == 200, paid.text
    assert paid.json()["data"]["amountCredited"] == 5
    too_long = gw.client.post(TOP_UP, headers=wallet.authorize(
        requirement, valid_after=0, valid_before=now + 2 * 3600))
    assert too_long.status_code == 400
    assert too_long.json()["details"]["reason"] == "timeout_too_long"
    assert "3600 seconds" in too_long.json()["message"]
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert account["usd"] == 5


def test_a_payment_that_does_not_match_our_requirements_is_refused(gw: Gateway) -> None:
    wallet = Wallet()
    asked = gw.client.post(TOP_UP)
    required = json.loads(base64.b64decode(asked.headers["PAYMENT-REQUIRED"]))
    required["accepts"][0]["payTo"] = Account.create().address  # pay someone else
    other = type(asked)(402, json=asked.json(), headers={
        "PAYMENT-REQUIRED": base64.b64encode(json.dumps(required).encode()).decode()})
    resp = gw.client.post(TOP_UP, headers=wallet.pay(other, BASE_NETWORK))
    assert resp.status_code == 400
    assert resp.json()["error"] == "X402_INVALID_PAYMENT"
    assert not [a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address]


def test_a_facilitator_that_is_down_credits_nothing(tmp_path: Path, node: RpcNode) -> None:
    settings = wallet_settings(tmp_path, node, "http://127.0.0.1:9")  # discard port: refused
    for gw in make_gateway(settings):
        wallet = Wallet()
        resp = top_up(gw, wallet, "5")
        assert resp.status_code == 502
        assert "facilitator" in resp.json()["error"].lower()
        assert not [a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address]


def test_top_ups_answer_503_when_no_facilitator_is_set(tmp_path: Path, node: RpcNode) -> None:
    for gw in make_gateway(wallet_settings(tmp_path, node, None)):
        resp = gw.client.post(TOP_UP)
        assert resp.status_code == 503
        assert "X402_FACILITATOR_URL" in resp.json()["error"]


def test_dev_facilitator_is_refused_off_loopback(tmp_path: Path, node: RpcNode) -> None:
    with pytest.raises(ValueError, match="loopback"):
        for _ in make_gateway(wallet_settings(tmp_path, node, "dev", host="0.0.0.0")):
            pass


# --- paying with credit -------------------------------------------------------------------------


@pytest.mark.parametrize("chain", ["evm", "solana"])
def test_a_wallet_pays_from_its_credit_with_balance_headers(
        gw: Gateway, solana_rpc: FakeSolanaRpc, chain: str) -> None:
    wallet = Wallet(chain=chain, solana_rpc_url=solana_rpc.url)
    network = BASE_NETWORK if chain == "evm" else SOLANA_NETWORK
    assert top_up(gw, wallet, "5", network).status_code == 200
    resp = rpc_call(gw, wallet)
    assert resp.status_code == 200, resp.text
    assert nanos(resp.headers["x-service-balance-usd"]) == 5 * 10**9  # before the call
    remaining = 5 * 10**9 - NANOS_PER_CALL
    assert nanos(resp.headers["X-Balance-Remaining"]) == remaining
    balance = gw.client.get(f"/api/v1/x402/balance/{wallet.address}",
                            headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))
    assert balance.status_code == 200, balance.text
    assert nanos(balance.json()["data"]["balanceUsd"]) == remaining
    assert nanos(balance.headers["X-Balance-Remaining"]) == remaining
    assert balance.json()["data"]["canConsume"] is True


def test_concurrent_charges_never_overdraw_a_wallet(each_db_gw: Gateway) -> None:
    gw = each_db_gw
    gw.services.wallets.in_flight.limit = 8  # all eight in flight at once: the balance decides
    wallet = Wallet()
    assert top_up(gw, wallet, "5").status_code == 200
    # Leave credit for exactly three calls (and 1000 nanos more).
    with gw.services.engine.begin() as db:
        db.execute(update(AccountRow).where(AccountRow.wallet_address == wallet.address)
                   .values(usd_balance_nanos=3 * NANOS_PER_CALL + 1000))
    headers = [signed_in(gw.client, wallet, RPC_URL, CHAT_URL) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda h: gw.client.post(RPC_URL, json=CALL, headers=h), headers))
    paid = [a for a in answers if a.status_code == 200]
    assert len(paid) == 3, [a.status_code for a in answers]
    assert {a.status_code for a in answers if a not in paid} == {402}
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert nanos(account["usd"]) == 1000


def test_transactions_list_top_ups_and_charges_with_balances(gw: Gateway) -> None:
    wallet = Wallet()
    assert top_up(gw, wallet, "5").status_code == 200
    for _ in range(2):
        assert rpc_call(gw, wallet).status_code == 200
    resp = gw.client.get(f"/api/v1/x402/transactions/{wallet.address}?limit=2",
                         headers=signed_in(gw.client, wallet, RPC_URL, CHAT_URL))
    assert resp.status_code == 200, resp.text
    data = resp.json()["data"]
    assert data["walletAddress"] == wallet.address
    assert nanos(data["currentBalance"]) == 5 * 10**9 - 2 * NANOS_PER_CALL
    assert [t["type"] for t in data["transactions"]] == ["CHARGE", "CHARGE"]
    assert data["pagination"] == {"limit": 2, "offset": 0, "hasMore": True}
    newest = data["transactions"][0]
    assert nanos(newest["balanceAfter"]) == nanos(data["currentBalance"])
    assert newest["modelId"] == "crypto-rpc-ethereum-mainnet" and newest["requestId"]
    rest = gw.client.get(f"/api/v1/x402/transactions/{wallet.address}?offset=2",
                         headers=gw.auth()).json()["data"]  # the operator's admin key
    assert [t["type"] for t in rest["transactions"]] == ["TOP_UP"]
    assert rest["transactions"][0]["amount"] == 5 and rest["transactions"][0]["balanceAfter"] == 5


def test_wallet_records_are_closed_to_others(gw: Gateway) -> None:
    wallet, other = Wallet(), Wallet()
    url = f"/api/v1/x402/balance/{wallet.address}"
    assert gw.client.get(url).status_code == 401
    resp = gw.client.get(url, headers=signed_in(gw.client, other, RPC_URL, CHAT_URL))
    assert resp.status_code == 403
    inference = gw.create_key()["apiKey"]
    assert gw.client.get(url, headers=gw.auth(inference)).status_code == 401
    assert gw.client.get("/api/v1/x402/balance/not-an-address",
                         headers=gw.auth()).status_code == 400


def test_staked_tokens_give_a_wallet_daily_credit(gw: Gateway) -> None:
    wallet = Wallet()
    gw.cli("stake", "--wallet", wallet.address, "--tokens", "3")
    resp = rpc_call(gw, wallet)
    assert resp.status_code == 200, resp.text  # paid from DIEM: 3 USD of credit today
    balance = gw.client.get(f"/api/v1/x402/balance/{wallet.address}",
                            headers=gw.auth()).json()["data"]
    assert balance["balanceUsd"] == 0
    assert nanos(balance["diemBalanceUsd"]) == 3 * 10**9 - NANOS_PER_CALL


def test_a_sign_in_for_another_site_is_refused_whatever_the_host_header(gw: Gateway) -> None:
    wallet = Wallet()
    challenge = challenge_of(gw.client.post(CHAT_URL, json={}))
    elsewhere = {**challenge, "info": {**challenge["info"], "domain": "other.example",
                                       "uri": "https://other.example/api/v1"}}
    header = wallet.sign_in(elsewhere, "https://other.example/api/v1")
    resp = gw.client.post(RPC_URL, json=CALL, headers={"SIGN-IN-WITH-X": header,
                                                       "Host": "other.example"})
    assert resp.status_code == 401
    assert "domain" in resp.json()["error"]


def test_an_admin_key_of_another_account_cannot_read_a_wallet(gw: Gateway) -> None:
    wallet = Wallet()
    other_admin = gw.cli("create-account", "--usd", "1")["apiKey"]
    resp = gw.client.get(f"/api/v1/x402/balance/{wallet.address}", headers=gw.auth(other_admin))
    assert resp.status_code == 403


def test_absurd_top_up_amounts_are_400s(gw: Gateway) -> None:
    for amount in ("1e1000000", "1e999990", "-5", "5.0000001", "NaN"):
        resp = gw.client.post(f"{TOP_UP}?amount={amount}")
        assert resp.status_code == 400, (amount, resp.text)


def test_a_wallet_path_with_a_newline_is_a_400(gw: Gateway) -> None:
    address = Wallet().address
    resp = gw.client.get(f"/api/v1/x402/balance/{address}%0A", headers=gw.auth())
    assert resp.status_code == 400


def test_pending_payments_are_resolved_by_the_operator(tmp_path: Path, node: RpcNode) -> None:
    """A facilitator that is down leaves no claim; one the operator resolves is credited."""
    for gw in make_gateway(wallet_settings(tmp_path, node, "http://127.0.0.1:9")):
        assert gw.cli("pending-payments") == []
        with pytest.raises(SystemExit, match="no PENDING payment"):
            gw.cli("resolve-payment", "nope", "--drop")


def test_top_up_attempts_are_capped_per_payer_and_a_refused_payment_stays_usable(
        tmp_path: Path, node: RpcNode, facilitator: str) -> None:
    """The attack: one payer floods /x402/top-up (each attempt claims a row and calls the
    facilitator), here with replays of a payment already credited (from one client address,
    whose own cap is raised here: the payer's is under test)."""
    settings = wallet_settings(tmp_path, node, facilitator,
                               x402_top_ups_per_client_per_minute=100)
    for gw in make_gateway(settings):
        _cap_per_payer(gw)


def _cap_per_payer(gw: Gateway) -> None:
    wallet, other = Wallet(), Wallet()
    asked = gw.client.post(f"{TOP_UP}?amount=5")
    spent = wallet.pay(asked, BASE_NETWORK)
    assert gw.client.post(TOP_UP, headers=spent).status_code == 200
    for _ in range(TOP_UPS_PER_MINUTE - 1):
        assert gw.client.post(TOP_UP, headers=spent).status_code == 409
    fresh = wallet.pay(gw.client.post(f"{TOP_UP}?amount=5"), BASE_NETWORK)

    resp = gw.client.post(TOP_UP, headers=fresh)

    assert resp.status_code == 429, resp.text
    assert resp.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert 1 <= int(resp.headers["Retry-After"]) <= 60
    assert gw.client.post(TOP_UP, headers=spent).status_code == 429  # replays too
    assert not gw.cli("pending-payments")  # nothing claimed
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert account["usd"] == 5
    # another payer is not throttled by it
    assert top_up(gw, other, "5").status_code == 200
    # a minute later the refused payment is still good, and credited once
    limits = gw.services.limits
    real_clock = limits.clock
    limits.clock = lambda: real_clock() + 61
    assert gw.client.post(TOP_UP, headers=fresh).status_code == 200
    account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert account["usd"] == 10
