"""The x402 `exact` scheme on EVM chains: an EIP-3009 `TransferWithAuthorization` signed as
EIP-712 typed data by the payer, which a facilitator submits to the token contract.

Inner payload: `{authorization: {from, to, value, validAfter, validBefore, nonce},
signature}` (integers as decimal strings, `nonce` 32 bytes hex, `signature` 65 bytes hex).

We check it without a node: the signer recovered from the EIP-712 digest over the domain
`{name, version, chainId, verifyingContract: asset}` must be `from`; `to` and `value` must be
what the requirement says, and the authorization must be valid now, as the scheme asks
(`validAfter` not in the future, `validBefore` still ahead by the settling margin). Its
window may be longer than the requirement's `maxTimeoutSeconds` (a client that signs
`validAfter: 0`, `validBefore: now + 600`), but `validBefore` may be at most
MAX_VALID_AHEAD_S away. Like the token contract we accept only
low-s signatures with v 27/28. Not accepted (the protocol allows them): smart-wallet
signatures (EIP-1271 / ERC-6492, which need a node to check) and the Permit2 transfer method.
The payer's balance and whether the nonce was used are the facilitator's (and the chain's)
to check.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data

from .payload import PaymentPayload
from .requirements import (
    BASE_USDC_EIP712_NAME,
    BASE_USDC_EIP712_VERSION,
    SCHEME_EXACT,
    VerifiedPayment,
    invalid_payment,
    is_evm_address,
)

# Clock difference tolerated between the payer, us and the chain.
CLOCK_SKEW_S = 10
# An authorization must stay valid this long after we check it, for the facilitator to
# submit it (the protocol's facilitator asks for 6 s).
SETTLE_MARGIN_S = 6
# How far ahead `validBefore` may be: an hour. A signed transfer outstanding for longer is a
# liability for the payer (anyone holding it may submit it until then) and nothing a top-up
# needs.
MAX_VALID_AHEAD_S = 3600

_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_UINT = re.compile(r"^(0|[1-9][0-9]{0,77})$")
_NONCE = re.compile(r"^0x[0-9a-fA-F]{64}$")
_SIGNATURE = re.compile(r"^(0x)?[0-9a-fA-F]{130}$")

_DOMAIN_TYPE = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]
_AUTHORIZATION_TYPE = [
    {"name": "from", "type": "address"},
    {"name": "to", "type": "address"},
    {"name": "value", "type": "uint256"},
    {"name": "validAfter", "type": "uint256"},
    {"name": "validBefore", "type": "uint256"},
    {"name": "nonce", "type": "bytes32"},
]


def chain_id(network: str) -> int:
    """8453 for `eip155:8453`."""
    prefix, _, reference = network.partition(":")
    if prefix != "eip155" or not reference.isdigit():
        raise invalid_payment("unsupported_network", f"Not an EVM network: {network}")
    return int(reference)


def _uint(value: object, field: str) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and _UINT.match(value):
        return int(value)
    raise invalid_payment("malformed_payload", f"Invalid payment payload: {field}")


def _address(value: object, field: str) -> str:
    if not is_evm_address(value):
        raise invalid_payment("malformed_payload", f"Invalid payment payload: {field}")
    return str(value)


def authorization_digest(authorization: Mapping[str, Any], *, chain: int, asset: str,
                         name: str, version: str) -> Any:
    """The EIP-712 signable message of a TransferWithAuthorization."""
    return encode_typed_data(full_message={
        "types": {"EIP712Domain": _DOMAIN_TYPE, "TransferWithAuthorization": _AUTHORIZATION_TYPE},
        "primaryType": "TransferWithAuthorization",
        "domain": {"name": name, "version": version, "chainId": chain,
                   "verifyingContract": asset},
        "message": dict(authorization),
    })


def _signature_bytes(signature: object) -> bytes:
    if not isinstance(signature, str):
        raise invalid_payment("invalid_signature", "Payment signature missing")
    if not _SIGNATURE.match(signature):
        raise invalid_payment("invalid_signature",
                              "Payment signature must be a 65-byte ECDSA signature "
                              "(smart-wallet signatures are not accepted)")
    raw = bytes.fromhex(signature.removeprefix("0x"))
    v = raw[64]
    if v in (0, 1):
        raw = raw[:64] + bytes([v + 27])
    elif v not in (27, 28):
        raise invalid_payment("invalid_signature", "Payment signature has an invalid v")
    s = int.from_bytes(raw[32:64], "big")
    if not 0 < s <= _SECP256K1_N // 2:
        raise invalid_payment("invalid_signature", "Payment signature is not canonical")
    return raw


def verify_evm(payload: PaymentPayload, requirement: Mapping[str, Any],
               now: float | None = None) -> VerifiedPayment:
    """Check an EIP-3009 payment against `requirement` (an `accepts` entry) at `now`."""
    now = time.time() if now is None else now
    network = requirement["network"]
    if payload.scheme != SCHEME_EXACT or payload.network != network:
        raise invalid_payment("network_mismatch", "Payment is not for this requirement")
    chain = chain_id(network)
    inner = payload.payload
    if "permit2Authorization" in inner:
        raise invalid_payment("unsupported_transfer_method",
                              "Only EIP-3009 transferWithAuthorization is accepted")
    authorization = inner.get("authorization")
    if not isinstance(authorization, dict):
        raise invalid_payment("malformed_payload", "Invalid payment payload: authorization")
    payer = _address(authorization.get("from"), "authorization.from")
    to = _address(authorization.get("to"), "authorization.to")
    value = _uint(authorization.get("value"), "authorization.value")
    valid_after = _uint(authorization.get("validAfter"), "authorization.validAfter")
    valid_before = _uint(authorization.get("validBefore"), "authorization.validBefore")
    nonce = authorization.get("nonce")
    if not isinstance(nonce, str) or not _NONCE.match(nonce):
        raise invalid_payment("malformed_payload", "Invalid payment payload: authorization.nonce")

    if to.lower() != str(requirement["payTo"]).lower():
        raise invalid_payment("recipient_mismatch", "Payment recipient is not ours")
    if value != int(requirement["amount"]):
        raise invalid_payment("amount_mismatch", "Payment amount is not the one required")
    if valid_after > now + CLOCK_SKEW_S:
        raise invalid_payment("not_yet_valid", "Payment authorization is not valid yet")
    if valid_before < now + SETTLE_MARGIN_S:
        raise invalid_payment("expired", "Payment authorization has expired")
    if valid_before - now > MAX_VALID_AHEAD_S + CLOCK_SKEW_S:
        raise invalid_payment(
            "timeout_too_long",
            f"Payment authorization's validBefore is more than {MAX_VALID_AHEAD_S} seconds "
            f"ahead: sign one valid for at most {MAX_VALID_AHEAD_S // 60} minutes")

    signature = _signature_bytes(inner.get("signature"))
    extra = requirement.get("extra") or {}
    message = authorization_digest(
        {"from": payer, "to": to, "value": value, "validAfter": valid_after,
         "validBefore": valid_before, "nonce": bytes.fromhex(nonce[2:])},
        chain=chain, asset=requirement["asset"],
        name=extra.get("name", BASE_USDC_EIP712_NAME),
        version=extra.get("version", BASE_USDC_EIP712_VERSION))
    try:
        signer = Account.recover_message(message, signature=signature)
    except Exception:  # eth-keys raises several types for an unrecoverable signature
        raise invalid_payment("invalid_signature", "Payment signature is invalid") from None
    if signer.lower() != payer.lower():
        raise invalid_payment("signature_mismatch",
                              "Payment signature is not the payer's")
    from eth_utils import to_checksum_address

    payment_id = f"{network}:{requirement['asset']}:{payer}:{nonce}".lower()
    return VerifiedPayment(network=network, payer=to_checksum_address(payer),
                           amount_base_units=value, payment_id=payment_id)
