"""The rate-limit headers of an answer, every dialect of them built by one function
(`limit_headers`), so that a 429 tells its limits the way the spec publishes them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from serve_app.errors import retry_after

# A header of each dialect: an answer carrying one tells its limits already.
DIALECT_MARKERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining", "x-ratelimit-limit")


@dataclass(frozen=True, slots=True)
class LimitState:
    """A bucket's count after a decision, as the rate-limit headers tell it."""

    requests_limit: int
    requests_remaining: int
    reset_at_ms: int  # when the current window ends
    tokens_limit: int | None
    tokens_remaining: int | None
    now_ms: int
    caller_type: str  # `user` (a wallet) or `api_key`


class CapCount(NamedTuple):
    """A crypto proxy cap as its 429 tells it: the cap, what is left, when it resets (Unix s)."""

    limit: int
    remaining: int
    reset_at_s: int


def limit_headers(*, window: LimitState | None = None, budget_resets_s: int | None = None,
                  cap: CapCount | None = None, retry_after_s: int | None = None
                  ) -> dict[str, str]:
    """The rate-limit headers, in the spec's three dialects:

    - `window`: the per-window `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` and
      `x-ratelimit-type` of a limiter decision (on every answer it admitted or refused);
    - `budget_resets_s`: an error budget's 429, `x-ratelimit-remaining: 0` and
      `x-ratelimit-resets` in place of the per-window headers;
    - `cap`: the crypto proxy's 429, `X-RateLimit-Limit`, `-Remaining` and `-Reset`;

    and `retry_after_s`: `Retry-After`, on a 429 of a cap the spec does not publish (jobs,
    uploads, wallets) or beside a budget's."""
    headers: dict[str, str] = {}
    if window is not None:
        headers["x-ratelimit-limit-requests"] = str(window.requests_limit)
        headers["x-ratelimit-remaining-requests"] = str(window.requests_remaining)
        headers["x-ratelimit-reset-requests"] = str(math.ceil(window.reset_at_ms / 1000))
        if window.tokens_limit:
            headers["x-ratelimit-limit-tokens"] = str(window.tokens_limit)
            headers["x-ratelimit-remaining-tokens"] = str(window.tokens_remaining)
            headers["x-ratelimit-reset-tokens"] = str(
                max(0, math.ceil((window.reset_at_ms - window.now_ms) / 1000)))
        headers["x-ratelimit-type"] = window.caller_type
    if budget_resets_s is not None:
        headers["x-ratelimit-remaining"] = "0"
        headers["x-ratelimit-resets"] = str(budget_resets_s)
    if cap is not None:
        headers["X-RateLimit-Limit"] = str(cap.limit)
        headers["X-RateLimit-Remaining"] = str(cap.remaining)
        headers["X-RateLimit-Reset"] = str(cap.reset_at_s)
    if retry_after_s is not None:
        headers.update(retry_after(retry_after_s))
    return headers
