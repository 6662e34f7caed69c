"""Rate limits: the backends against the shared scenarios (local always, Redis when reachable),
and the limits as the in-process gateway applies them."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from serve_app.limits.backends import LocalLimiter
from serve_app.limits.policy import limits_for
from serve_app.models.catalog import CatalogModel
from tests.limiter_scenarios import SCENARIOS

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _redis_unavailable() -> str | None:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return None
    except Exception as exc:  # any failure means: skip with the reason
        return f"Redis not reachable at {REDIS_URL}: {exc}"


_REDIS_REASON = _redis_unavailable()


def _backend(kind: str):
    if kind == "local":
        return LocalLimiter()
    if _REDIS_REASON:
        pytest.skip(_REDIS_REASON)
    from serve_app.limits.redis_backend import RedisLimiter

    return RedisLimiter(REDIS_URL, prefix=f"test-{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize("kind", ["local", "redis"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_backend_scenarios(kind, scenario):
    async def main():
        backend = _backend(kind)
        try:
            await scenario(backend)
        finally:
            await backend.close()

    asyncio.run(main())


def test_redis_outage_falls_back_and_recovers():
    """With Redis unreachable, decisions are counted in the replica and the service answers."""
    from serve_app.limits.core import OK, OVER_REQUESTS
    from serve_app.limits.redis_backend import RedisLimiter

    async def main():
        backend = RedisLimiter("redis://127.0.0.1:1/0", prefix="down")
        try:
            seen = [await backend.decide("k|class:M", 2, 0, 0, [], 1000 + i) for i in range(3)]
            assert [o.code for o in seen] == [OK, OK, OVER_REQUESTS]
        finally:
            await backend.close()

    asyncio.run(main())


def test_default_table_partner_columns_and_overrides():
    def model(**kw):
        base = {"id": "m", "type": "text", "name": "m", "deployment": "d", "engine": "e",
                "size_class": "S", "pricing": {}}
        return CatalogModel(**{**base, **kw})

    assert (limits_for(model(), is_partner=False).requests_per_minute,
            limits_for(model(), is_partner=False).tokens_per_minute) == (150, 3_000_000)
    assert limits_for(model(), is_partner=True).requests_per_minute == 300
    assert limits_for(model(type="embedding", size_class=None),
                      is_partner=False).requests_per_minute == 500
    image = limits_for(model(type="image", size_class=None), is_partner=True)
    assert image.requests_per_minute == 60 and image.tokens_per_minute is None
    assert limits_for(model(type="video", size_class=None), is_partner=False) is None
    custom = limits_for(model(rate_limits={"requests_per_minute": 7}), is_partner=False)
    assert custom.requests_per_minute == 7 and custom.bucket == "model:m"


def test_key_creation_is_limited_to_20_per_minute(gateway):
    import time

    now = time.time()
    gateway.services.limits.clock = lambda: now  # the 21 requests within the minute, however slow
    statuses = []
    for i in range(21):
        resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(),
                                   json={"apiKeyType": "INFERENCE", "description": f"k{i}"})
        statuses.append(resp.status_code)
    assert statuses == [200] * 20 + [429]
    assert resp.json()["code"] == "RATE_LIMIT_EXCEEDED"
    assert resp.headers["x-ratelimit-remaining-requests"] == "0"
    reset = int(resp.headers["x-ratelimit-reset-requests"])  # Unix seconds
    wait = int(resp.headers["retry-after"])  # seconds from now, which the SDKs wait for
    assert 1 <= wait <= 60 and abs(now + wait - reset) <= 1
    log = gateway.client.get("/api/v1/api_keys/rate_limits/log", headers=gateway.auth())
    assert log.status_code == 200
    # The event is written off the request path: wait for it.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        events = log.json()["data"]
        if events:
            break
        time.sleep(0.05)
        log = gateway.client.get("/api/v1/api_keys/rate_limits/log", headers=gateway.auth())
    assert events[0]["rateLimitType"] == "RPM" and events[0]["rateLimitTier"] == "paid"
    assert log.json()["object"] == "list"


def test_rate_limits_endpoint_answers_either_key_type(gateway):
    inference = gateway.create_key()["apiKey"]
    resp = gateway.client.get("/api/v1/api_keys/rate_limits", headers=gateway.auth(inference))
    assert resp.status_code == 200
    data = resp.json()["data"]
    assert data["accessPermitted"] is True
    assert data["apiTier"] == {"id": "paid", "isCharged": True}
    assert data["balances"] == {"USD": 10, "DIEM": 0}
    assert data["keyExpiration"] is None and data["nextEpochBegins"].endswith("T00:00:00.000Z")
    limits = {m["apiModelId"]: m["rateLimits"] for m in data["rateLimits"]}
    assert limits["smollm2-135m-instruct"] == [{"amount": 500, "type": "RPM"},
                                               {"amount": 5_000_000, "type": "TPM"}]
    denied = gateway.client.get("/api/v1/api_keys/rate_limits/log",
                                headers=gateway.auth(inference))
    assert denied.status_code == 401


def test_failed_requests_trip_the_error_budget(gateway):
    """Requests to a model whose deployment is down fail (503); the 51st failure in 30 s trips
    the key's budget for that model: 429 with the threshold named."""
    import time

    now = time.time()
    gateway.services.limits.clock = lambda: now  # the 51 failures within 30 s, however slow
    key = gateway.create_key()["apiKey"]
    body = {"model": "text-embedding-all-minilm-l6-v2", "input": "hello"}
    for _ in range(51):
        resp = gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key), json=body)
        assert resp.status_code == 503
        assert resp.headers["x-ratelimit-limit-requests"] == "500"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # failures are counted just after each answer
        resp = gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key), json=body)
        if resp.status_code == 429:
            break
    assert resp.status_code == 429
    body = resp.json()
    assert body["code"] == "RATE_LIMIT_EXCEEDED"
    assert "more than 50 failed requests in 30 seconds" in body["customMessage"]
    assert resp.headers["x-ratelimit-remaining"] == "0"
    resets = int(resp.headers["x-ratelimit-resets"])  # Unix seconds
    assert now < resets <= now + 31
    assert 1 <= int(resp.headers["retry-after"]) <= 30  # what the SDKs wait before a retry
    assert "x-ratelimit-remaining-requests" not in resp.headers
    # Another key is not affected.
    other = gateway.create_key()["apiKey"]
    assert gateway.client.post("/api/v1/embeddings", headers=gateway.auth(other),
                               json={"model": "text-embedding-all-minilm-l6-v2",
                                     "input": "x"}).status_code == 503


def test_failed_requests_on_endpoints_without_a_model_trip_and_recover(gateway):
    """More than 50 failures in 30 s (here 404s of /api_keys/{id}) close every endpoint to
    the key; 30 s later (a controlled clock) it is open again."""
    import time

    now = [time.time()]
    gateway.services.limits.clock = lambda: now[0]
    key = gateway.create_key(apiKeyType="ADMIN")["apiKey"]
    for i in range(51):
        resp = gateway.client.get(f"/api/v1/api_keys/missing-{i}", headers=gateway.auth(key))
        assert resp.status_code == 404
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # failures are counted just after each answer
        resp = gateway.client.get("/api/v1/api_keys", headers=gateway.auth(key))
        if resp.status_code == 429:
            break
        time.sleep(0.02)
    assert resp.status_code == 429
    assert "more than 50 failed requests in 30 seconds" in resp.json()["customMessage"]
    assert resp.headers["x-ratelimit-remaining"] == "0"
    # The operator's own key is not affected.
    assert gateway.client.get("/api/v1/api_keys", headers=gateway.auth()).status_code == 200
    now[0] += 30
    assert gateway.client.get("/api/v1/api_keys", headers=gateway.auth(key)).status_code == 200


def test_a_chat_refused_by_its_limits_beside_its_hold_gives_the_hold_back(gateway):
    """A key well inside its request limits has its chat hold taken beside the limiter's
    decision. When the decision is a refusal (here the error budget of a model whose
    deployment is down), the client gets the 429 and the hold comes back."""
    import time

    now = time.time()
    gateway.services.limits.clock = lambda: now  # the 51 failures within 30 s, however slow
    key = gateway.create_key()["apiKey"]
    body = {"model": "smollm2-135m-instruct", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello"}]}

    def balance() -> str:
        return gateway.client.get("/api/v1/billing/balance",
                                  headers=gateway.auth()).json()["balances"]["usd"]

    whole = balance()
    for _ in range(51):
        resp = gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key),
                                   json=body)
        assert resp.status_code == 503
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # failures are counted just after each answer
        resp = gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key),
                                   json=body)
        if resp.status_code == 429:
            break
    assert resp.status_code == 429
    assert "more than 50 failed requests" in resp.json()["customMessage"]
    steps = resp.headers["Server-Timing"]
    assert "hold" in steps and "limits" in steps  # the hold was taken, beside the decision
    assert balance() == whole  # and given back, as every hold of the 503s before it
