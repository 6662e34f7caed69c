"""Cached prompts: the prompt tokens the engine's prefix cache served are reported in
`usage.prompt_tokens_details.cached_tokens` (unary, the last stream chunk, `/responses`),
billed at the model's cache-read price (a model without one bills them as input), and shown as
`Cache Read` in the usage history and analytics. The fake text deployment reports a prompt's
prefix shared with an earlier prompt of the model as cached, as vLLM does."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from tests.fakes import FakeTextDeployment
from tests.unit.flows.books import per_million

CATALOG = Path(__file__).with_name("catalog.yaml")
# chat-cached's and chat-plain's prices (catalog.yaml), USD per million tokens.
INPUT_USD, CACHE_READ_USD, OUTPUT_USD = 10, 2, 20
# A long system prompt every request of a conversation repeats.
SYSTEM = "You answer questions about foxes in the forest, briefly and kindly. " * 20


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    return fakes["text-xs"]


def _chat(sdk: OpenAI, model: str, question: str, **extra):
    """The SDK's call, with the raw response for the request id (CF-RAY)."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=model, messages=_messages(question), **extra)
    return raw.parse(), raw.headers["cf-ray"]


def test_a_repeated_prompt_reports_its_cached_tokens_and_pays_the_cache_read_price(
        sdk, books):
    first, _ = _chat(sdk, "chat-cached", "Where do foxes sleep?")
    before = books.balance_nanos()
    second, request_id = _chat(sdk, "chat-cached", "What do foxes eat?")

    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    prompt, completion = second.usage.prompt_tokens, second.usage.completion_tokens
    assert 0 < cached < prompt  # the shared system prompt, not the new question
    expected = {"input": (prompt - cached, per_million(INPUT_USD, prompt - cached)),
                "cache_read": (cached, per_million(CACHE_READ_USD, cached)),
                "output": (completion, per_million(OUTPUT_USD, completion))}
    charge = books.only_charge(request_id)
    assert charge.lines == expected
    assert books.balance_nanos() == before - sum(n for _, n in expected.values())
    assert charge.total_nanos < per_million(INPUT_USD, prompt) + per_million(OUTPUT_USD,
                                                                             completion)


def test_the_last_stream_chunk_reports_the_cached_tokens(sdk, books):
    _chat(sdk, "chat-cached", "Where do foxes sleep?")
    raw = sdk.chat.completions.with_raw_response.create(
        model="chat-cached", messages=_messages("What do foxes eat?"), stream=True,
        stream_options={"include_usage": True})
    chunks = list(raw.parse())

    usage = chunks[-1].usage
    cached = usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < usage.prompt_tokens
    lines = books.only_charge(raw.headers["cf-ray"]).lines
    assert lines["cache_read"] == (cached, per_million(CACHE_READ_USD, cached))
    assert lines["input"][0] == usage.prompt_tokens - cached


def test_a_model_without_a_cache_read_price_bills_the_whole_prompt_as_input(sdk, books):
    _chat(sdk, "chat-plain", "Where do foxes sleep?")
    second, request_id = _chat(sdk, "chat-plain", "What do foxes eat?")

    assert second.usage.prompt_tokens_details.cached_tokens > 0  # still reported
    prompt, completion = second.usage.prompt_tokens, second.usage.completion_tokens
    assert books.only_charge(request_id).lines == {
        "input": (prompt, per_million(INPUT_USD, prompt)),
        "output": (completion, per_million(OUTPUT_USD, completion))}


def test_cache_reads_show_in_the_usage_history_and_analytics(fake_gateway, sdk, books):
    _chat(sdk, "chat-cached", "Where do foxes sleep?")
    second, request_id = _chat(sdk, "chat-cached", "What do foxes eat?")
    cached = second.usage.prompt_tokens_details.cached_tokens

    history = {line["sku"]: line for line in books.usage_history(request_id)}
    read = history["chat-cached-llm-cache-read-mtoken"]
    assert read["units"] == cached / 1_000_000
    assert read["pricePerUnitUsd"] == CACHE_READ_USD
    assert read["inferenceDetails"]["promptTokens"] == second.usage.prompt_tokens

    resp = fake_gateway.client.get("/api/v1/billing/usage-analytics",
                                   params={"lookback": "1d"}, headers=fake_gateway.auth())
    assert resp.status_code == 200, resp.text
    (model,) = resp.json()["byModel"]
    breakdown = {b["type"]: b for b in model["breakdown"]}
    assert set(breakdown) == {"Input", "Cache Read", "Output"}
    assert breakdown["Cache Read"]["units"] == cached


def test_responses_report_the_cached_input_tokens(fake_gateway, key):
    def respond(question: str) -> dict:
        resp = fake_gateway.client.post(
            "/api/v1/responses", headers=fake_gateway.auth(key),
            json={"model": "chat-cached", "instructions": SYSTEM, "input": question})
        assert resp.status_code == 200, resp.text
        return resp.json()["usage"]

    assert respond("Where do foxes sleep?")["input_tokens_details"]["cached_tokens"] == 0
    usage = respond("What do foxes eat?")
    assert 0 < usage["input_tokens_details"]["cached_tokens"] < usage["input_tokens"]


def test_the_prompt_cache_key_reaches_the_deployment_router(fake_gateway, key, text):
    body = {"model": "chat-cached", "messages": _messages("Hi"),
            "prompt_cache_key": "conversation-42"}
    resp = fake_gateway.client.post("/api/v1/chat/completions", headers=fake_gateway.auth(key),
                                    json=body)

    assert resp.status_code == 200, resp.text
    assert text.requests[-1].prompt_cache_key == "conversation-42"


def _account_key(gateway) -> tuple[str, str]:
    """An INFERENCE key of a new account with credit, and the account's id."""
    account = gateway.cli("create-account", "--usd", "10")
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(account["apiKey"]),
                               json={"apiKeyType": "INFERENCE", "description": "other"})
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["apiKey"], account["accountId"]


def _cached(gateway, key: str, question: str) -> int:
    resp = gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-cached", "messages": _messages(question)})
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_an_account_never_reads_the_prefixes_another_cached(fake_gateway, key, text):
    """The attack: `cached_tokens` tells whether another tenant sent the same long prompt
    (the prefix cache was shared). Each account's prompts are cached under its own salt."""
    other, other_account = _account_key(fake_gateway)

    assert _cached(fake_gateway, key, "Where do foxes sleep?") == 0
    assert _cached(fake_gateway, other, "Where do foxes sleep?") == 0  # the same prompt
    assert _cached(fake_gateway, other, "What do foxes eat?") > 0  # its own prefix
    assert _cached(fake_gateway, fake_gateway.create_key()["apiKey"],
                   "Do foxes swim?") > 0  # another key of the first account: its cache

    salts = {request.cache_salt for request in text.requests}
    assert len(salts) == 2 and None not in salts
    assert not any(fake_gateway.account_id in salt or other_account in salt
                   for salt in salts)  # hashed, not the raw id
