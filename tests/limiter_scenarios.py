"""Scenarios every rate-limit backend must answer the same way (used by the unit tests for the
local and Redis backends and by the integration tests for the Ray actor)."""

from __future__ import annotations

import asyncio
import uuid

from serve_app.limits.backends import LimiterBackend
from serve_app.limits.core import OK, OVER_REQUESTS, OVER_TOKENS

T0 = 1_800_000_000_000  # a controllable clock, in ms


def _fresh() -> str:
    return uuid.uuid4().hex


async def requests_per_minute(backend: LimiterBackend) -> None:
    bucket = f"{_fresh()}|class:M"
    seen = [await backend.decide(bucket, 3, 0, 0, [], T0 + i) for i in range(4)]
    assert [o.code for o in seen] == [OK, OK, OK, OVER_REQUESTS]
    assert [o.requests for o in seen] == [1, 2, 3, 3]
    assert seen[0].window_ms == T0
    # The window ends a minute after its first request: the bucket is full again.
    again = await backend.decide(bucket, 3, 0, 0, [], T0 + 60_000)
    assert again.code == OK and again.requests == 1 and again.window_ms == T0 + 60_000


async def tokens_per_minute(backend: LimiterBackend) -> None:
    bucket = f"{_fresh()}|class:XS"
    first = await backend.decide(bucket, 100, 100, 60, [], T0)
    assert first.code == OK and first.tokens == 60
    refused = await backend.decide(bucket, 100, 100, 60, [], T0 + 1)
    assert refused.code == OVER_TOKENS and refused.tokens == 60
    await backend.adjust(bucket, first.window_ms, 30 - 60)  # measured 30, not 60
    fits = await backend.decide(bucket, 100, 100, 60, [], T0 + 2)
    assert fits.code == OK and fits.tokens == 90
    # A correction for a window that has ended changes nothing.
    await backend.adjust(bucket, first.window_ms - 1, -90)
    assert (await backend.decide(bucket, 100, 100, 5, [], T0 + 3)).tokens == 95


async def error_budget_trips_and_recovers(backend: LimiterBackend) -> None:
    owner = _fresh()
    budget = f"{owner}|model-a|FAILED"
    checks = [(budget, 50)]
    for i in range(50):
        await backend.record(budget, T0 + i * 100, f"r{i}")
    assert (await backend.decide(f"{owner}|class:XS", 500, 0, 0, checks, T0 + 6000)).code == OK
    count = await backend.record(budget, T0 + 5000, "r50")
    assert count == 51
    tripped = await backend.decide(f"{owner}|class:XS", 500, 0, 0, checks, T0 + 6000)
    assert tripped.budget == 1 and tripped.limit == 50 and tripped.count == 51
    # One event too many: the budget recovers when the oldest event leaves the 30 s window.
    assert tripped.resets_ms == T0 + 30_000
    still = await backend.decide(f"{owner}|class:XS", 500, 0, 0, checks, T0 + 29_999)
    assert still.budget == 1
    recovered = await backend.decide(f"{owner}|class:XS", 500, 0, 0, checks, T0 + 30_000)
    assert recovered.budget == 0 and recovered.code == OK


async def exact_under_concurrency(backend: LimiterBackend, count: int = 300,
                                  limit: int = 100) -> None:
    bucket = f"{_fresh()}|class:M"
    outcomes = await asyncio.gather(*[backend.decide(bucket, limit, 0, 0, [], T0 + i)
                                      for i in range(count)])
    assert sum(o.code == OK for o in outcomes) == limit
    assert sum(o.code == OVER_REQUESTS for o in outcomes) == count - limit


async def reading_counts_counts_nothing(backend: LimiterBackend) -> None:
    owner = _fresh()
    used, idle = f"{owner}|class:XS", f"{owner}|class:IMAGE"
    assert await backend.peek([used, idle], T0) == [0, 0, 0, 0, 0, 0]
    await backend.decide(used, 3, 100, 10, [], T0)
    await backend.decide(used, 3, 100, 15, [], T0 + 5)
    for _ in range(3):  # reading, however often, neither counts nor starts a window
        assert await backend.peek([used, idle], T0 + 10) == [T0, 2, 25, 0, 0, 0]
    assert (await backend.decide(used, 3, 100, 1, [], T0 + 20)).requests == 3
    assert (await backend.decide(idle, 20, 0, 0, [], T0 + 30)).window_ms == T0 + 30
    # An ended window reads empty.
    assert await backend.peek([used], T0 + 60_000) == [0, 0, 0]


SCENARIOS = [requests_per_minute, tokens_per_minute, error_budget_trips_and_recovers,
             exact_under_concurrency, reading_counts_counts_nothing]
