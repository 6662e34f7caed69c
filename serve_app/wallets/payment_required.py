"""The 402 answers of wallet access, in the published shapes.

- An inference call without credentials: the x402 discovery body (what to pay, how to sign
  in, how to use a key instead).
- A wallet whose credit does not cover the request: `PAYMENT_REQUIRED` with top-up
  instructions and a fresh sign-in challenge.

Both carry the `PAYMENT-REQUIRED` header: the requirements as base64 JSON, for clients that
read the header rather than the body. An API key's account without balance keeps the
standard `INSUFFICIENT_BALANCE` error (billing/ledger.py).
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from typing import Any

from fastapi import Request

from serve_app.db.tables import utcnow
from serve_app.errors import ApiError
from serve_app.money import from_nanos
from serve_app.wallets import siwx
from serve_app.wallets.x402.requirements import (
    BASE_NETWORK,
    SOLANA_NETWORK,
    USDC_DECIMALS,
    X402_VERSION,
    PaymentConfig,
    accepts,
)

SUGGESTED_TOP_UP_USD = Decimal(10)
RESOURCE_DESCRIPTION = "Inference API"
TOP_UP_ROUTE = "POST /api/v1/x402/top-up"
_CHAIN_NAMES = {BASE_NETWORK: "base", SOLANA_NETWORK: "solana"}  # `supportedChains`


def suggested_top_up(config: PaymentConfig) -> Decimal:
    return max(SUGGESTED_TOP_UP_USD, config.min_top_up_usd)


def _origin(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


def encode_header(body: dict[str, Any]) -> str:
    """A `PAYMENT-REQUIRED` header: the requirements as base64 JSON."""
    return base64.b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def resource(url: str, description: str = RESOURCE_DESCRIPTION) -> dict[str, str]:
    return {"url": url, "description": description, "mimeType": "application/json"}


def _challenge_uri(request: Request, domain: str) -> str:
    # A configured public name is served over TLS (often ended by a proxy before us).
    scheme = request.url.scheme if domain == request.url.netloc.lower() else "https"
    return f"{scheme}://{domain}{request.url.path}"


def discovery(request: Request, config: PaymentConfig, domain: str) -> ApiError:
    """402 for an inference request with neither a key nor a wallet sign-in."""
    origin = _origin(request)
    now = utcnow()
    body = {
        "x402Version": X402_VERSION,
        "resource": resource(str(request.url)),
        "accepts": accepts(config, suggested_top_up(config)),
        "extensions": siwx.discovery_extension(domain, _challenge_uri(request, domain), now),
        "authOptions": {
            "apiKey": {"header": "Authorization: Bearer YOUR_API_KEY",
                       "getKey": f"{origin}/api/v1/api_keys",
                       "docs": f"{origin}/docs"},
            "x402Wallet": {"header": "SIGN-IN-WITH-X", "legacyHeader": "X-Sign-In-With-X",
                           "topUp": TOP_UP_ROUTE, "docs": f"{origin}/docs#/x402"},
        },
    }
    message = ("Payment required: send an API key (Authorization: Bearer) or sign in with a "
               "wallet (SIGN-IN-WITH-X) that has credit")
    header = encode_header({"error": message, **body})
    return ApiError(402, message, extra=body, headers={"PAYMENT-REQUIRED": header})


def insufficient_credit(request: Request, config: PaymentConfig, domain: str, *,
                        balance_nanos: int, needed_nanos: int | None) -> ApiError:
    """402 for a signed-in wallet whose credit does not cover the request."""
    now = utcnow()
    evm = next((a for a in accepts(config, config.min_top_up_usd)
                if a["network"] == BASE_NETWORK), None)
    body: dict[str, Any] = {
        "reason": "insufficient_balance",
        "message": "Insufficient x402 balance",
        "currentBalanceUsd": float(from_nanos(balance_nanos)),
        "description": RESOURCE_DESCRIPTION,
        "suggestedTopUpUsd": float(suggested_top_up(config)),
        "minimumTopUpUsd": float(config.min_top_up_usd),
        "supportedTokens": ["USDC"],
        "supportedChains": [_CHAIN_NAMES[network] for network in config.networks],
        "topUpInstructions": {
            "step1": f"{TOP_UP_ROUTE} with no payment header to get payment requirements",
            "step2": "Choose a payment option from accepts and sign a USDC transfer "
                     "authorization using an x402 client",
            "step3": f"{TOP_UP_ROUTE} with the signed PAYMENT-SIGNATURE header",
            "receiverWallet": evm["payTo"] if evm else "",
            "tokenAddress": evm["asset"] if evm else "",
            "tokenDecimals": USDC_DECIMALS,
            "network": evm["network"] if evm else "",
            "minimumAmountUsd": float(config.min_top_up_usd),
        },
        "siwxChallenge": siwx.challenge(domain, _challenge_uri(request, domain), now),
    }
    if needed_nanos is not None:
        body["minimumBalanceUsd"] = float(from_nanos(needed_nanos))
    header = encode_header({"x402Version": X402_VERSION, "error": "Payment required",
                            "resource": resource(str(request.url)),
                            "accepts": accepts(config, suggested_top_up(config))})
    return ApiError(402, "Payment required", code="PAYMENT_REQUIRED", extra=body,
                    headers={"PAYMENT-REQUIRED": header})
