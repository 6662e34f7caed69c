"""The rate-limit headers in each of the spec's dialects, as `limit_headers` builds them."""

from serve_app.limits.limit_headers import CapCount, LimitState, limit_headers


def test_window_headers_tell_requests_tokens_and_caller_type():
    state = LimitState(requests_limit=20, requests_remaining=19, reset_at_ms=61_500,
                       tokens_limit=1000, tokens_remaining=900, now_ms=30_000,
                       caller_type="api_key")
    assert limit_headers(window=state) == {
        "x-ratelimit-limit-requests": "20", "x-ratelimit-remaining-requests": "19",
        "x-ratelimit-reset-requests": "62", "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "32",
        "x-ratelimit-type": "api_key"}


def test_window_without_a_token_limit_leaves_the_token_headers_out():
    state = LimitState(20, 0, 60_000, None, None, 0, "user")
    assert set(limit_headers(window=state)) == {
        "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests", "x-ratelimit-type"}


def test_error_budget_headers_replace_the_per_window_ones():
    assert limit_headers(budget_resets_s=12) == {"x-ratelimit-remaining": "0",
                                                 "x-ratelimit-resets": "12"}
    assert limit_headers(budget_resets_s=3, retry_after_s=3)["Retry-After"] == "3"


def test_crypto_cap_headers():
    assert limit_headers(cap=CapCount(100, 0, 1_700_000_000)) == {
        "X-RateLimit-Limit": "100", "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1700000000"}


def test_retry_after_alone():
    assert limit_headers(retry_after_s=1) == {"Retry-After": "1"}
