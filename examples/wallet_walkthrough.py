"""A wallet with no account: top up 5 USD of credit with a signed USDC payment, then chat.

Start the platform with the development facilitator (it checks every signature but moves no
money) and a receiving wallet, then run this script:

    X402_FACILITATOR_URL=dev X402_PAY_TO_EVM=0x<your receiving address> make run
    .venv/bin/python examples/wallet_walkthrough.py [BASE_URL]

WALLET_KEY (a hex private key) picks the paying wallet; by default a new one is made.
It uses the x402 protocol's own Python client (`pip install "x402[evm,extensions,httpx]"`).
"""

from __future__ import annotations

import asyncio
import os
import sys

import httpx
from eth_account import Account
from x402 import x402Client
from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header
from x402.http.clients.httpx import x402HttpxClient
from x402.mechanisms.evm.exact.register import register_exact_evm_client

BASE = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/api/v1"
MODEL = os.environ.get("MODEL", "smollm2-135m-instruct")


async def sign_in(wallet, url: str, body: dict) -> dict[str, str]:
    """Ask once without credentials: the 402 carries a fresh sign-in challenge to sign."""
    async with httpx.AsyncClient() as http:
        asked = await http.post(url, json=body)
    challenge = asked.json()["extensions"]["sign-in-with-x"]
    info = {**challenge["info"], "chainId": "eip155:8453", "type": "eip191"}
    payload = await create_siwx_payload(info, wallet, url)
    return {"SIGN-IN-WITH-X": encode_siwx_header(payload)}


async def main() -> None:
    key = os.environ.get("WALLET_KEY")
    wallet = Account.from_key(key) if key else Account.create()
    print("wallet:", wallet.address)

    # 1. Top up: the client meets the 402, signs a USDC authorization for it, and retries.
    payer = x402Client()
    register_exact_evm_client(payer, wallet)
    payer.set_spend_controls(False)  # its default cap is 1 USD a payment
    async with x402HttpxClient(payer, timeout=60) as http:
        paid = await http.post(f"{BASE}/x402/top-up?amount=5")
    print("top-up:", paid.status_code, paid.json())

    # 2. Chat, signed in with the wallet (one signed sign-in per request).
    url = f"{BASE}/chat/completions"
    body = {"model": MODEL, "max_tokens": 32,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    headers = await sign_in(wallet, url, body)
    async with httpx.AsyncClient(timeout=120) as http:
        reply = await http.post(url, json=body, headers=headers)
    print("chat:", reply.json()["choices"][0]["message"]["content"])
    print("credit left (USD):", reply.headers["X-Balance-Remaining"])

    # 3. The wallet's own record, read with another sign-in.
    history_url = f"{BASE}/x402/transactions/{wallet.address}"
    headers = await sign_in(wallet, url, body)
    async with httpx.AsyncClient() as http:
        history = await http.get(history_url, headers=headers)
    for entry in history.json()["data"]["transactions"]:
        print(f"  {entry['type']:8} {entry['amount']:+.6f}  balance {entry['balanceAfter']:.6f}")


if __name__ == "__main__":
    asyncio.run(main())
