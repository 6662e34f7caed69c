"""Admission refuses what the account cannot pay (402) before any model is called, for every
flow; nothing is held or charged."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image


def _png() -> str:
    out = io.BytesIO()
    Image.new("RGB", (256, 256), (10, 10, 10)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


FLOWS = {
    "chat": ("text-xs", "/chat/completions", {
        "model": "chat-primary", "messages": [{"role": "user", "content": "hi"}]}),
    "chat-stream": ("text-xs", "/chat/completions", {
        "model": "chat-primary", "messages": [{"role": "user", "content": "hi"}],
        "stream": True}),
    "embeddings": ("embedding", "/embeddings", {"model": "embed-small", "input": "hi"}),
    "upscale": ("image-upscale", "/image/upscale", {"image": _png(), "scale": 2}),
    "video": ("video-generation", "/video/queue", {
        "model": "clip-maker", "prompt": "a fox", "duration": "1s", "resolution": "256p"}),
}


@pytest.fixture
def broke_key(fake_gateway) -> tuple[str, str]:
    """An INFERENCE key of another account, one with no credit; and that account's id."""
    account = fake_gateway.cli("create-account", "--usd", "0")
    resp = fake_gateway.client.post("/api/v1/api_keys", headers=fake_gateway.auth(
        account["apiKey"]), json={"apiKeyType": "INFERENCE", "description": "broke"})
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["apiKey"], account["accountId"]


@pytest.mark.parametrize("flow", FLOWS)
def test_an_account_without_credit_gets_402_and_the_model_is_never_called(
        fake_gateway, fakes, books, broke_key, flow):
    deployment, path, body = FLOWS[flow]
    key, account_id = broke_key

    resp = fake_gateway.client.post(f"/api/v1{path}", headers=fake_gateway.auth(key),
                                    json=body)

    assert resp.status_code == 402, resp.text
    assert resp.json()["code"] == "INSUFFICIENT_BALANCE"
    assert fakes[deployment].calls == []
    assert books.entries() == 0
    assert books.open_holds() == 0
    assert books.balance_nanos(account_id) == 0


def test_a_402_still_counts_against_the_rate_limit(fake_gateway, broke_key):
    key, _ = broke_key
    _, path, body = FLOWS["chat"]

    resp = fake_gateway.client.post(f"/api/v1{path}", headers=fake_gateway.auth(key),
                                    json=body)

    assert resp.status_code == 402
    h = resp.headers
    assert int(h["x-ratelimit-remaining-requests"]) == int(h["x-ratelimit-limit-requests"]) - 1
