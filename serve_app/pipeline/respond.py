"""Step 8 of a request: the setters of every header the request's context carries (model,
balance, rate limits, content safety, a route's own: upscale factor, pagination...), the only
writers of `ctx.headers`. The outermost middleware sends what the context holds; the headers of
the body itself (type, encoding, disposition) come with the response that renders it."""

from __future__ import annotations

import logging
from collections.abc import Container
from urllib.parse import quote

from serve_app.accounts.key_store import KeyRecord
from serve_app.billing.ledger import Balances
from serve_app.limits.limit_headers import DIALECT_MARKERS, LimitState, limit_headers
from serve_app.limits.rate_limits import RateLimits
from serve_app.models.catalog import CatalogModel
from serve_app.money import from_nanos
from serve_app.pipeline.context import LateHeader, RequestContext

logger = logging.getLogger("serve_app.pipeline")

# The longest an answer waits for the key's counts; past it, it goes without the headers.
KEY_WINDOWS_TIMEOUT_S = 1.0


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
    ctx.headers.update(limit_headers(window=state))


def tells_its_limits(ctx: RequestContext, answer: Container[str]) -> bool:
    """Whether the answer carries rate-limit headers already (`answer`: its header names)."""
    return any(name in ctx.headers or name in answer for name in DIALECT_MARKERS)


async def key_rate_limit_headers(ctx: RequestContext, key: KeyRecord, limits: RateLimits,
                                 models: list[CatalogModel]) -> None:
    """`x-ratelimit-*` of an authenticated answer that made no limiter decision (a route
    without a model: /models, /api_keys, /billing, a job's retrieval): the key's window
    nearest its limits, read from the shared count without counting a request or writing
    anything."""
    try:
        with ctx.step("limits-read"):
            state = await limits.current(key, models, timeout_s=KEY_WINDOWS_TIMEOUT_S)
    except Exception as exc:  # the count is out of reach: the answer goes without them
        logger.warning("rate-limit headers left out: the key's counts could not be read (%s)",
                       exc)
        return
    if state is not None:
        rate_limit_headers(ctx, state)


def content_headers(ctx: RequestContext, *, blurred: bool | None = None) -> None:
    """The content-safety headers of a generated answer."""
    if blurred is not None:
        ctx.headers["x-service-is-blurred"] = "true" if blurred else "false"
    ctx.headers["x-service-is-content-violation"] = "false"


def upscale_factor_header(ctx: RequestContext, scale: float) -> None:
    """`x-service-upscale-factor`: the scale an upscale applied."""
    ctx.headers["x-service-upscale-factor"] = f"{scale:g}"


def enhanced_prompt_header(ctx: RequestContext, prompt: str) -> None:
    """`x-service-enhanced-prompt`: the rewritten prompt, URL-encoded."""
    ctx.headers["x-service-enhanced-prompt"] = quote(prompt, safe="")


def audio_job_headers(ctx: RequestContext, audio_format: str | None,
                      inference_ms: float | None) -> None:
    """A finished audio job's `x-service-audio-format` and `x-service-inference-time` (ms),
    each when known."""
    if audio_format:
        ctx.headers["x-service-audio-format"] = audio_format
    if inference_ms is not None:
        ctx.headers["x-service-inference-time"] = str(round(inference_ms))


def pagination_headers(ctx: RequestContext, *, page_size: int, page: int, total: int,
                       total_pages: int) -> None:
    """`x-pagination-*` of a paged list."""
    ctx.headers.update({
        "x-pagination-limit": str(page_size),
        "x-pagination-page": str(page),
        "x-pagination-total": str(total),
        "x-pagination-total-pages": str(total_pages),
    })


def next_cursor_header(ctx: RequestContext, cursor: str | None) -> None:
    """`x-next-cursor` of a page that has a next one."""
    if cursor:
        ctx.headers["x-next-cursor"] = cursor


def payment_response_header(ctx: RequestContext, receipt: str) -> None:
    """`PAYMENT-RESPONSE`: an x402 payment's settlement receipt."""
    ctx.headers["PAYMENT-RESPONSE"] = receipt
