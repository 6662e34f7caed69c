"""Rate limits through the real application: two Gateway replicas per application, counts in
the Ray actor (default application) or in Redis (PostgreSQL application)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from serve_app.limits.backends import RayLimiter
from serve_app.limits.redis_backend import RETRY_AFTER_S
from tests.limiter_scenarios import SCENARIOS

EMBEDDING = "text-embedding-all-minilm-l6-v2"  # 100 requests per minute in the test catalog


def _key(url: str, admin: str) -> str:
    resp = httpx.post(f"{url}/api_keys", headers={"Authorization": f"Bearer {admin}"},
                      json={"apiKeyType": "INFERENCE", "description": "limits"})
    resp.raise_for_status()
    return resp.json()["data"]["apiKey"]


async def _burst(urls: list[str], key: str, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120,
                                 limits=httpx.Limits(max_connections=count)) as http:
        return await asyncio.gather(*[
            http.post(f"{urls[i % len(urls)]}/embeddings",
                      json={"model": EMBEDDING, "input": f"request {i}"},
                      headers={"Authorization": f"Bearer {key}"})
            for i in range(count)])


@pytest.mark.parametrize("app", ["sqlite", "postgres"])
def test_300_concurrent_requests_on_two_replicas_admit_exactly_100(platform, app):
    urls = platform.app_urls(app)
    responses = asyncio.run(_burst(urls, _key(urls[0], platform.admin_key), 300))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 100, {s: statuses.count(s) for s in set(statuses)}
    assert statuses.count(429) == 200
    now = time.time()
    for r in responses:
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert now < int(r.headers["x-ratelimit-reset-requests"]) <= now + 61
        assert r.headers["x-ratelimit-type"] == "api_key"
        if r.status_code == 429:
            assert r.headers["x-ratelimit-remaining-requests"] == "0"
            assert r.json()["code"] == "RATE_LIMIT_EXCEEDED"
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"])
                       for r in responses if r.status_code == 200)
    assert remaining == list(range(100))  # every admitted request saw its own count
    log = httpx.get(f"{urls[1]}/api_keys/rate_limits/log", headers=platform.auth()).json()
    assert any(e["rateLimitType"] == "RPM" and e["modelId"] == EMBEDDING for e in log["data"])


def test_tokens_per_minute_count_the_measured_tokens(platform, inference_key):
    """The chat model's bucket shows the tokens of the last answer in its headers."""
    url = platform.base_url
    auth = {"Authorization": f"Bearer {_key(url, platform.admin_key)}"}
    body = {"model": "tiny-chat", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say hello to the crew."}]}
    first = httpx.post(f"{url}/chat/completions", json=body, headers=auth, timeout=120)
    assert first.status_code == 200
    limit = int(first.headers["x-ratelimit-limit-tokens"])
    estimate = limit - int(first.headers["x-ratelimit-remaining-tokens"])
    usage = first.json()["usage"]
    second = httpx.post(f"{platform.replica_urls[1]}/chat/completions", json=body,
                        headers=auth, timeout=120)
    used_before_second = limit - int(second.headers["x-ratelimit-remaining-tokens"]) - estimate
    # After the first answer, its estimate was replaced by the measured total.
    assert used_before_second == usage["total_tokens"]
    assert 0 < int(second.headers["x-ratelimit-reset-tokens"]) <= 60


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_ray_actor_backend_scenarios(platform, scenario):
    async def main():
        await scenario(RayLimiter())

    asyncio.run(main())


def test_redis_restart_during_a_run(platform):
    urls = platform.app_urls("postgres")
    key = _key(urls[0], platform.admin_key)

    async def run(count: int) -> list[int]:
        return [r.status_code for r in await _burst(urls, key, count)]

    before = asyncio.run(run(20))
    platform.redis.stop()
    during = asyncio.run(run(20))  # Redis is down: replicas count on their own, and answer
    platform.redis.start()
    # the replicas try Redis again RETRY_AFTER_S after their last failure, which came before
    # the restart: waited out (a slower machine only waits longer)
    time.sleep(RETRY_AFTER_S + 0.5)
    after_key = _key(urls[0], platform.admin_key)
    after = [r.status_code for r in asyncio.run(_burst(urls, after_key, 150))]
    assert before == [200] * 20
    assert during == [200] * 20
    assert after.count(200) == 100 and after.count(429) == 50  # one shared count again
