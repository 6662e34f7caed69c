"""Money as integers: balances, limits and charges are kept in nano-units (1e-9 USD or DIEM).

Integers add exactly on every database, and a nano-unit is fine enough for per-token prices
(0.15 USD per million tokens is 150 nano-USD per token).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

NANOS_PER_UNIT = 10**9
# The largest amount one money figure may be given (a key's spending limit, a credit), in
# units: its nanos (9e18) fit a signed 64-bit column (at most 2**63 - 1, about 9.22e18), which
# the reference's own bound of 9,999,999,999 would not.
MAX_AMOUNT_UNITS = 9_000_000_000


def to_nanos(amount: Decimal | float | int | str) -> int:
    value = Decimal(str(amount)) * NANOS_PER_UNIT
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def from_nanos(nanos: int) -> Decimal:
    return (Decimal(nanos) / NANOS_PER_UNIT).normalize()


def as_number(nanos: int | None) -> float | int | None:
    """A JSON-friendly number (int when whole) for a nano-unit amount."""
    if nanos is None:
        return None
    value = from_nanos(nanos)
    return int(value) if value == value.to_integral_value() else float(value)
