"""Billing through the real application: two Gateway replicas per application, on SQLite (the
default application) and on PostgreSQL, many concurrent requests, then the ledger and the
balances checked to the nano-unit."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import httpx
import pytest

from serve_app.cli import run as cli
from serve_app.settings import Settings

EMBEDDING = "text-embedding-all-minilm-l6-v2"
NANOS_PER_TOKEN = 10  # the test catalog's embedding price: 0.01 USD per million tokens


def _new_account(platform, app: str, usd: str, tmp_path) -> str:
    """An account of its own (the operator's CLI against the app's database); its admin key."""
    settings = Settings(data_dir=tmp_path, database_url=platform.database_url(app))
    return cli(["create-account", "--usd", usd], settings=settings)["apiKey"]


def _nanos(value: float | str) -> int:
    return int((Decimal(str(value)) * 10**9).to_integral_value())


async def _spread(urls: list[str], keys: list[str], body: dict,
                  count: int = 200) -> list[httpx.Response]:
    """POST /embeddings concurrently, alternating between the replicas and the keys (the
    embedding model allows each key 100 requests per minute in the test catalog)."""
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        return await asyncio.gather(*[
            http.post(f"{urls[i % len(urls)]}/embeddings", json=body,
                      headers={"Authorization": f"Bearer {keys[(i // 2) % len(keys)]}"})
            for i in range(count)])


def _inference_keys(url: str, admin: str, count: int, **fields) -> list[dict]:
    return [httpx.post(f"{url}/api_keys", headers={"Authorization": f"Bearer {admin}"},
                       json={"apiKeyType": "INFERENCE", "description": f"burst {i}", **fields}
                       ).json()["data"] for i in range(count)]


def _shed(response: httpx.Response) -> bool:
    """A request the model's fair-share gate turned away because its turn would come too late
    (how many depends on the machine's speed): 503 MODEL_AT_CAPACITY with Retry-After."""
    return (response.status_code == 503 and response.json()["code"] == "MODEL_AT_CAPACITY"
            and int(response.headers["retry-after"]) > 0)


def _throttled(response: httpx.Response) -> bool:
    """Past 50 refusals in 30 s the key's failed-request budget answers 429 instead of 402."""
    return response.status_code == 429 and "failed requests" in response.json()["customMessage"]


def _split(responses: list[httpx.Response]) -> tuple[list, list]:
    """(answered, refused with 402). Besides those, only a throttled key or a shed request may
    happen; neither is charged (the callers' ledger checks count only the answered)."""
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 402]
    others = [r for r in responses if r.status_code not in (200, 402)]
    assert all(_throttled(r) or _shed(r) for r in others), [
        (r.status_code, r.text[:200]) for r in others]
    return ok, refused


def _history_nanos(url: str, admin: str) -> tuple[int, int]:
    """(sum of all usage-history amounts in nanos, number of lines), walking every page."""
    total, lines, params = 0, 0, {"pageSize": 1000}
    while True:
        page = httpx.get(f"{url}/billing/usage-history", params=params,
                         headers={"Authorization": f"Bearer {admin}"}, timeout=30).json()
        total += sum(-_nanos(r["amount"]) for r in page["data"])
        lines += len(page["data"])
        if not page["nextCursor"]:
            return total, lines
        params = {"cursor": page["nextCursor"]}


def _balance_nanos(url: str, admin: str) -> int:
    body = httpx.get(f"{url}/billing/balance", headers={"Authorization": f"Bearer {admin}"},
                     timeout=30).json()
    return _nanos(body["balances"]["usd"])


@pytest.mark.parametrize("app", ["sqlite", "postgres"])
def test_concurrent_requests_never_overdraw_and_the_ledger_adds_up(platform, app, tmp_path):
    urls = platform.app_urls(app)
    # Each request holds ~1,000 tokens (its bytes) and is charged its ~200 measured tokens.
    text = "The quick brown fox jumps over the lazy dog. " * 22
    start = "0.0006"  # about 60 holds' worth: most of 200 concurrent requests must be refused
    admin = _new_account(platform, app, start, tmp_path)
    keys = [k["apiKey"] for k in _inference_keys(urls[0], admin, 2)]
    responses = asyncio.run(_spread(urls, keys, {"model": EMBEDDING, "input": text}))

    ok, refused = _split(responses)
    assert ok and refused
    assert {r.json()["code"] for r in refused} == {"INSUFFICIENT_BALANCE"}
    charged = sum(r.json()["usage"]["prompt_tokens"] * NANOS_PER_TOKEN for r in ok)
    ledger, lines = _history_nanos(urls[1], admin)
    assert lines == len(ok)
    assert ledger == charged
    left = _balance_nanos(urls[0], admin)
    assert left >= 0
    assert _nanos(start) - left == charged


@pytest.mark.parametrize("app", ["sqlite", "postgres"])
def test_a_key_never_spends_past_its_consumption_limit(platform, app, tmp_path):
    urls = platform.app_urls(app)
    admin = _new_account(platform, app, "10", tmp_path)
    limit = "0.0001"  # each key: about 40 of its 100 requests' holds
    keys = _inference_keys(urls[0], admin, 2, consumptionLimit={"usd": float(limit)},
                           limitPeriod="LIFETIME")
    text = "Budgets hold under load. " * 40
    responses = asyncio.run(_spread(urls, [k["apiKey"] for k in keys],
                                    {"model": EMBEDDING, "input": text}))
    ok, refused = _split(responses)
    assert ok
    assert {r.json()["code"] for r in refused} == {"API_KEY_USD_SPEND_LIMIT_EXCEEDED"}
    ledger, _ = _history_nanos(urls[0], admin)
    assert ledger == sum(r.json()["usage"]["prompt_tokens"] * NANOS_PER_TOKEN for r in ok)
    per_key = [0, 0]
    for i, r in enumerate(responses):
        if r.status_code == 200:
            per_key[(i // 2) % 2] += r.json()["usage"]["prompt_tokens"] * NANOS_PER_TOKEN
    assert all(0 < spent <= _nanos(limit) for spent in per_key), per_key
    for key in keys:
        record = httpx.get(f"{urls[1]}/api_keys/{key['id']}",
                           headers={"Authorization": f"Bearer {admin}"}).json()["data"]
        spent = _nanos(record["currentPeriodUsage"]["usd"])
        assert spent <= _nanos(limit)  # shown to 4 decimals, as published


def test_chat_is_charged_its_measured_tokens_unary_and_streamed(platform, tmp_path):
    url = platform.base_url
    admin = _new_account(platform, "sqlite", "1", tmp_path)
    key = httpx.post(f"{url}/api_keys", headers={"Authorization": f"Bearer {admin}"},
                     json={"apiKeyType": "INFERENCE", "description": "chat"}).json()
    auth = {"Authorization": f"Bearer {key['data']['apiKey']}"}
    body = {"model": "tiny-chat", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Count to three."}]}
    unary = httpx.post(f"{url}/chat/completions", json=body, headers=auth, timeout=120)
    assert unary.status_code == 200
    assert unary.headers["x-service-balance-usd"] == "1"
    usage = unary.json()["usage"]
    with httpx.stream("POST", f"{url}/chat/completions", headers=auth, timeout=120,
                      json={**body, "stream": True,
                            "stream_options": {"include_usage": True}}) as stream:
        events = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    import json

    streamed = json.loads(events[-2][6:])["usage"]
    # tiny-chat: 0.02 USD per million input tokens, 0.04 per million output tokens.
    expected = sum(u["prompt_tokens"] * 20 + u["completion_tokens"] * 40
                   for u in (usage, streamed))
    ledger, lines = _history_nanos(url, admin)
    assert ledger == expected and lines == 4  # input and output lines of two requests
    assert _balance_nanos(url, admin) == _nanos("1") - expected
    history = httpx.get(f"{url}/billing/usage-history", params={"pageSize": 10},
                        headers={"Authorization": f"Bearer {admin}"}).json()["data"]
    details = history[0]["inferenceDetails"]
    assert details["promptTokens"] == usage["prompt_tokens"]
    assert details["completionTokens"] == usage["completion_tokens"]
    assert history[0]["sku"] == "tiny-chat-llm-input-mtoken"


def test_no_balance_is_402_before_any_work(platform, tmp_path):
    url = platform.base_url
    admin = _new_account(platform, "sqlite", "0", tmp_path)
    resp = httpx.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {admin}"},
                      json={"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}]},
                      timeout=60)
    assert resp.status_code == 402
    assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert _history_nanos(url, admin) == (0, 0)


def test_privacy_tier_refuses_an_anonymized_model_naming_the_rule(platform):
    url = platform.base_url
    key = httpx.post(f"{url}/api_keys", headers=platform.auth(),
                     json={"apiKeyType": "INFERENCE", "description": "private only",
                           "modelPrivacy": "PRIVATE_ONLY"}).json()["data"]["apiKey"]
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": "big-offline-model", "messages": [{"role": "user", "content": "hi"}]}
    resp = httpx.post(f"{url}/chat/completions", json=body, headers=auth, timeout=60)
    assert resp.status_code == 403
    assert "PRIVATE_ONLY" in resp.json()["error"]
    allowed = httpx.post(f"{url}/chat/completions", headers=auth, timeout=120,
                         json={"model": "tiny-chat", "max_tokens": 2,
                               "messages": [{"role": "user", "content": "hi"}]})
    assert allowed.status_code == 200


def test_character_slug_puts_the_character_prompt_before_the_conversation(platform,
                                                                          inference_key):
    url = platform.base_url
    created = httpx.post(f"{url}/characters", headers=platform.auth(), json={
        "slug": "ship-captain", "name": "Captain",
        "systemPrompt": "You are the captain of a sailing ship. " * 10})
    assert created.status_code == 200, created.text
    auth = {"Authorization": f"Bearer {inference_key}"}
    body = {"model": "tiny-chat", "max_tokens": 1,
            "messages": [{"role": "user", "content": "Where are we headed?"}]}
    plain = httpx.post(f"{url}/chat/completions", json=body, headers=auth, timeout=120).json()
    with_character = httpx.post(
        f"{url}/chat/completions", headers=auth, timeout=120,
        json={**body, "service_parameters": {"character_slug": "ship-captain"}}).json()
    grown = with_character["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    assert grown >= 60  # the character's prompt went into the model's input
    reviews = httpx.get(f"{url}/characters/ship-captain/reviews", headers=auth).json()
    assert reviews["summary"] == {"averageRating": 0, "totalReviews": 0}


def test_a_request_refused_after_its_hold_gives_the_hold_back(platform, tmp_path):
    url = platform.base_url
    admin = _new_account(platform, "sqlite", "1", tmp_path)
    resp = httpx.post(f"{url}/chat/completions", headers={"Authorization": f"Bearer {admin}"},
                      timeout=60, json={
                          "model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}],
                          "service_parameters": {"character_slug": "nobody-by-this-name"}})
    assert resp.status_code == 404 and resp.json()["code"] == "CHARACTER_NOT_FOUND"
    assert _balance_nanos(url, admin) == _nanos("1")  # the whole-context hold came back
    assert _history_nanos(url, admin) == (0, 0)


def test_a_client_that_leaves_mid_stream_pays_for_its_prompt_and_what_it_got(platform,
                                                                            tmp_path):
    import time

    url = platform.base_url
    admin = _new_account(platform, "sqlite", "1", tmp_path)
    body = {"model": "tiny-chat", "max_tokens": 200, "stream": True, "temperature": 1,
            "messages": [{"role": "user", "content": "Tell me a very long story. " * 20}]}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {admin}"}) as stream:
        for line in stream.iter_lines():
            if '"content"' in line and '"content":""' not in line:
                break  # one token in: hang up
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        history = httpx.get(f"{url}/billing/usage-history", params={"pageSize": 10},
                            headers={"Authorization": f"Bearer {admin}"}).json()["data"]
        if history:
            break
        time.sleep(0.25)
    kinds = {r["sku"]: r for r in history}
    prompt = kinds["tiny-chat-llm-input-mtoken"]["inferenceDetails"]["promptTokens"]
    assert prompt > 100  # the prompt is charged although the usage chunk never came
    assert _balance_nanos(url, admin) < _nanos("1")
