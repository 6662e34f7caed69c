"""Step 8 of a request: every header an answer carries beyond the service headers (model,
balance, rate limits), written here and nowhere else, and the JSON body, compressed when the
client accepts it. The outermost middleware sends what the context holds."""

from __future__ import annotations

import gzip
import math
from typing import Any

import brotli
import orjson
from fastapi import Response

from serve_app.billing.ledger import Balances
from serve_app.limits.rate_limits import LimitState
from serve_app.models.catalog import CatalogModel
from serve_app.money import from_nanos
from serve_app.pipeline.context import LateHeader, RequestContext

# Below this size compression costs more than it saves.
MIN_COMPRESS_BYTES = 1024


def _accepted_encoding(accept_encoding: str) -> str | None:
    offered = {part.split(";", 1)[0].strip().lower() for part in accept_encoding.split(",")}
    if "br" in offered:
        return "br"
    if "gzip" in offered:
        return "gzip"
    return None


def json_response(ctx: RequestContext, payload: Any, *, compress: bool = False) -> Response:
    """JSON (numpy arrays allowed), compressed with br or gzip when the client accepts it."""
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    headers: dict[str, str] = {}
    encoding = _accepted_encoding(ctx.accept_encoding) if compress else None
    if encoding and len(body) >= MIN_COMPRESS_BYTES:
        body = brotli.compress(body, quality=4) if encoding == "br" else gzip.compress(
            body, compresslevel=5)
        headers["Content-Encoding"] = encoding
        headers["Vary"] = "Accept-Encoding"
    return Response(body, media_type="application/json", headers=headers)


def model_headers(ctx: RequestContext, model: CatalogModel, router: str) -> None:
    """`x-service-model-*` and the model's deprecation headers."""
    headers = ctx.headers
    headers["x-service-model-id"] = model.id
    headers["x-service-model-name"] = model.name
    headers["x-service-model-router"] = router
    headers.update(model.deprecation_headers())


def balance_headers(ctx: RequestContext, before: Balances) -> None:
    """`x-service-balance-usd` / `-diem`: the balance before the request."""
    ctx.headers["x-service-balance-usd"] = f"{from_nanos(before.usd_nanos):f}"
    ctx.headers["x-service-balance-diem"] = f"{from_nanos(before.diem_nanos):f}"


def remaining_credit_header(ctx: RequestContext, remaining: LateHeader) -> None:
    """`X-Balance-Remaining` of a wallet's answer, read when the answer starts."""
    ctx.headers["X-Balance-Remaining"] = remaining


def rate_limit_headers(ctx: RequestContext, state: LimitState) -> None:
    """`x-ratelimit-*` of the count that admitted (or refused) the request."""
    headers = ctx.headers
    headers["x-ratelimit-limit-requests"] = str(state.requests_limit)
    headers["x-ratelimit-remaining-requests"] = str(state.requests_remaining)
    headers["x-ratelimit-reset-requests"] = str(math.ceil(state.reset_at_ms / 1000))
    if state.tokens_limit:
        headers["x-ratelimit-limit-tokens"] = str(state.tokens_limit)
        headers["x-ratelimit-remaining-tokens"] = str(state.tokens_remaining)
        headers["x-ratelimit-reset-tokens"] = str(
            max(0, math.ceil((state.reset_at_ms - state.now_ms) / 1000)))
    headers["x-ratelimit-type"] = state.caller_type


def content_headers(ctx: RequestContext, *, blurred: bool | None = None) -> None:
    """The content-safety headers of a generated answer."""
    if blurred is not None:
        ctx.headers["x-service-is-blurred"] = "true" if blurred else "false"
    ctx.headers["x-service-is-content-violation"] = "false"
