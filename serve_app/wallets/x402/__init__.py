"""x402 top-ups: the payment requirements we issue (`accepts`), the payment header, our own
checks of EIP-3009 (Base) and Solana `exact` payments, a facilitator client, and a development
facilitator that moves no money (dev_facilitator, imported on its own).

The top-up flow: `accepts(config, amount)` answers the 402; `decode_payment_header(value)`
then `match_requirement(payload, config)` give the requirement a payment pays;
`verify_evm` / `verify_solana` check it locally (`VerifiedPayment.payment_id` names it for
exactly-once credit); `FacilitatorClient.verify` / `.settle` have it checked against the chain
and submitted.
"""

from .evm import verify_evm
from .facilitator import FacilitatorClient, SettleResult, VerifyResult
from .payload import (
    MAX_HEADER_BYTES,
    PAYMENT_HEADERS,
    PaymentPayload,
    check_payload_matches,
    decode_payment_header,
    match_requirement,
    parse_payment_payload,
)
from .requirements import (
    BASE_NETWORK,
    BASE_USDC,
    MAX_TIMEOUT_S,
    MAX_TOP_UP_USD,
    SOLANA_NETWORK,
    SOLANA_USDC,
    USDC_DECIMALS,
    PaymentConfig,
    VerifiedPayment,
    X402PaymentError,
    accepts,
    from_base_units,
    requirement_for,
    to_base_units,
    top_up_base_units,
)
from .solana import verify_solana


def verify_payment(payload: PaymentPayload, requirement: dict,
                   now: float | None = None) -> VerifiedPayment:
    """verify_evm or verify_solana, by the requirement's network."""
    if requirement["network"] == SOLANA_NETWORK:
        return verify_solana(payload, requirement)
    return verify_evm(payload, requirement, now)


__all__ = [
    "BASE_NETWORK",
    "BASE_USDC",
    "MAX_HEADER_BYTES",
    "MAX_TIMEOUT_S",
    "MAX_TOP_UP_USD",
    "PAYMENT_HEADERS",
    "SOLANA_NETWORK",
    "SOLANA_USDC",
    "USDC_DECIMALS",
    "FacilitatorClient",
    "PaymentConfig",
    "PaymentPayload",
    "SettleResult",
    "VerifiedPayment",
    "VerifyResult",
    "X402PaymentError",
    "accepts",
    "check_payload_matches",
    "decode_payment_header",
    "from_base_units",
    "match_requirement",
    "parse_payment_payload",
    "requirement_for",
    "to_base_units",
    "top_up_base_units",
    "verify_evm",
    "verify_payment",
    "verify_solana",
]
