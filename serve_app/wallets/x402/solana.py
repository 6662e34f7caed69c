"""The x402 `exact` scheme on Solana: a versioned transaction the payer partially signs and the
facilitator completes as fee payer and submits.

Inner payload: `{transaction: <base64 VersionedTransaction>}`. We accept exactly the shape
the protocol's client builds, positionally:

0. ComputeBudget SetComputeUnitLimit
1. ComputeBudget SetComputeUnitPrice, at most 5 lamports (5,000,000 micro-lamports) per CU
2. one SPL TransferChecked (Token or Token-2022 program) of the requirement's mint, to the
   associated token account of payTo, of exactly the required amount, 6 decimals
3. optionally one Memo (at most 256 bytes)

with two signers: account 0 the requirement's fee payer (its signature slot still empty) and
account 1 the transfer authority, whose ed25519 signature over the message (0x80 version
prefix + MessageV0) must verify. The fee payer may appear in no instruction, so signing as fee
payer can only pay the fee. Stricter than the protocol, which also allows Lighthouse
instructions and an amount above the required one; address lookup tables and legacy messages
are refused. The blockhash, balances and a simulation are the facilitator's to check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import VersionedTransaction

from .requirements import SCHEME_EXACT, USDC_DECIMALS, VerifiedPayment, invalid_payment


class SolanaPayment(Protocol):
    """What verification reads of a payment payload (payload.py's PaymentPayload, which
    imports this module for transfer amounts)."""

    scheme: str
    network: str
    payload: Mapping[str, Any]


COMPUTE_BUDGET_PROGRAM = Pubkey.from_string("ComputeBudget111111111111111111111111111111")
TOKEN_PROGRAM = Pubkey.from_string("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA")
TOKEN_2022_PROGRAM = Pubkey.from_string("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb")
ASSOCIATED_TOKEN_PROGRAM = Pubkey.from_string("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL")
MEMO_PROGRAM = Pubkey.from_string("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr")

MAX_COMPUTE_UNIT_PRICE_MICROLAMPORTS = 5_000_000
MAX_MEMO_BYTES = 256
# A transaction is at most 1232 bytes on the wire.
MAX_TRANSACTION_BYTES = 1232

_SET_COMPUTE_UNIT_LIMIT = 2
_SET_COMPUTE_UNIT_PRICE = 3
_TRANSFER_CHECKED = 12


def associated_token_account(owner: str | Pubkey, mint: str | Pubkey,
                             token_program: Pubkey = TOKEN_PROGRAM) -> Pubkey:
    """The associated token account of `owner` for `mint`."""
    owner = Pubkey.from_string(owner) if isinstance(owner, str) else owner
    mint = Pubkey.from_string(mint) if isinstance(mint, str) else mint
    address, _ = Pubkey.find_program_address(
        [bytes(owner), bytes(token_program), bytes(mint)], ASSOCIATED_TOKEN_PROGRAM)
    return address


def _invalid_tx(reason: str, message: str) -> Exception:
    return invalid_payment(reason, f"Invalid Solana payment transaction: {message}")


def decode_transaction(inner: Mapping[str, Any]) -> VersionedTransaction:
    """The transaction of a Solana inner payload `{transaction: base64}`."""
    encoded = inner.get("transaction")
    if not isinstance(encoded, str) or len(encoded) > 4 * MAX_TRANSACTION_BYTES:
        raise invalid_payment("malformed_payload", "Invalid payment payload: transaction")
    try:
        raw = base64.b64decode(encoded, validate=True)
        return VersionedTransaction.from_bytes(raw)
    except (binascii.Error, ValueError, TypeError):
        raise _invalid_tx("invalid_transaction", "not a serialized transaction") from None
    except Exception:  # solders raises its own error types for bad bytes
        raise _invalid_tx("invalid_transaction", "not a serialized transaction") from None


def _transfer_parts(tx: VersionedTransaction) -> tuple[Any, list[Pubkey]]:
    message = tx.message
    if not isinstance(message, MessageV0):
        raise _invalid_tx("unsupported_transaction_version", "expected a v0 message")
    if message.address_table_lookups:
        raise _invalid_tx("unexpected_accounts", "address lookup tables are not accepted")
    keys = list(message.account_keys)
    if len(set(keys)) != len(keys):
        raise _invalid_tx("invalid_transaction", "duplicate account keys")
    instructions = list(message.instructions)
    for ix in instructions:
        if ix.program_id_index >= len(keys) or any(i >= len(keys) for i in bytes(ix.accounts)):
            raise _invalid_tx("invalid_transaction", "account index out of range")
    return message, keys


def transfer_amount(inner: Mapping[str, Any]) -> int:
    """The amount of the TransferChecked of a Solana inner payload (for x402 v1 payments,
    which state no amount besides the transaction's own)."""
    tx = decode_transaction(inner)
    message, _ = _transfer_parts(tx)
    instructions = message.instructions
    if len(instructions) < 3:
        raise _invalid_tx("missing_transfer", "no TransferChecked instruction")
    data = bytes(instructions[2].data)
    if len(data) != 10 or data[0] != _TRANSFER_CHECKED:
        raise _invalid_tx("missing_transfer", "no TransferChecked instruction")
    return int.from_bytes(data[1:9], "little")


def verify_solana(payload: SolanaPayment, requirement: Mapping[str, Any]) -> VerifiedPayment:
    """Check a Solana `exact` payment against `requirement` (an `accepts` entry)."""
    network = requirement["network"]
    if payload.scheme != SCHEME_EXACT or payload.network != network:
        raise invalid_payment("network_mismatch", "Payment is not for this requirement")
    fee_payer_str = (requirement.get("extra") or {}).get("feePayer")
    if not isinstance(fee_payer_str, str):
        raise invalid_payment("fee_payer_mismatch", "Requirement names no fee payer")
    fee_payer = Pubkey.from_string(fee_payer_str)
    mint = Pubkey.from_string(requirement["asset"])

    tx = decode_transaction(payload.payload)
    message, keys = _transfer_parts(tx)
    header = message.header
    signatures = list(tx.signatures)
    if header.num_required_signatures != 2 or len(signatures) != 2 or len(keys) < 2:
        raise _invalid_tx("unexpected_signers",
                          "expected two signers (fee payer, transfer authority)")
    if keys[0] != fee_payer:
        raise invalid_payment("fee_payer_mismatch", "Transaction fee payer is not ours")

    instructions = list(message.instructions)
    if len(instructions) not in (3, 4):
        raise _invalid_tx("unexpected_instruction",
                          "expected compute limit, compute price, transfer and optional memo")
    programs = [keys[ix.program_id_index] for ix in instructions]
    for ix in instructions:
        if 0 in bytes(ix.accounts) or ix.program_id_index == 0:
            raise _invalid_tx("fee_payer_in_instruction",
                              "the fee payer may not take part in an instruction")

    limit_data = bytes(instructions[0].data)
    if (programs[0] != COMPUTE_BUDGET_PROGRAM or len(limit_data) != 5
            or limit_data[0] != _SET_COMPUTE_UNIT_LIMIT or bytes(instructions[0].accounts)):
        raise _invalid_tx("invalid_compute_limit",
                          "first instruction must be SetComputeUnitLimit")
    price_data = bytes(instructions[1].data)
    if (programs[1] != COMPUTE_BUDGET_PROGRAM or len(price_data) != 9
            or price_data[0] != _SET_COMPUTE_UNIT_PRICE or bytes(instructions[1].accounts)):
        raise _invalid_tx("invalid_compute_price",
                          "second instruction must be SetComputeUnitPrice")
    if int.from_bytes(price_data[1:9], "little") > MAX_COMPUTE_UNIT_PRICE_MICROLAMPORTS:
        raise _invalid_tx("compute_price_too_high", "compute unit price above 5 lamports")

    transfer = instructions[2]
    token_program = programs[2]
    data = bytes(transfer.data)
    accounts = bytes(transfer.accounts)
    if (token_program not in (TOKEN_PROGRAM, TOKEN_2022_PROGRAM) or len(data) != 10
            or data[0] != _TRANSFER_CHECKED or len(accounts) != 4):
        raise _invalid_tx("missing_transfer", "third instruction must be TransferChecked")
    if len(instructions) == 4:
        memo = instructions[3]
        if programs[3] != MEMO_PROGRAM:
            raise _invalid_tx("unexpected_instruction", "only a memo may follow the transfer")
        if len(bytes(memo.data)) > MAX_MEMO_BYTES:
            raise _invalid_tx("memo_too_long", f"memo longer than {MAX_MEMO_BYTES} bytes")

    _source, transfer_mint, destination, authority = (keys[i] for i in accounts)
    if transfer_mint != mint:
        raise _invalid_tx("mint_mismatch", "transfer is not of the required token")
    if data[9] != USDC_DECIMALS:
        raise _invalid_tx("decimals_mismatch", f"transfer decimals must be {USDC_DECIMALS}")
    if destination != associated_token_account(requirement["payTo"], mint, token_program):
        raise invalid_payment("recipient_mismatch", "Payment recipient is not ours")
    amount = int.from_bytes(data[1:9], "little")
    if amount != int(requirement["amount"]):
        raise invalid_payment("amount_mismatch", "Payment amount is not the one required")
    if authority == fee_payer:
        raise _invalid_tx("fee_payer_is_authority", "the fee payer may not transfer funds")
    if keys.index(authority) != 1:
        raise _invalid_tx("unexpected_signers", "the transfer authority must sign")

    if signatures[0] != Signature.default():
        raise _invalid_tx("fee_payer_signature_present",
                          "the fee payer's signature slot must be empty")
    signed = bytes([0x80]) + bytes(message)
    try:
        VerifyKey(bytes(authority)).verify(signed, bytes(signatures[1]))
    except (BadSignatureError, ValueError):
        raise invalid_payment("signature_mismatch",
                              "Payment signature is not the payer's") from None
    # The payment's id is its message, not its signature: a payer can sign one transfer
    # several times (ed25519 signatures are not unique per message), and the chain runs it once.
    return VerifiedPayment(network=network, payer=str(authority), amount_base_units=amount,
                           payment_id="solana:" + hashlib.sha256(bytes(message)).hexdigest())
