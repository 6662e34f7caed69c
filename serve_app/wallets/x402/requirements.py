"""What a top-up may be paid with: USDC on Base (EIP-3009) and USDC on Solana mainnet (SPL),
the `accepts` entries we issue, the result of a verified payment and the error a refused
payment answers.

An `accepts` entry has the published shape `{scheme: "exact", network, asset, amount,
payTo, maxTimeoutSeconds, extra}`: `amount` is a string of base units (USDC has 6 decimals),
`network` is CAIP-2 (`eip155:8453`, `solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp`), EVM entries
carry the token's EIP-712 domain (`extra: {name: "USD Coin", version: "2"}`) and Solana
entries the fee payer (`extra: {feePayer}`), the facilitator's address that signs and pays
the transaction fee.

Differences between the published reference and the x402 protocol, and what we do:

- The reference describes `amount` in the top-up's 402 answer as the *minimum* payment; the
  protocol's `exact` scheme pays exactly `amount`. We issue one entry per network for the
  amount the client asked (`POST /x402/top-up?amount=<usd>`, default the minimum), and accept
  a payment for any amount in [minimum top-up, MAX_TOP_UP_USD] as long as the signed transfer
  is exactly the amount its `accepted` requirement names (see payload.match_requirement).
- Refusals are answered in the reference's shape `{error: "X402_INVALID_PAYMENT", message,
  details: {reason}}` (error code in `error`, not the `{error: message, code}` of our
  standard errors); `reason` is one of the snake-case strings of this package.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from serve_app.errors import ApiError, invalid_request

SCHEME_EXACT = "exact"
X402_VERSION = 2

BASE_NETWORK = "eip155:8453"
BASE_CHAIN_ID = 8453
BASE_USDC = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
BASE_USDC_EIP712_NAME = "USD Coin"
BASE_USDC_EIP712_VERSION = "2"

SOLANA_NETWORK = "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"
SOLANA_USDC = "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v"

USDC_DECIMALS = 6
_UNIT = Decimal(10) ** USDC_DECIMALS

MAX_TIMEOUT_S = 300
MAX_TOP_UP_USD = Decimal(10000)

# x402 v1 names of the networks we offer.
V1_NETWORKS = {"base": BASE_NETWORK, "solana": SOLANA_NETWORK}
NETWORK_V1_NAMES = {v: k for k, v in V1_NETWORKS.items()}

# The asset we accept on each network.
ASSETS = {BASE_NETWORK: BASE_USDC, SOLANA_NETWORK: SOLANA_USDC}

INVALID_PAYMENT = "X402_INVALID_PAYMENT"
PAYMENT_REJECTED = "X402_PAYMENT_REJECTED"
FACILITATOR_UNAVAILABLE = "X402_FACILITATOR_UNAVAILABLE"

_EVM_ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")
_BASE_UNITS = re.compile(r"^[1-9][0-9]{0,30}$")


class X402PaymentError(ApiError):
    """A refused payment, answered as `{error: <code>, message, details: {reason, ...}}`
    (the reference's x402 error shape). `code` is the error code, `reason` the cause."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        reason: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        told = {"reason": reason, **(details or {})}
        super().__init__(status, message, code=code, headers=headers, details=told,
                         raw_body={"error": code, "message": message, "details": told})
        self.reason = reason


def invalid_payment(reason: str, message: str = "Invalid payment header",
                    **details: Any) -> X402PaymentError:
    """400 `X402_INVALID_PAYMENT` with `details.reason`."""
    return X402PaymentError(400, INVALID_PAYMENT, message, reason=reason, details=details)


@dataclass(frozen=True, slots=True)
class VerifiedPayment:
    """A payment whose signature and terms we checked (not yet settled).

    `payment_id` names this payment uniquely on its chain, for crediting it exactly once:
    `eip155:8453:<asset>:<from>:<authorization nonce>` lower-case for EIP-3009 (the token
    refuses a used nonce of an authorizer), the client's transaction signature in base58 for
    Solana.
    """

    network: str
    payer: str
    amount_base_units: int
    payment_id: str

    @property
    def amount_usd(self) -> Decimal:
        return from_base_units(self.amount_base_units)


def to_base_units(usd: Decimal | int | str) -> int:
    """USD (USDC) to base units; ValueError for a value that is not a multiple of 1e-6."""
    try:
        value = Decimal(usd)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise ValueError(f"not a number: {usd!r}") from exc
    if not value.is_finite():
        raise ValueError(f"not a finite number: {usd!r}")
    # Huge or tiny exponents are refused before any arithmetic (it could overflow, or run for
    # a minute on a number with a million digits).
    if value and not -USDC_DECIMALS - 30 <= value.adjusted() <= 30:
        raise ValueError(f"out of range: {usd!r}")
    units = value * _UNIT
    if units != units.to_integral_value():
        raise ValueError(f"more than {USDC_DECIMALS} decimals: {usd!r}")
    return int(units)


def from_base_units(units: int | str) -> Decimal:
    """Base units (int or digit string) to USD."""
    return Decimal(int(units)).scaleb(-USDC_DECIMALS)


def is_evm_address(value: object) -> bool:
    return isinstance(value, str) and bool(_EVM_ADDRESS.match(value))


def parse_base_units(value: object) -> int | None:
    """A positive amount in base units written as a canonical digit string, else None."""
    if isinstance(value, str) and _BASE_UNITS.match(value):
        return int(value)
    return None


def same_address(network: str, a: object, b: object) -> bool:
    """Addresses equal on `network` (EVM hex addresses compare case-insensitively)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    if network.startswith("eip155:"):
        return a.lower() == b.lower()
    return a == b


def _checksum(address: str, setting: str) -> str:
    from eth_utils import to_checksum_address

    if not is_evm_address(address):
        raise ValueError(f"{setting} is not an EVM address: {address!r}")
    return to_checksum_address(address)


def _solana_address(address: str, setting: str) -> str:
    from solders.pubkey import Pubkey

    try:
        return str(Pubkey.from_string(address))
    except ValueError as exc:
        raise ValueError(f"{setting} is not a Solana address: {address!r}") from exc


@dataclass(frozen=True, slots=True)
class PaymentConfig:
    """Where top-ups are paid. A network is offered when its receiving wallet is set (Solana
    also needs the facilitator's fee payer). Addresses are checked and normalised."""

    pay_to_evm: str | None = None
    pay_to_solana: str | None = None
    solana_fee_payer: str | None = None
    min_top_up_usd: Decimal = Decimal(5)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "pay_to_evm", self.pay_to_evm or None)
        set_(self, "pay_to_solana", self.pay_to_solana or None)
        set_(self, "solana_fee_payer", self.solana_fee_payer or None)
        if self.pay_to_evm:
            set_(self, "pay_to_evm", _checksum(self.pay_to_evm, "X402_PAY_TO_EVM"))
        if self.pay_to_solana:
            set_(self, "pay_to_solana",
                 _solana_address(self.pay_to_solana, "X402_PAY_TO_SOLANA"))
        if self.solana_fee_payer:
            set_(self, "solana_fee_payer",
                 _solana_address(self.solana_fee_payer, "X402_SOLANA_FEE_PAYER"))
        if bool(self.pay_to_solana) != bool(self.solana_fee_payer):
            raise ValueError("X402_PAY_TO_SOLANA and X402_SOLANA_FEE_PAYER go together")
        minimum = Decimal(self.min_top_up_usd)
        to_base_units(minimum)  # at most 6 decimals
        if not Decimal(0) < minimum <= MAX_TOP_UP_USD:
            raise ValueError(f"X402_MIN_TOP_UP_USD must be in (0, {MAX_TOP_UP_USD}]")
        set_(self, "min_top_up_usd", minimum)

    @classmethod
    def from_settings(cls, settings: Any, *, default_solana_fee_payer: str | None = None
                      ) -> PaymentConfig:
        """`default_solana_fee_payer`: the facilitator's own, when the settings name none."""
        return cls(
            pay_to_evm=settings.x402_pay_to_evm,
            pay_to_solana=settings.x402_pay_to_solana,
            solana_fee_payer=settings.x402_solana_fee_payer or default_solana_fee_payer,
            min_top_up_usd=settings.x402_min_top_up_usd,
        )

    @property
    def networks(self) -> tuple[str, ...]:
        """The networks offered, in the order of `accepts`."""
        out = []
        if self.pay_to_evm:
            out.append(BASE_NETWORK)
        if self.pay_to_solana:
            out.append(SOLANA_NETWORK)
        return tuple(out)

    @property
    def min_base_units(self) -> int:
        return to_base_units(self.min_top_up_usd)

    @property
    def max_base_units(self) -> int:
        return to_base_units(MAX_TOP_UP_USD)


def requirement_for(config: PaymentConfig, network: str, amount_base_units: int) -> dict:
    """The `accepts` entry we issue on `network` for `amount_base_units`."""
    if network == BASE_NETWORK and config.pay_to_evm:
        return {
            "scheme": SCHEME_EXACT,
            "network": BASE_NETWORK,
            "asset": BASE_USDC,
            "amount": str(amount_base_units),
            "payTo": config.pay_to_evm,
            "maxTimeoutSeconds": MAX_TIMEOUT_S,
            "extra": {"name": BASE_USDC_EIP712_NAME, "version": BASE_USDC_EIP712_VERSION},
        }
    if network == SOLANA_NETWORK and config.pay_to_solana:
        return {
            "scheme": SCHEME_EXACT,
            "network": SOLANA_NETWORK,
            "asset": SOLANA_USDC,
            "amount": str(amount_base_units),
            "payTo": config.pay_to_solana,
            "maxTimeoutSeconds": MAX_TIMEOUT_S,
            "extra": {"feePayer": config.solana_fee_payer},
        }
    raise ValueError(f"network not offered: {network}")


def top_up_base_units(config: PaymentConfig, amount_usd: Decimal | int | str) -> int:
    """A requested top-up in base units; 400 INVALID_REQUEST (field `amount`) when it is not
    a USD amount with at most 6 decimals in [minimum top-up, MAX_TOP_UP_USD]."""
    try:
        units = to_base_units(amount_usd)
    except ValueError:
        raise invalid_request("amount must be a USD amount with at most 6 decimals",
                              "amount") from None
    if not config.min_base_units <= units <= config.max_base_units:
        raise invalid_request(
            f"amount must be between {config.min_top_up_usd} and {MAX_TOP_UP_USD} USD",
            "amount")
    return units


def accepts(config: PaymentConfig, amount_usd: Decimal) -> list[dict]:
    """The `accepts` array of a top-up of `amount_usd`: one entry per network offered (empty
    when none is configured)."""
    units = top_up_base_units(config, amount_usd)
    return [requirement_for(config, network, units) for network in config.networks]
