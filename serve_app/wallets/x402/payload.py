"""The payment header (`PAYMENT-SIGNATURE`, also `X-402-Payment`, `X-PAYMENT`): base64 JSON
of an x402 PaymentPayload, and its match against the requirements we issue.

x402 v2: `{x402Version: 2, accepted: {scheme, network, asset, amount, payTo,
maxTimeoutSeconds, extra}, payload: {...}, resource?, extensions?}` where `accepted` is the
`accepts` entry the client signed. x402 v1: `{x402Version: 1, scheme, network, payload}`
with legacy network names (`base`, `solana`); it names no amount, so the amount is read
from the signed transfer itself. A v1 payment is forwarded to a facilitator in the v2 shape
(`PaymentPayload.to_wire`): the signatures cover the transfer, not the envelope.

Anything malformed answers 400 `{error: "X402_INVALID_PAYMENT", message, details: {reason}}`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .requirements import (
    ASSETS,
    MAX_TIMEOUT_S,
    SCHEME_EXACT,
    SOLANA_NETWORK,
    V1_NETWORKS,
    X402_VERSION,
    PaymentConfig,
    invalid_payment,
    parse_base_units,
    requirement_for,
    same_address,
)

# Request headers carrying a payment, canonical first.
PAYMENT_HEADERS = ("PAYMENT-SIGNATURE", "X-402-Payment", "X-PAYMENT")
# A payment header is a few hundred bytes (EVM) to ~1.5 KB (Solana); refuse big ones before
# decoding them.
MAX_HEADER_BYTES = 16 * 1024

_REQUIREMENT_STR_FIELDS = ("scheme", "network", "asset", "amount", "payTo")


@dataclass(frozen=True, slots=True)
class PaymentPayload:
    """A decoded payment. `network` is CAIP-2 (v1 names are translated); `accepted` is the
    requirement a v2 client signed (None for v1); `payload` the scheme's inner payload
    (`{authorization, signature}` for EVM, `{transaction}` for Solana); `raw` the JSON as
    sent."""

    x402_version: int
    scheme: str
    network: str
    payload: dict[str, Any]
    accepted: dict[str, Any] | None
    resource: dict[str, Any] | None
    extensions: dict[str, Any] | None
    raw: dict[str, Any]

    def to_wire(self, requirement: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The payload in the x402 v2 wire shape, for a facilitator: a v2 payment as sent, a
        v1 payment wrapped with `requirement` as its `accepted`."""
        if self.x402_version == X402_VERSION:
            return self.raw
        if requirement is None:
            raise ValueError("a v1 payment needs the requirement it pays")
        return {"x402Version": X402_VERSION, "accepted": dict(requirement),
                "payload": self.payload}


def _malformed(message: str) -> Exception:
    return invalid_payment("malformed_payload", f"Invalid payment payload: {message}")


def _optional_dict(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _malformed(f"{key} must be an object")
    return value


def parse_payment_payload(data: object) -> PaymentPayload:
    """A PaymentPayload from its decoded JSON (as in a header, or in a facilitator request)."""
    if not isinstance(data, dict):
        raise _malformed("not a JSON object")
    version = data.get("x402Version")
    if type(version) is not int or version not in (1, 2):
        raise invalid_payment("unsupported_version",
                              "Unsupported x402 version (expected 2, or 1)")
    inner = data.get("payload")
    if not isinstance(inner, dict):
        raise _malformed("payload must be an object")
    if version == 2:
        accepted = data.get("accepted")
        if not isinstance(accepted, dict):
            raise _malformed("accepted must be an object")
        for key in _REQUIREMENT_STR_FIELDS:
            if not isinstance(accepted.get(key), str):
                raise _malformed(f"accepted.{key} must be a string")
        timeout = accepted.get("maxTimeoutSeconds")
        if type(timeout) is not int:
            raise _malformed("accepted.maxTimeoutSeconds must be an integer")
        if not isinstance(accepted.get("extra", {}), dict):
            raise _malformed("accepted.extra must be an object")
        return PaymentPayload(2, accepted["scheme"], accepted["network"], inner, accepted,
                              _optional_dict(data, "resource"),
                              _optional_dict(data, "extensions"), data)
    scheme, network = data.get("scheme"), data.get("network")
    if not isinstance(scheme, str) or not isinstance(network, str):
        raise _malformed("scheme and network must be strings")
    return PaymentPayload(1, scheme, V1_NETWORKS.get(network, network), inner, None, None,
                          None, data)


def decode_payment_header(value: str) -> PaymentPayload:
    """Decode a payment header (base64 of the JSON, standard or URL-safe alphabet, padding
    optional)."""
    if not isinstance(value, str):
        raise invalid_payment("malformed_header")
    value = value.strip()
    if len(value) > MAX_HEADER_BYTES:
        raise invalid_payment("header_too_large",
                              f"Payment header larger than {MAX_HEADER_BYTES} bytes")
    if not value:
        raise invalid_payment("malformed_header", "Empty payment header")
    try:
        if "-" in value or "_" in value:
            value = value.translate(str.maketrans("-_", "+/"))
        raw = base64.b64decode(value + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid_payment("malformed_header", "Payment header is not base64") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise invalid_payment("malformed_header",
                              "Payment header is not base64-encoded JSON") from None
    return parse_payment_payload(data)


def payload_amount(payload: PaymentPayload) -> int:
    """The amount (base units) a payment transfers as its envelope states it: v2
    `accepted.amount`; v1 the signed transfer's own amount."""
    if payload.accepted is not None:
        amount = parse_base_units(payload.accepted["amount"])
    elif payload.network == SOLANA_NETWORK:
        from .solana import transfer_amount

        amount = transfer_amount(payload.payload)
    else:
        authorization = payload.payload.get("authorization")
        value = authorization.get("value") if isinstance(authorization, dict) else None
        amount = parse_base_units(value)
    if amount is None:
        raise invalid_payment("invalid_amount", "Payment amount is not a positive integer")
    return amount


def check_payload_matches(payload: PaymentPayload, requirement: Mapping[str, Any]) -> None:
    """The payment is for `requirement`: same scheme and network and, for v2, the `accepted`
    it signed names the same asset, payTo, amount and fee payer and no longer timeout."""
    network = requirement["network"]
    if payload.scheme != SCHEME_EXACT or requirement["scheme"] != SCHEME_EXACT:
        raise invalid_payment("unsupported_scheme", "Only the exact scheme is accepted")
    if payload.network != network:
        raise invalid_payment("network_mismatch", "Payment network does not match")
    accepted = payload.accepted
    if accepted is None:
        return
    if not same_address(network, accepted["asset"], requirement["asset"]):
        raise invalid_payment("asset_mismatch", "Payment asset is not the one required")
    if not same_address(network, accepted["payTo"], requirement["payTo"]):
        raise invalid_payment("pay_to_mismatch", "Payment recipient is not the one required")
    if parse_base_units(accepted["amount"]) != int(requirement["amount"]):
        raise invalid_payment("amount_mismatch", "Payment amount is not the one required")
    timeout = accepted["maxTimeoutSeconds"]
    if not 0 < timeout <= int(requirement["maxTimeoutSeconds"]):
        raise invalid_payment("timeout_too_long",
                              "Payment maxTimeoutSeconds exceeds the one required")
    if network == SOLANA_NETWORK:
        fee_payer = (accepted.get("extra") or {}).get("feePayer")
        if fee_payer != requirement["extra"]["feePayer"]:
            raise invalid_payment("fee_payer_mismatch", "Payment fee payer is not ours")


def match_requirement(payload: PaymentPayload, config: PaymentConfig) -> dict:
    """The requirement (an `accepts` entry we would issue) this payment pays: scheme exact,
    a network we offer, our asset and payTo there, an amount in [minimum top-up,
    MAX_TOP_UP_USD], maxTimeoutSeconds at most ours and, on Solana, our fee payer."""
    if payload.scheme != SCHEME_EXACT:
        raise invalid_payment("unsupported_scheme", "Only the exact scheme is accepted")
    if payload.network not in config.networks:
        raise invalid_payment("unsupported_network",
                              f"Payment network not accepted: {payload.network}",
                              accepted=list(config.networks))
    network = payload.network
    if payload.accepted is not None:
        if not same_address(network, payload.accepted["asset"], ASSETS[network]):
            raise invalid_payment("asset_mismatch", "Only USDC is accepted")
        if payload.accepted["maxTimeoutSeconds"] > MAX_TIMEOUT_S:
            raise invalid_payment("timeout_too_long",
                                  f"maxTimeoutSeconds must be at most {MAX_TIMEOUT_S}")
    amount = payload_amount(payload)
    if not config.min_base_units <= amount <= config.max_base_units:
        raise invalid_payment("amount_out_of_range",
                              "Payment amount is outside the accepted top-up range",
                              minimum=str(config.min_base_units),
                              maximum=str(config.max_base_units))
    requirement = requirement_for(config, network, amount)
    check_payload_matches(payload, requirement)
    return requirement
