"""Client of an x402 facilitator (the service that checks a payment against the chain and
submits it): `POST /verify`, `POST /settle`, `GET /supported` over HTTP.

Request of verify and settle: `{x402Version, paymentPayload, paymentRequirements}` with the
v2 PaymentPayload and the one requirement it pays. Answers: VerifyResponse `{isValid,
invalidReason?, invalidMessage?, payer?}` and SettleResponse `{success, errorReason?,
errorMessage?, payer?, transaction, network}`. Facilitators answer a refusal with 200 or
with a 4xx carrying that same body; both are read as a refusal.

A facilitator we cannot reach, that times out, fails (5xx) or answers something else is a
502 `X402_FACILITATOR_UNAVAILABLE` standard error; a refusal is a 402 `{error:
"X402_PAYMENT_REJECTED", message, details: {reason}}` (our x402 error shape).

On Solana the settled `transaction` is the transaction's first signature, the fee payer's:
not the client's signature that names the payment (`VerifiedPayment.payment_id`).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from serve_app.errors import ApiError

from .payload import PaymentPayload
from .requirements import FACILITATOR_UNAVAILABLE, PAYMENT_REJECTED, X402PaymentError

logger = logging.getLogger("serve_app.x402")

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class VerifyResult:
    is_valid: bool
    payer: str | None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SettleResult:
    success: bool
    transaction: str
    network: str
    payer: str | None
    raw: dict[str, Any] = field(default_factory=dict)

    def payment_response(self) -> dict[str, Any]:
        """The settlement result the client is told: `{success, network, payer,
        transaction}`."""
        return {"success": self.success, "network": self.network, "payer": self.payer,
                "transaction": self.transaction}

    def payment_response_header(self) -> str:
        """The `PAYMENT-RESPONSE` header: base64 of the JSON of `payment_response()`."""
        text = json.dumps(self.payment_response(), separators=(",", ":"))
        return base64.b64encode(text.encode()).decode()


def facilitator_unavailable(message: str) -> ApiError:
    return ApiError(502, message, code=FACILITATOR_UNAVAILABLE)


def payment_rejected(reason: str, message: str | None = None) -> X402PaymentError:
    text = f"Payment rejected by the facilitator: {reason}"
    if message:
        text = f"{text} ({message})"
    return X402PaymentError(402, PAYMENT_REJECTED, text, reason=reason)


class FacilitatorClient:
    """An x402 facilitator at `base_url`. Use as an async context manager, or call
    `aclose()`."""

    def __init__(self, base_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 headers: Mapping[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=dict(headers or {}),
                                         transport=transport, follow_redirects=False)

    async def __aenter__(self) -> FacilitatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def verify(self, payload: PaymentPayload | Mapping[str, Any],
                     requirement: Mapping[str, Any]) -> VerifyResult:
        """The facilitator's verdict on `payload` paying `requirement`; raises the 402
        refusal when it is not valid."""
        body = await self._post("verify", payload, requirement, "isValid")
        if not body["isValid"]:
            raise payment_rejected(_text(body.get("invalidReason")) or "invalid_payment",
                                   _text(body.get("invalidMessage")))
        return VerifyResult(True, _text(body.get("payer")), body)

    async def settle(self, payload: PaymentPayload | Mapping[str, Any],
                     requirement: Mapping[str, Any]) -> SettleResult:
        """Submit `payload`; raises the 402 refusal when the facilitator could not settle."""
        body = await self._post("settle", payload, requirement, "success")
        if not body["success"]:
            raise payment_rejected(_text(body.get("errorReason")) or "settlement_failed",
                                   _text(body.get("errorMessage")))
        transaction, network = body.get("transaction"), body.get("network")
        if not isinstance(transaction, str) or not transaction or not isinstance(network, str):
            raise facilitator_unavailable("The payment facilitator answered a settlement "
                                          "without its transaction")
        return SettleResult(True, transaction, network, _text(body.get("payer")), body)

    async def supported(self) -> dict[str, Any]:
        """`GET /supported`: `{kinds: [{x402Version, scheme, network, extra?}], ...}`."""
        response = await self._send("GET", "supported")
        body = _json(response)
        if response.status_code != 200 or not isinstance(body, dict):
            raise facilitator_unavailable(
                f"The payment facilitator answered HTTP {response.status_code} to /supported")
        return body

    async def _post(self, operation: str, payload: PaymentPayload | Mapping[str, Any],
                    requirement: Mapping[str, Any], verdict: str) -> dict[str, Any]:
        wire = payload.to_wire(requirement) if isinstance(payload, PaymentPayload) \
            else dict(payload)
        request = {"x402Version": wire.get("x402Version", 2), "paymentPayload": wire,
                   "paymentRequirements": dict(requirement)}
        response = await self._send("POST", operation, json=request)
        body = _json(response)
        if isinstance(body, dict) and isinstance(body.get(verdict), bool) and (
                response.status_code == 200
                or (400 <= response.status_code < 500 and not body[verdict])):
            return body
        logger.warning("x402 facilitator %s answered HTTP %s: %.200s", operation,
                       response.status_code, response.text)
        raise facilitator_unavailable(
            f"The payment facilitator answered HTTP {response.status_code} to /{operation}")

    async def _send(self, method: str, operation: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.base_url}/{operation}"
        try:
            return await self._client.request(method, url, **kwargs)
        except httpx.TimeoutException:
            logger.warning("x402 facilitator %s timed out", url)
            raise facilitator_unavailable(
                "The payment facilitator did not answer in time; try again") from None
        except httpx.HTTPError as exc:
            logger.warning("x402 facilitator %s unreachable: %s", url, exc)
            raise facilitator_unavailable(
                "The payment facilitator is unreachable; try again later") from None


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
