"""The wallet gateway of the in-process wallet tests: its settings (the development
facilitator, a fake JSON-RPC node as the paid route, sign-ins for the test client's host) and
what a wallet does against it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import yaml
from eth_account import Account
from solders.keypair import Keypair

from serve_app.settings import Settings
from serve_app.wallets.x402 import BASE_NETWORK, dev_facilitator
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway
from tests.wallets import Wallet, signed_in

ORIGIN = "http://testserver"
RPC_URL = f"{ORIGIN}/api/v1/crypto/rpc/ethereum-mainnet"
CHAT_URL = f"{ORIGIN}/api/v1/chat/completions"  # an inference route: its 402 has a challenge
TOP_UP = "/api/v1/x402/top-up"
CALL = {"jsonrpc": "2.0", "method": "eth_blockNumber", "params": [], "id": 1}
NANOS_PER_CALL = 20 * 700  # 20 credits at 7e-7 USD


def wallet_settings(tmp_path: Path, node: RpcNode, facilitator: str | None, **extra) -> Settings:
    nodes = tmp_path / "crypto_rpc.yaml"
    nodes.write_text(yaml.safe_dump({"networks": {"ethereum-mainnet": {
        "url": node.url, "family": "evm", "base_credits": 20}}}))
    fields = {"data_dir": tmp_path, "initial_credit_usd": 10, "rate_limit_backend": "local",
              "crypto_rpc_nodes": nodes, "x402_facilitator_url": facilitator,
              "x402_pay_to_evm": Account.create().address,
              "x402_pay_to_solana": str(Keypair().pubkey()),
              "x402_solana_fee_payer": dev_facilitator.DEV_SOLANA_FEE_PAYER,
              "siwx_domains": "testserver"}
    return Settings(**{**fields, **extra})


def top_up(gw: Gateway, wallet: Wallet, usd: str, network: str = BASE_NETWORK):
    asked = gw.client.post(f"{TOP_UP}?amount={usd}")
    assert asked.status_code == 402, asked.text
    return gw.client.post(TOP_UP, headers=wallet.pay(asked, network))


def rpc_call(gw: Gateway, wallet: Wallet):
    headers = signed_in(gw.client, wallet, RPC_URL, CHAT_URL)
    return gw.client.post(RPC_URL, json=CALL, headers=headers)


def nanos(value: float | str) -> int:
    return int(Decimal(str(value)) * 10**9)
