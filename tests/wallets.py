"""A wallet holder as the x402 protocol's own Python client makes one: it signs in with
SIGN-IN-WITH-X from the challenge of our 402 answers, and pays our top-up requirements.

Used by the unit tests (against the app in process) and the integration tests (against the
platform over HTTP); `http` is any client with httpx's `get`/`post`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from solders.keypair import Keypair
from x402 import x402ClientSync
from x402.extensions.sign_in_with_x import create_siwx_payload, encode_siwx_header
from x402.http.x402_http_client import x402HTTPClientSync
from x402.mechanisms.evm.exact.client import ExactEvmScheme
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.types import ExactEIP3009Authorization, ExactEIP3009Payload
from x402.mechanisms.svm.exact.register import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentRequirements

from serve_app.wallets.siwx import BASE_CHAIN_ID, SOLANA_MAINNET_CHAIN_ID


@dataclass
class Wallet:
    """One EVM or Solana wallet (`chain` is "evm" or "solana")."""

    chain: str = "evm"
    solana_rpc_url: str | None = None  # the SVM client reads the mint and a blockhash there
    evm: LocalAccount = field(default_factory=Account.create)
    solana: Keypair = field(default_factory=Keypair)

    @property
    def address(self) -> str:
        return self.evm.address if self.chain == "evm" else str(self.solana.pubkey())

    def _signer(self) -> Any:
        return self.evm if self.chain == "evm" else KeypairSigner(self.solana)

    def sign_in(self, challenge: dict, request_url: str) -> str:
        """A SIGN-IN-WITH-X header for the `sign-in-with-x` extension of a 402 answer."""
        chain_id, kind = ((BASE_CHAIN_ID, "eip191") if self.chain == "evm"
                          else (SOLANA_MAINNET_CHAIN_ID, "ed25519"))
        info = {**challenge["info"], "chainId": chain_id, "type": kind}
        payload = asyncio.run(create_siwx_payload(info, self._signer(), request_url))
        return encode_siwx_header(payload)

    def payment_client(self) -> x402HTTPClientSync:
        client = x402ClientSync()
        if self.chain == "evm":
            register_exact_evm_client(client, self.evm)
        else:
            register_exact_svm_client(client, KeypairSigner(self.solana),
                                      rpc_url=self.solana_rpc_url)
        client.set_spend_controls(False)  # top-ups are above its $1 default cap
        return x402HTTPClientSync(client)

    def pay(self, answer_402: Any, network: str) -> dict[str, str]:
        """The payment headers for our 402 answer, paying its entry on `network`."""
        http = self.payment_client()
        required = http.get_payment_required_response(answer_402.headers.get, answer_402.json())
        required.accepts = [a for a in required.accepts if a.network == network]
        payload = http.create_payment_payload(required)
        return http.encode_payment_signature_header(payload)

    def authorize(self, requirement: dict, *, valid_after: int, valid_before: int,
                  nonce: str | None = None) -> dict[str, str]:
        """Payment headers for a Base `accepts` entry: an EIP-3009 authorization with the
        validity window given (the protocol's client always signs `now + maxTimeoutSeconds`),
        signed with the protocol's own EVM scheme."""
        requirements = PaymentRequirements.model_validate(requirement)
        authorization = ExactEIP3009Authorization(
            from_address=self.evm.address, to=requirement["payTo"],
            value=requirement["amount"], valid_after=str(valid_after),
            valid_before=str(valid_before), nonce=nonce or "0x" + os.urandom(32).hex())
        signature = ExactEvmScheme(self.evm)._sign_authorization(authorization, requirements)
        inner = ExactEIP3009Payload(authorization=authorization, signature=signature)
        payload = {"x402Version": 2, "accepted": requirement, "payload": inner.to_dict()}
        return {"PAYMENT-SIGNATURE": base64.b64encode(json.dumps(payload).encode()).decode()}


def challenge_of(answer_402: Any) -> dict:
    return answer_402.json()["extensions"]["sign-in-with-x"]


def signed_in(http: Any, wallet: Wallet, url: str, ask: str | None = None) -> dict[str, str]:
    """Headers of one signed request to `url`: ask an inference route (`url` itself unless
    `ask` names another of the same origin) without credentials, and sign its challenge."""
    answer = http.post(ask or url, json={})
    assert answer.status_code == 402, answer.text
    return {"SIGN-IN-WITH-X": wallet.sign_in(challenge_of(answer), url)}
