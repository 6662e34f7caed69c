"""A chat (or embeddings) whose engine is too busy to start it soon (its fair-share gate refuses it,
deployments/fair_share.py): 503 MODEL_AT_CAPACITY with the wait as `Retry-After`, nothing
charged, none of its tokens counted, and not the caller's failure for the error budget. And
who asks reaches the engine: the account (hashed) and its tier's share."""

from __future__ import annotations

import hashlib

from deployments.protocol import Tenant, at_capacity


def _chat(gateway, key: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        "max_tokens": 20, **body})


def test_a_request_the_engine_cannot_start_soon_gets_503_with_the_wait(
        fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(at_capacity("chat-primary", 42.3))
    before = books.balance_nanos()

    for stream in (False, True):
        resp = _chat(fake_gateway, key, stream=stream)
        assert resp.status_code == 503, resp.text
        assert resp.json()["code"] == "MODEL_AT_CAPACITY"
        assert resp.headers["Retry-After"] == "43"
        assert books.charges(resp.headers["cf-ray"]) == []
    assert books.balance_nanos() == before
    assert books.open_holds() == 0
    # none of the refused requests' tokens count toward the key's tokens per minute: after
    # the same request, it has as many left as a key that sent nothing before
    fakes["text-xs"].recover()
    fresh = fake_gateway.create_key()["apiKey"]
    for sender in (key, fresh):
        ok = _chat(fake_gateway, sender)
        assert ok.status_code == 200, ok.text
    remaining = [int(_chat(fake_gateway, sender).headers["x-ratelimit-remaining-tokens"])
                 for sender in (key, fresh)]
    assert remaining[0] == remaining[1]


def test_refusals_for_capacity_do_not_spend_the_error_budget(fake_gateway, fakes, key):
    """More than 50 failures in 30 s close a key's model to it (429); 503s for capacity are
    the platform's state, not the caller's failures, and never do."""
    fakes["text-xs"].fail_with(at_capacity("chat-primary", 2.0))
    for _ in range(55):
        assert _chat(fake_gateway, key).status_code == 503
    fakes["text-xs"].recover()
    assert _chat(fake_gateway, key).status_code == 200


def test_the_engine_is_told_whose_request_it_is(fake_gateway, fakes, key):
    assert _chat(fake_gateway, key).status_code == 200
    other = fake_gateway.create_key()["apiKey"]  # another key of the same account
    assert _chat(fake_gateway, other).status_code == 200
    first, second = (request.tenant for request in fakes["text-xs"].requests)
    assert isinstance(first, Tenant)
    assert first == second  # one account, one tenant, whichever key
    assert first.weight == 1.0  # the default tier's share
    # a hash of the account: its id never reaches the engine
    assert fake_gateway.account_id not in first.id
    assert first.id == hashlib.sha256(
        f"tenant:{fake_gateway.account_id}".encode()).hexdigest()[:24]


def test_embeddings_the_engine_cannot_encode_soon_get_503_with_the_wait(
        fake_gateway, fakes, key, books):
    fakes["embedding"].fail_with(at_capacity("embed-small", 3.2))
    before = books.balance_nanos()
    body = {"model": "embed-small", "input": ["a lighthouse", "a storm"]}
    resp = fake_gateway.client.post("/api/v1/embeddings", headers=fake_gateway.auth(key),
                                    json=body)
    assert resp.status_code == 503, resp.text
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert resp.headers["Retry-After"] == "4"
    assert books.balance_nanos() == before
    assert books.open_holds() == 0
    fakes["embedding"].recover()
    fresh = fake_gateway.create_key()["apiKey"]
    remaining = [int(fake_gateway.client.post(
        "/api/v1/embeddings", headers=fake_gateway.auth(sender), json=body
    ).headers["x-ratelimit-remaining-tokens"]) for sender in (key, fresh)]
    assert remaining[0] == remaining[1]  # nothing of the refused request counted
