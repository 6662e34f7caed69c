"""A wallet on the running platform: the x402 protocol's own httpx client tops it up against
the development facilitator (its own server), then the wallet chats with SIGN-IN-WITH-X on
another Gateway replica, and the ledger matches the tokens to the nano-dollar."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
from x402 import x402Client
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.exact.register import register_exact_evm_client

from tests.integration.conftest import ADMIN_KEY, SIWX_DOMAIN
from tests.wallets import Wallet, challenge_of

CHAT = {"model": "tiny-chat", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Count to three."}]}


def nanos(value: float | str) -> int:
    return int(Decimal(str(value)) * 10**9)


async def top_up_with_the_x402_client(wallet: Wallet, url: str) -> httpx.Response:
    client = x402Client()
    register_exact_evm_client(client, wallet.evm)
    client.set_spend_controls(False)  # a top-up is above its $1 default cap
    async with x402HttpxClient(client, timeout=60) as http:
        return await http.post(url)


def sign_in(wallet: Wallet, answer_402: httpx.Response) -> dict[str, str]:
    challenge = challenge_of(answer_402)
    assert challenge["info"]["domain"] == SIWX_DOMAIN
    return {"SIGN-IN-WITH-X": wallet.sign_in(challenge, challenge["info"]["uri"])}


def test_a_wallet_tops_up_with_the_x402_client_and_pays_for_chat(platform):
    first, second = platform.replica_urls
    wallet = Wallet()
    paid = asyncio.run(top_up_with_the_x402_client(wallet, f"{first}/x402/top-up"))
    assert paid.status_code == 200, paid.text
    assert paid.json()["data"] == {**paid.json()["data"], "walletAddress": wallet.address,
                                   "amountCredited": 5, "newBalance": 5}
    assert paid.headers["PAYMENT-RESPONSE"]

    chat_url = f"{second}/chat/completions"
    asked = httpx.post(chat_url, json=CHAT)
    assert asked.status_code == 402 and asked.headers["PAYMENT-REQUIRED"]
    resp = httpx.post(chat_url, json=CHAT, headers=sign_in(wallet, asked), timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-ratelimit-type"] == "user"
    usage = resp.json()["usage"]
    # tiny-chat: 0.02 USD per million input tokens, 0.04 per million output tokens.
    cost = usage["prompt_tokens"] * 20 + usage["completion_tokens"] * 40
    # The header is USD with 6 decimals, as published ("4.230000").
    assert resp.headers["X-Balance-Remaining"] == f"{Decimal(5 * 10**9 - cost) / 10**9:.6f}"

    history = httpx.get(f"{first}/x402/transactions/{wallet.address}",
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()["data"]
    assert nanos(history["currentBalance"]) == 5 * 10**9 - cost
    charge, top_up = history["transactions"]
    assert (charge["type"], nanos(-charge["amount"]), charge["modelId"]) == (
        "CHARGE", cost, "tiny-chat")
    assert (top_up["type"], top_up["amount"], top_up["balanceAfter"]) == ("TOP_UP", 5, 5)


def test_a_signed_sign_in_is_good_for_one_request_on_any_replica(platform):
    first, second = platform.replica_urls
    wallet = Wallet()
    asked = httpx.post(f"{first}/chat/completions", json=CHAT)
    headers = sign_in(wallet, asked)
    once = httpx.post(f"{first}/chat/completions", json=CHAT, headers=headers)
    assert once.status_code == 402 and once.json()["code"] == "PAYMENT_REQUIRED"  # no credit
    replayed = httpx.post(f"{second}/chat/completions", json=CHAT, headers=headers)
    assert replayed.status_code == 401
    assert replayed.json()["error"] == "This nonce has already been used"


def test_the_openai_sdk_pays_with_a_wallet_beside_its_api_key(platform):
    """The `openai` SDK always sends `Authorization: Bearer <api_key>`: with a wallet's
    SIGN-IN-WITH-X beside it, the wallet is the caller and pays."""
    from openai import OpenAI

    first, second = platform.replica_urls
    wallet = Wallet()
    paid = asyncio.run(top_up_with_the_x402_client(wallet, f"{first}/x402/top-up"))
    assert paid.status_code == 200, paid.text
    asked = httpx.post(f"{second}/chat/completions", json=CHAT)
    sdk = OpenAI(base_url=second, api_key="sk-the-sdk-insists-on-a-key", max_retries=0,
                 timeout=120, default_headers=sign_in(wallet, asked))

    raw = sdk.chat.completions.with_raw_response.create(**CHAT)

    usage = raw.parse().usage
    assert raw.headers["x-ratelimit-type"] == "user"
    cost = usage.prompt_tokens * 20 + usage.completion_tokens * 40
    assert raw.headers["X-Balance-Remaining"] == f"{Decimal(5 * 10**9 - cost) / 10**9:.6f}"
