"""x402 top-up payments: the requirements we issue, the payment header, our EIP-3009 and Solana
checks, the facilitator client and the development facilitator.

Payments are made by the x402 protocol's own client (x402ClientSync with its EVM and SVM
`exact` schemes) from the `accepts` entries we build, with wallets generated here; its SVM
client reads the mint and a blockhash from a fake Solana node on a loopback socket. Edge
cases the protocol client will not produce (a transfer not yet valid, an extra instruction)
are signed with the protocol's own signing helpers or built with solders.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.system_program import TransferParams, transfer
from solders.transaction import VersionedTransaction
from x402 import x402ClientSync
from x402.http.utils import encode_payment_signature_header
from x402.mechanisms.evm.exact.client import ExactEvmScheme
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.mechanisms.evm.types import ExactEIP3009Authorization, ExactEIP3009Payload
from x402.mechanisms.svm.exact.register import register_exact_svm_client
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import (
    PaymentRequired,
    PaymentRequiredV1,
    PaymentRequirements,
    PaymentRequirementsV1,
    ResourceInfo,
)

from serve_app.errors import ApiError
from serve_app.http.render import error_response
from serve_app.settings import Settings
from serve_app.wallets.x402 import (
    BASE_NETWORK,
    BASE_USDC,
    MAX_HEADER_BYTES,
    MAX_TIMEOUT_S,
    SOLANA_NETWORK,
    SOLANA_USDC,
    FacilitatorClient,
    PaymentConfig,
    X402PaymentError,
    accepts,
    decode_payment_header,
    dev_facilitator,
    from_base_units,
    match_requirement,
    requirement_for,
    to_base_units,
    verify_evm,
    verify_payment,
    verify_solana,
)
from serve_app.wallets.x402.evm import MAX_VALID_AHEAD_S
from serve_app.wallets.x402.solana import (
    COMPUTE_BUDGET_PROGRAM,
    MEMO_PROGRAM,
    TOKEN_PROGRAM,
    associated_token_account,
)
from tests.x402_fakes import FakeSolanaRpc

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # x402's sync Solana client

RESOURCE = ResourceInfo(url="http://127.0.0.1:8000/api/v1/x402/top-up",
                        description="top-up", mime_type="application/json")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def encode(data: dict) -> str:
    return base64.b64encode(json.dumps(data).encode()).decode()


def decode(header: str) -> dict:
    return json.loads(base64.b64decode(header))


def tamper(header: str, change: Callable[[dict], Any]) -> str:
    data = decode(header)
    change(data)
    return encode(data)


def entry(config: PaymentConfig, on: str, usd: str = "10", **changes: Any) -> dict:
    """Our `accepts` entry on network `on`, with fields changed (an attacker's requirement)."""
    (found,) = [e for e in accepts(config, Decimal(usd)) if e["network"] == on]
    found = {**found, **changes}
    if "extra" in changes:
        found["extra"] = {**found["extra"], **changes["extra"]}
    return found


def check(header: str, config: PaymentConfig, now: float | None = None):
    """What the gateway does with a payment header before the facilitator."""
    payload = decode_payment_header(header)
    requirement = match_requirement(payload, config)
    return verify_payment(payload, requirement, now)


def refused(call: Callable[[], Any], reason: str | set[str], status: int = 400,
            code: str = "X402_INVALID_PAYMENT") -> X402PaymentError:
    with pytest.raises(X402PaymentError) as info:
        call()
    err = info.value
    reasons = {reason} if isinstance(reason, str) else reason
    assert err.status == status and err.code == code
    assert err.reason in reasons, err.body()
    body = json.loads(error_response(err).body)
    assert set(body) == {"error", "message", "details"}
    assert body["error"] == code and body["details"]["reason"] == err.reason
    assert isinstance(body["message"], str) and body["message"]
    return err


def b58_sign(keypair: Keypair, message: MessageV0) -> Signature:
    return keypair.sign_message(bytes([0x80]) + bytes(message))


def solana_tx(
    authority: Keypair,
    requirement: dict,
    *,
    fee_payer: Pubkey | None = None,
    signer: Keypair | None = None,
    cu_price: int = 1,
    extra_instructions: tuple[Instruction, ...] = (),
    memo: bytes | None = b"0123456789abcdef",
    transfer_authority: Pubkey | None = None,
) -> str:
    """A transaction built like the protocol's SVM client (limit, price, TransferChecked,
    memo), with the changes the tests ask for; base64."""
    fee_payer = fee_payer or Pubkey.from_string(requirement["extra"]["feePayer"])
    mint = Pubkey.from_string(requirement["asset"])
    owner = transfer_authority or authority.pubkey()
    amount = int(requirement["amount"])
    instructions = [
        Instruction(COMPUTE_BUDGET_PROGRAM, bytes([2]) + (20000).to_bytes(4, "little"), []),
        Instruction(COMPUTE_BUDGET_PROGRAM, bytes([3]) + cu_price.to_bytes(8, "little"), []),
        Instruction(TOKEN_PROGRAM, bytes([12]) + amount.to_bytes(8, "little") + bytes([6]), [
            AccountMeta(associated_token_account(owner, mint), False, True),
            AccountMeta(mint, False, False),
            AccountMeta(associated_token_account(requirement["payTo"], mint), False, True),
            AccountMeta(owner, True, False),
        ]),
    ]
    if memo is not None:
        instructions.append(Instruction(MEMO_PROGRAM, memo, []))
    instructions.extend(extra_instructions)
    message = MessageV0.try_compile(fee_payer, instructions, [], Hash.new_unique())
    signature = b58_sign(signer or authority, message)
    slots = [Signature.default()] * message.header.num_required_signatures
    slots[list(message.account_keys).index(authority.pubkey())] = signature
    return base64.b64encode(bytes(VersionedTransaction.populate(message, slots))).decode()


def with_transaction(header: str, transaction: str) -> str:
    return tamper(header, lambda d: d["payload"].__setitem__("transaction", transaction))


@dataclass
class Payer:
    """A wallet holder paying with the x402 protocol's client."""

    evm: LocalAccount
    solana: Keypair
    rpc_url: str

    def client(self) -> x402ClientSync:
        client = x402ClientSync()
        # every eip155:* / solana:* network (ours included), so that the tests can also pay
        # requirements on networks we do not offer
        register_exact_evm_client(client, self.evm)
        register_exact_svm_client(client, KeypairSigner(self.solana), rpc_url=self.rpc_url)
        client.set_spend_controls(False)  # top-ups are above its $1 default cap
        return client

    def pay(self, requirement: dict) -> str:
        """The payment header for one `accepts` entry (x402 v2)."""
        required = PaymentRequired(accepts=[PaymentRequirements.model_validate(requirement)],
                                   resource=RESOURCE, error="Payment required")
        return encode_payment_signature_header(self.client().create_payment_payload(required))

    def pay_v1(self, requirement: dict) -> str:
        """The same requirement paid with x402 v1 (legacy network names)."""
        v1_names = {BASE_NETWORK: "base", SOLANA_NETWORK: "solana"}
        v1 = PaymentRequirementsV1(
            scheme="exact", network=v1_names[requirement["network"]],
            max_amount_required=requirement["amount"], resource=RESOURCE.url,
            description="top-up", mime_type="application/json", pay_to=requirement["payTo"],
            max_timeout_seconds=requirement["maxTimeoutSeconds"], asset=requirement["asset"],
            extra=requirement["extra"])
        payload = self.client().create_payment_payload(PaymentRequiredV1(accepts=[v1]))
        return encode_payment_signature_header(payload)


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rpc() -> Iterator[FakeSolanaRpc]:
    with FakeSolanaRpc() as node:
        yield node


@pytest.fixture(scope="module")
def config() -> PaymentConfig:
    return PaymentConfig(pay_to_evm=Account.create().address.lower(),
                         pay_to_solana=str(Keypair().pubkey()),
                         solana_fee_payer=dev_facilitator.DEV_SOLANA_FEE_PAYER,
                         min_top_up_usd=Decimal(5))


@pytest.fixture
def payer(rpc: FakeSolanaRpc) -> Payer:
    return Payer(Account.create(), Keypair(), rpc.url)


@pytest.fixture(scope="module")
def facilitator_url() -> Iterator[str]:
    url, stop = dev_facilitator.start_in_thread()
    yield url
    stop()


NETWORKS = [BASE_NETWORK, SOLANA_NETWORK]


# ---------------------------------------------------------------------------------------------
# Requirements we issue
# ---------------------------------------------------------------------------------------------


def test_accepts_lists_one_entry_per_network_in_the_published_shape(config: PaymentConfig):
    base, sol = accepts(config, Decimal("12.5"))
    assert base == {
        "scheme": "exact", "network": "eip155:8453", "asset": BASE_USDC, "amount": "12500000",
        "payTo": config.pay_to_evm, "maxTimeoutSeconds": 300,
        "extra": {"name": "USD Coin", "version": "2"}}
    assert sol == {
        "scheme": "exact", "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
        "asset": SOLANA_USDC, "amount": "12500000", "payTo": config.pay_to_solana,
        "maxTimeoutSeconds": 300, "extra": {"feePayer": config.solana_fee_payer}}
    assert config.pay_to_evm != config.pay_to_evm.lower()  # checksummed
    assert MAX_TIMEOUT_S == 300


@pytest.mark.parametrize("usd", ["4.99", "10000.01", "5.0000001", "NaN", "-5"])
def test_accepts_refuses_an_amount_out_of_range(config: PaymentConfig, usd: str):
    with pytest.raises(ApiError) as info:
        accepts(config, Decimal(usd))
    assert info.value.status == 400 and info.value.code == "INVALID_REQUEST"
    assert "amount" in info.value.details


def test_accepts_bounds_are_inclusive(config: PaymentConfig):
    assert accepts(config, Decimal(5))[0]["amount"] == "5000000"
    assert accepts(config, Decimal(10000))[1]["amount"] == "10000000000"


def test_base_units():
    assert to_base_units(Decimal("12.345678")) == 12_345_678
    assert to_base_units("5") == 5_000_000
    assert from_base_units(12_345_678) == Decimal("12.345678")
    assert from_base_units("5000000") == Decimal(5)
    with pytest.raises(ValueError):
        to_base_units(Decimal("0.0000001"))
    with pytest.raises(ValueError):
        to_base_units("Infinity")


def test_payment_config_from_settings_and_checks():
    evm, sol, fee = Account.create().address, str(Keypair().pubkey()), str(Keypair().pubkey())
    settings = Settings(x402_pay_to_evm=evm.lower(), x402_pay_to_solana=sol,
                        x402_solana_fee_payer=fee, x402_min_top_up_usd=Decimal("7"))
    cfg = PaymentConfig.from_settings(settings)
    assert (cfg.pay_to_evm, cfg.pay_to_solana, cfg.solana_fee_payer) == (evm, sol, fee)
    assert cfg.min_top_up_usd == 7 and cfg.networks == (BASE_NETWORK, SOLANA_NETWORK)
    assert PaymentConfig.from_settings(Settings()).networks == ()
    assert accepts(PaymentConfig(), Decimal(5)) == []
    assert PaymentConfig(pay_to_evm=evm).networks == (BASE_NETWORK,)
    with pytest.raises(ValueError):
        PaymentConfig(pay_to_evm="0x1234")
    with pytest.raises(ValueError):
        PaymentConfig(pay_to_solana="not-base58-0OIl")
    with pytest.raises(ValueError):
        PaymentConfig(pay_to_solana=sol)  # no fee payer
    with pytest.raises(ValueError):
        PaymentConfig(pay_to_evm=evm, min_top_up_usd=Decimal(0))


# ---------------------------------------------------------------------------------------------
# Valid payments from the protocol's client
# ---------------------------------------------------------------------------------------------


def test_valid_evm_payment_passes(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, BASE_NETWORK, "10"))
    payload = decode_payment_header(header)
    assert payload.x402_version == 2 and payload.network == BASE_NETWORK
    requirement = match_requirement(payload, config)
    assert requirement == entry(config, BASE_NETWORK, "10")
    verified = verify_evm(payload, requirement, time.time())
    nonce = payload.payload["authorization"]["nonce"]
    assert verified.network == BASE_NETWORK
    assert verified.payer == payer.evm.address
    assert verified.amount_base_units == 10_000_000 and verified.amount_usd == 10
    assert verified.payment_id == (
        f"eip155:8453:{BASE_USDC}:{payer.evm.address}:{nonce}".lower())


def test_valid_solana_payment_passes(config: PaymentConfig, payer: Payer, rpc: FakeSolanaRpc):
    header = payer.pay(entry(config, SOLANA_NETWORK, "25.5"))
    assert {"getAccountInfo", "getLatestBlockhash"} <= set(rpc.calls)
    payload = decode_payment_header(header)
    requirement = match_requirement(payload, config)
    assert requirement["amount"] == "25500000"
    verified = verify_solana(payload, requirement)
    tx = VersionedTransaction.from_bytes(base64.b64decode(payload.payload["transaction"]))
    assert verified.payer == str(payer.solana.pubkey())
    assert verified.amount_base_units == 25_500_000
    # one id per transfer message, whichever signature carries it
    assert verified.payment_id == "solana:" + hashlib.sha256(bytes(tx.message)).hexdigest()


def test_any_amount_in_range_is_one_we_issue(config: PaymentConfig, payer: Payer):
    for usd in ("5", "123.456789", "10000"):
        assert check(payer.pay(entry(config, BASE_NETWORK, usd)), config).amount_usd == \
            Decimal(usd)


@pytest.mark.parametrize("network", NETWORKS)
def test_x402_v1_payment_passes(config: PaymentConfig, payer: Payer, network: str):
    header = payer.pay_v1(entry(config, network, "6"))
    payload = decode_payment_header(header)
    assert payload.x402_version == 1 and payload.network == network
    verified = verify_payment(payload, match_requirement(payload, config))
    assert verified.amount_base_units == 6_000_000
    wire = payload.to_wire(match_requirement(payload, config))
    assert wire["x402Version"] == 2 and wire["accepted"]["network"] == network


def test_url_safe_unpadded_header_is_accepted(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, BASE_NETWORK))
    urlsafe = base64.urlsafe_b64encode(base64.b64decode(header)).decode().rstrip("=")
    assert check(urlsafe, config).amount_base_units == 10_000_000


# ---------------------------------------------------------------------------------------------
# Refused payments
# ---------------------------------------------------------------------------------------------


def test_forged_evm_signature(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, BASE_NETWORK))

    def flip(d: dict) -> None:
        sig = bytearray(bytes.fromhex(d["payload"]["signature"][2:]))
        sig[63] ^= 0x01  # low byte of s: still a canonical signature, of someone else
        d["payload"]["signature"] = "0x" + sig.hex()

    refused(lambda: check(tamper(header, flip), config), "signature_mismatch")
    refused(lambda: check(tamper(header, lambda d: d["payload"].__setitem__(
        "signature", "0x" + "00" * 65)), config), "invalid_signature")
    refused(lambda: check(tamper(header, lambda d: d["payload"].pop("signature")), config),
            "invalid_signature")


def test_high_s_evm_signature_is_refused(config: PaymentConfig, payer: Payer):
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    header = payer.pay(entry(config, BASE_NETWORK))

    def malleate(d: dict) -> None:  # (r, n - s, v ^ 1) is the same signature, high-s form
        sig = bytes.fromhex(d["payload"]["signature"][2:])
        s = n - int.from_bytes(sig[32:64], "big")
        d["payload"]["signature"] = "0x" + (sig[:32] + s.to_bytes(32, "big")
                                            + bytes([55 - sig[64]])).hex()

    refused(lambda: check(tamper(header, malleate), config), "invalid_signature")


def test_forged_solana_signature(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, SOLANA_NETWORK))
    tx = VersionedTransaction.from_bytes(base64.b64decode(decode(header)["payload"]
                                                          ["transaction"]))
    sig = bytearray(bytes(tx.signatures[1]))
    sig[0] ^= 0x01
    forged = VersionedTransaction.populate(tx.message, [Signature.default(),
                                                        Signature.from_bytes(bytes(sig))])
    forged_header = with_transaction(header, base64.b64encode(bytes(forged)).decode())
    refused(lambda: check(forged_header, config), "signature_mismatch")


def test_evm_signature_by_another_wallet(config: PaymentConfig, payer: Payer, rpc):
    thief = Payer(Account.create(), Keypair(), rpc.url)
    header = thief.pay(entry(config, BASE_NETWORK))
    claimed = tamper(header, lambda d: d["payload"]["authorization"].__setitem__(
        "from", payer.evm.address))
    refused(lambda: check(claimed, config), "signature_mismatch")


def test_solana_signature_by_another_wallet(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, SOLANA_NETWORK))
    tx = VersionedTransaction.from_bytes(base64.b64decode(decode(header)["payload"]
                                                          ["transaction"]))
    other = b58_sign(Keypair(), tx.message)
    resigned = VersionedTransaction.populate(tx.message, [Signature.default(), other])
    refused(lambda: check(with_transaction(header, base64.b64encode(bytes(resigned)).decode()),
                          config), "signature_mismatch")
    # a transaction built for the payer's account, signed by another key
    built = solana_tx(payer.solana, entry(config, SOLANA_NETWORK), signer=Keypair())
    refused(lambda: check(with_transaction(header, built), config), "signature_mismatch")


@pytest.mark.parametrize("network", NETWORKS)
def test_wrong_amount(config: PaymentConfig, payer: Payer, network: str):
    header = payer.pay(entry(config, network, "10"))
    # the envelope claims 20 USD, the signed transfer moves 10
    claimed = tamper(header, lambda d: d["accepted"].__setitem__("amount", "20000000"))
    refused(lambda: check(claimed, config), "amount_mismatch")
    # amounts we never issue
    for units in ("4999999", "10000000001"):
        low = payer.pay(entry(config, network, "10", amount=units))
        refused(lambda low=low: check(low, config), "amount_out_of_range")
    refused(lambda: check(tamper(header, lambda d: d["accepted"].__setitem__("amount", "1e7")),
                          config), "invalid_amount")


@pytest.mark.parametrize("network", NETWORKS)
def test_wrong_pay_to(config: PaymentConfig, payer: Payer, network: str):
    attacker = Account.create().address if network == BASE_NETWORK else str(Keypair().pubkey())
    header = payer.pay(entry(config, network, payTo=attacker))
    refused(lambda: check(header, config), "pay_to_mismatch")
    ours = entry(config, network)["payTo"]
    disguised = tamper(header, lambda d: d["accepted"].__setitem__("payTo", ours))
    refused(lambda: check(disguised, config), "recipient_mismatch")


@pytest.mark.parametrize("network", NETWORKS)
def test_wrong_asset(config: PaymentConfig, payer: Payer, network: str):
    other = Account.create().address if network == BASE_NETWORK else str(Keypair().pubkey())
    header = payer.pay(entry(config, network, asset=other))
    refused(lambda: check(header, config), "asset_mismatch")
    ours = entry(config, network)["asset"]
    disguised = tamper(header, lambda d: d["accepted"].__setitem__("asset", ours))
    # EVM: the signature's EIP-712 domain names the other token; Solana: the other mint
    refused(lambda: check(disguised, config), {"signature_mismatch", "mint_mismatch"})


def test_wrong_network(config: PaymentConfig, payer: Payer):
    sepolia = payer.pay(entry(config, BASE_NETWORK, network="eip155:84532"))
    refused(lambda: check(sepolia, config), "unsupported_network")
    devnet = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
    header = payer.pay(entry(config, SOLANA_NETWORK, network=devnet))
    refused(lambda: check(header, config), "unsupported_network")
    evm_only = PaymentConfig(pay_to_evm=config.pay_to_evm)
    refused(lambda: check(payer.pay(entry(config, SOLANA_NETWORK)), evm_only),
            "unsupported_network")
    # a Base payment presented as a Solana one
    base = payer.pay(entry(config, BASE_NETWORK))
    payload = decode_payment_header(base)
    refused(lambda: verify_solana(payload, entry(config, SOLANA_NETWORK)), "network_mismatch")


def _signed_authorization(payer: Payer, requirement: dict, *, valid_after: int,
                          valid_before: int) -> str:
    """An EIP-3009 authorization signed with the protocol's own EVM scheme."""
    scheme = ExactEvmScheme(payer.evm)
    authorization = ExactEIP3009Authorization(
        from_address=payer.evm.address, to=requirement["payTo"], value=requirement["amount"],
        valid_after=str(valid_after), valid_before=str(valid_before), nonce="0x" + "ab" * 32)
    signature = scheme._sign_authorization(authorization,
                                           PaymentRequirements.model_validate(requirement))
    inner = ExactEIP3009Payload(authorization=authorization, signature=signature).to_dict()
    return encode({"x402Version": 2, "accepted": requirement, "payload": inner})


def test_evm_validity_window(config: PaymentConfig, payer: Payer):
    requirement = entry(config, BASE_NETWORK)
    now = int(time.time())
    good = _signed_authorization(payer, requirement, valid_after=now - 60,
                                 valid_before=now + 200)
    assert check(good, config, now).payer == payer.evm.address
    expired = _signed_authorization(payer, requirement, valid_after=0, valid_before=now - 1)
    refused(lambda: check(expired, config, now), "expired")
    # still valid for a moment, too short to settle
    refused(lambda: check(good, config, now + 197), "expired")
    not_yet = _signed_authorization(payer, requirement, valid_after=now + 120,
                                    valid_before=now + 240)
    refused(lambda: check(not_yet, config, now), "not_yet_valid")


def test_a_window_longer_than_max_timeout_seconds_is_valid_now(config: PaymentConfig,
                                                                payer: Payer):
    """The exact scheme asks that the authorization be valid now, not that its window be
    shorter than our maxTimeoutSeconds (300): validAfter 0, validBefore now + 600 pays."""
    requirement = entry(config, BASE_NETWORK)
    assert requirement["maxTimeoutSeconds"] == MAX_TIMEOUT_S == 300
    now = int(time.time())
    for ahead in (600, MAX_VALID_AHEAD_S):
        header = _signed_authorization(payer, requirement, valid_after=0,
                                       valid_before=now + ahead)
        assert check(header, config, now).payer == payer.evm.address


def test_valid_before_more_than_an_hour_ahead_is_refused_naming_the_bound(
        config: PaymentConfig, payer: Payer):
    requirement = entry(config, BASE_NETWORK)
    now = int(time.time())
    header = _signed_authorization(payer, requirement, valid_after=0,
                                   valid_before=now + MAX_VALID_AHEAD_S + 60)
    err = refused(lambda: check(header, config, now), "timeout_too_long")
    assert f"more than {MAX_VALID_AHEAD_S} seconds ahead" in err.message


def test_protocol_client_payment_expires(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, BASE_NETWORK))
    valid_before = int(decode(header)["payload"]["authorization"]["validBefore"])
    refused(lambda: check(header, config, valid_before), "expired")


def test_an_envelope_with_another_max_timeout_seconds_is_not_ours(config: PaymentConfig,
                                                                   payer: Payer):
    header = payer.pay(entry(config, BASE_NETWORK, maxTimeoutSeconds=3600))
    refused(lambda: check(header, config), "timeout_too_long")


def test_solana_transaction_built_like_the_protocol_client_passes(config: PaymentConfig,
                                                                  payer: Payer):
    header = payer.pay(entry(config, SOLANA_NETWORK))
    built = solana_tx(payer.solana, entry(config, SOLANA_NETWORK))
    assert check(with_transaction(header, built), config).payer == str(payer.solana.pubkey())
    no_memo = solana_tx(payer.solana, entry(config, SOLANA_NETWORK), memo=None)
    assert check(with_transaction(header, no_memo), config).amount_base_units == 10_000_000


def test_extra_instruction_in_solana_transaction(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, SOLANA_NETWORK))
    requirement = entry(config, SOLANA_NETWORK)
    drain = transfer(TransferParams(from_pubkey=payer.solana.pubkey(),
                                    to_pubkey=Keypair().pubkey(), lamports=1))
    extra = solana_tx(payer.solana, requirement, extra_instructions=(drain,))
    refused(lambda: check(with_transaction(header, extra), config), "unexpected_instruction")
    replaced = solana_tx(payer.solana, requirement, memo=None, extra_instructions=(drain,))
    refused(lambda: check(with_transaction(header, replaced), config), "unexpected_instruction")
    long_memo = solana_tx(payer.solana, requirement, memo=b"x" * 257)
    refused(lambda: check(with_transaction(header, long_memo), config), "memo_too_long")
    pricey = solana_tx(payer.solana, requirement, cu_price=5_000_001)
    refused(lambda: check(with_transaction(header, pricey), config), "compute_price_too_high")


def test_wrong_fee_payer(config: PaymentConfig, payer: Payer):
    stranger = str(Keypair().pubkey())
    header = payer.pay(entry(config, SOLANA_NETWORK, extra={"feePayer": stranger}))
    refused(lambda: check(header, config), "fee_payer_mismatch")
    ours = config.solana_fee_payer
    disguised = tamper(header, lambda d: d["accepted"]["extra"].__setitem__("feePayer", ours))
    refused(lambda: check(disguised, config), "fee_payer_mismatch")


def test_fee_payer_funds_cannot_be_moved(config: PaymentConfig, payer: Payer):
    """A transfer whose authority is the fee payer (the facilitator would sign it away)."""
    header = payer.pay(entry(config, SOLANA_NETWORK))
    fee_payer = Pubkey.from_string(config.solana_fee_payer)
    # the payer signs a memo so the transaction still has two signers
    signed_memo = Instruction(MEMO_PROGRAM, b"hi", [AccountMeta(payer.solana.pubkey(), True,
                                                                False)])
    tx = solana_tx(payer.solana, entry(config, SOLANA_NETWORK), memo=None,
                   transfer_authority=fee_payer, extra_instructions=(signed_memo,))
    refused(lambda: check(with_transaction(header, tx), config), "fee_payer_in_instruction")


def test_fee_payer_signature_slot_must_be_empty(config: PaymentConfig, payer: Payer):
    header = payer.pay(entry(config, SOLANA_NETWORK))
    tx = VersionedTransaction.from_bytes(base64.b64decode(decode(header)["payload"]
                                                          ["transaction"]))
    filled = VersionedTransaction.populate(tx.message, [b58_sign(Keypair(), tx.message),
                                                        tx.signatures[1]])
    refused(lambda: check(with_transaction(header, base64.b64encode(bytes(filled)).decode()),
                          config), "fee_payer_signature_present")


@pytest.mark.parametrize(("header", "reason"), [
    ("not base64 at all!", "malformed_header"),
    ("", "malformed_header"),
    (base64.b64encode(b"not json").decode(), "malformed_header"),
    (base64.b64encode(b"\xff\xfe").decode(), "malformed_header"),
    (encode([1, 2]), "malformed_payload"),  # type: ignore[arg-type]
    (encode({"x402Version": 3, "payload": {}}), "unsupported_version"),
    (encode({"x402Version": "2", "payload": {}}), "unsupported_version"),
    (encode({"x402Version": 2, "payload": {}, "accepted": "exact"}), "malformed_payload"),
    (encode({"x402Version": 2, "accepted": {"scheme": "exact"}, "payload": {}}),
     "malformed_payload"),
    (encode({"x402Version": 2, "payload": "x", "accepted": {}}), "malformed_payload"),
    (encode({"x402Version": 1, "scheme": "exact", "payload": {}}), "malformed_payload"),
])
def test_malformed_header(header: str, reason: str):
    refused(lambda: decode_payment_header(header), reason)


def test_malformed_inner_payloads(config: PaymentConfig, payer: Payer):
    evm = payer.pay(entry(config, BASE_NETWORK))
    for change in (
        lambda d: d["payload"].pop("authorization"),
        lambda d: d["payload"]["authorization"].__setitem__("value", "-1"),
        lambda d: d["payload"]["authorization"].__setitem__("nonce", "0x1234"),
        lambda d: d["payload"]["authorization"].__setitem__("from", "0xnothex"),
    ):
        refused(lambda change=change: check(tamper(evm, change), config),
                {"malformed_payload", "amount_mismatch"})
    sol = payer.pay(entry(config, SOLANA_NETWORK))
    refused(lambda: check(with_transaction(sol, "AAAA"), config), "invalid_transaction")
    refused(lambda: check(with_transaction(sol, "%%%"), config), "invalid_transaction")
    refused(lambda: check(tamper(sol, lambda d: d["payload"].pop("transaction")), config),
            "malformed_payload")


def test_oversized_header():
    big = base64.b64encode(json.dumps({"x402Version": 2, "pad": "x" * MAX_HEADER_BYTES})
                           .encode()).decode()
    refused(lambda: decode_payment_header(big), "header_too_large")
    refused(lambda: decode_payment_header("A" * (MAX_HEADER_BYTES + 1)), "header_too_large")


# ---------------------------------------------------------------------------------------------
# Development facilitator over a real socket, and the facilitator client
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("network", NETWORKS)
async def test_dev_facilitator_verifies_and_settles_once(config: PaymentConfig, payer: Payer,
                                                         facilitator_url: str, network: str):
    header = payer.pay(entry(config, network, "42"))
    payload = decode_payment_header(header)
    requirement = match_requirement(payload, config)
    verified = verify_payment(payload, requirement)
    async with FacilitatorClient(facilitator_url, timeout_s=10) as facilitator:
        result = await facilitator.verify(payload, requirement)
        assert result.is_valid and result.payer == verified.payer
        settled = await facilitator.settle(payload.to_wire(requirement), requirement)
        assert settled.success and settled.network == network
        assert settled.payer == verified.payer
        assert settled.transaction == dev_facilitator.fake_transaction(verified)
        assert decode(settled.payment_response_header()) == {
            "success": True, "network": network, "payer": verified.payer,
            "transaction": settled.transaction}
        # the chain refuses a used nonce / a duplicate transaction: so does the dev facilitator
        with pytest.raises(X402PaymentError) as info:
            await facilitator.settle(payload, requirement)
        assert info.value.status == 402 and info.value.code == "X402_PAYMENT_REJECTED"
        assert info.value.reason == "already_settled"
        assert set(info.value.body()) == {"error", "message", "details"}


async def test_dev_facilitator_runs_our_checks(config: PaymentConfig, payer: Payer,
                                               facilitator_url: str):
    requirement = entry(config, BASE_NETWORK, "10")
    header = payer.pay(requirement)
    async with FacilitatorClient(facilitator_url) as facilitator:
        # the payment is for 10 USD; the gateway asks for 20
        other = {**requirement, "amount": "20000000"}
        with pytest.raises(X402PaymentError) as info:
            await facilitator.verify(decode(header), other)
        assert (info.value.status, info.value.reason) == (402, "amount_mismatch")
        forged = tamper(header, lambda d: d["payload"]["authorization"].__setitem__(
            "from", Account.create().address))
        with pytest.raises(X402PaymentError) as info:
            await facilitator.settle(decode(forged), requirement)
        assert info.value.reason == "signature_mismatch"
        # a fee payer the facilitator does not manage
        sol = entry(config, SOLANA_NETWORK, extra={"feePayer": str(Keypair().pubkey())})
        with pytest.raises(X402PaymentError) as info:
            await facilitator.verify(decode(payer.pay(sol)), sol)
        assert info.value.reason == "fee_payer_not_managed_by_facilitator"
        supported = await facilitator.supported()
    kinds = {(k["x402Version"], k["network"]) for k in supported["kinds"]}
    assert {(2, BASE_NETWORK), (2, SOLANA_NETWORK), (1, "base"), (1, "solana")} <= kinds
    assert supported["signers"]["solana:*"] == [dev_facilitator.DEV_SOLANA_FEE_PAYER]


async def test_dev_facilitator_settles_a_window_longer_than_max_timeout_seconds(
        config: PaymentConfig, payer: Payer, facilitator_url: str):
    requirement = entry(config, BASE_NETWORK, "10")
    now = int(time.time())
    header = _signed_authorization(payer, requirement, valid_after=0, valid_before=now + 600)
    payload = decode_payment_header(header)
    async with FacilitatorClient(facilitator_url) as facilitator:
        assert (await facilitator.verify(payload, requirement)).is_valid
        settled = await facilitator.settle(payload, requirement)
    assert settled.success and settled.payer == payer.evm.address


async def test_dev_facilitator_with_a_v1_payment(config: PaymentConfig, payer: Payer,
                                                 facilitator_url: str):
    header = payer.pay_v1(entry(config, BASE_NETWORK, "8"))
    payload = decode_payment_header(header)
    requirement = match_requirement(payload, config)
    async with FacilitatorClient(facilitator_url) as facilitator:
        settled = await facilitator.settle(payload, requirement)
    assert settled.payer == payer.evm.address and settled.transaction.startswith("0x")


async def test_facilitator_down_is_a_502():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    requirement = requirement_for(PaymentConfig(pay_to_evm=Account.create().address),
                                  BASE_NETWORK, 5_000_000)
    async with FacilitatorClient(f"http://127.0.0.1:{port}", timeout_s=2) as facilitator:
        for call in (facilitator.verify, facilitator.settle):
            with pytest.raises(ApiError) as info:
                await call({"x402Version": 2}, requirement)
            assert info.value.status == 502
            assert info.value.code == "X402_FACILITATOR_UNAVAILABLE"
            assert error_response(info.value).status_code == 502


async def test_facilitator_timeout_is_a_502():
    """A facilitator that accepts the connection and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        async with FacilitatorClient(url, timeout_s=0.3) as facilitator:
            with pytest.raises(ApiError) as info:
                await facilitator.verify({"x402Version": 2}, {"network": BASE_NETWORK})
        assert info.value.status == 502 and "in time" in info.value.message
    finally:
        silent.close()


async def test_facilitator_answers_read_by_status():
    answers = {
        "/verify": (500, {"error": "boom"}),
        "/settle": (400, {"success": False, "errorReason": "insufficient_funds",
                          "transaction": "", "network": BASE_NETWORK}),
    }
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        status, body = answers[request.url.path]
        return httpx.Response(status, json=body)

    requirement = {"network": BASE_NETWORK, "amount": "5000000"}
    async with FacilitatorClient("http://facilitator.test", transport=httpx.MockTransport(
            handler)) as facilitator:
        with pytest.raises(ApiError) as info:
            await facilitator.verify({"x402Version": 2, "payload": {}}, requirement)
        assert (info.value.status, info.value.code) == (502, "X402_FACILITATOR_UNAVAILABLE")
        with pytest.raises(X402PaymentError) as rejected:
            await facilitator.settle({"x402Version": 2, "payload": {}}, requirement)
        assert (rejected.value.status, rejected.value.reason) == (402, "insufficient_funds")
        answers["/settle"] = (200, {"success": True, "network": BASE_NETWORK})
        with pytest.raises(ApiError) as info:
            await facilitator.settle({"x402Version": 2, "payload": {}}, requirement)
        assert info.value.status == 502
    assert seen[0] == {"x402Version": 2, "paymentPayload": {"x402Version": 2, "payload": {}},
                       "paymentRequirements": requirement}


def test_dev_facilitator_binds_loopback_only(capsys):
    with pytest.raises(SystemExit):
        dev_facilitator.main(["--host", "0.0.0.0"])
    assert "loopback" in capsys.readouterr().err
    with pytest.raises(ValueError):
        dev_facilitator.start_in_thread("0.0.0.0")
    assert dev_facilitator.is_loopback("::1") and dev_facilitator.is_loopback("localhost")
    assert not dev_facilitator.is_loopback("example.com")


def test_start_in_thread_serves_and_stops():
    url, stop = dev_facilitator.start_in_thread(solana_fee_payer=str(Keypair().pubkey()))
    try:
        assert httpx.get(f"{url}/supported", timeout=60).status_code == 200
    finally:
        stop()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{url}/supported", timeout=1)



def test_refusal_leaves_the_gateway_in_the_reference_shape():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from serve_app.error_handlers import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.post("/x402/top-up")
    async def top_up() -> None:
        decode_payment_header("%%%")

    response = TestClient(app).post("/x402/top-up")
    assert response.status_code == 400
    assert response.json() == {"error": "X402_INVALID_PAYMENT",
                               "message": "Payment header is not base64",
                               "details": {"reason": "malformed_header"}}
