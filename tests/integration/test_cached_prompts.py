"""Cached prompts on vLLM through the real Serve app: a long prompt sent twice is read from
vLLM's prefix cache the second time, reported as `cached_tokens` and billed at tiny-chat's
cache-read price (tests/integration/catalog.yaml: input 0.02, cache_input 0.01, output 0.04 USD
per million tokens)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

pytestmark = pytest.mark.integration

TINY = "tiny-chat"
NANOS_PER_TOKEN = {"input": 20, "cache_read": 10, "output": 40}


def test_a_long_prompt_sent_twice_is_read_from_the_prefix_cache_and_billed_so(client,
                                                                               platform):
    # Unique from its first block on (vLLM caches whole blocks of 128 tokens on CPU), and long
    # enough for a few blocks.
    prompt = f"Conversation {uuid.uuid4().hex}. " + "Tell me about the quiet forest. " * 80
    # the history lists the oldest lines first: read from this test's start on
    since = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    messages = [{"role": "user", "content": prompt}]

    def ask():
        raw = client.chat.completions.with_raw_response.create(
            model=TINY, messages=messages, max_tokens=4, temperature=0,
            extra_body={"prompt_cache_key": "cached-prompt-test"})
        return raw.parse().usage, raw.headers["cf-ray"]

    first, _ = ask()
    second, request_id = ask()

    assert first.prompt_tokens_details.cached_tokens == 0
    cached = second.prompt_tokens_details.cached_tokens
    assert second.prompt_tokens == first.prompt_tokens
    assert 0 < cached < second.prompt_tokens
    history = httpx.get(f"{platform.base_url}/billing/usage-history",
                        params={"startTimestamp": since}, headers=platform.auth()).json()["data"]
    units: dict[str, int] = {}
    charged = 0.0  # USD (a line paid partly in DIEM is listed once per currency)
    for line in history:
        if (line["inferenceDetails"] or {}).get("requestId") != request_id:
            continue
        kind = line["sku"].removeprefix(f"{TINY}-llm-").removesuffix("-mtoken")
        units[kind.replace("-", "_")] = round(line["units"] * 1_000_000)
        charged -= line["amount"]
    assert units == {"input": second.prompt_tokens - cached, "cache_read": cached,
                     "output": second.completion_tokens}
    assert round(charged * 1e9) == sum(units[kind] * NANOS_PER_TOKEN[kind] for kind in units)
