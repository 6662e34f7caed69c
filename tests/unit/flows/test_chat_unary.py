"""A unary chat completion through admission, the text deployment and settlement."""

from __future__ import annotations

from deployments.protocol import TextRequest
from tests.fakes import count_prompt_tokens
from tests.unit.flows.books import per_million

# chat-primary's prices (catalog.yaml), USD per million tokens.
INPUT_USD, OUTPUT_USD = 10, 20


def _chat(gateway, key: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        **body})


def test_unary_chat_answers_the_models_reply_and_its_measured_usage(fake_gateway, fakes, key):
    resp = _chat(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    body = resp.json()
    text = fakes["text-xs"]
    assert body["object"] == "chat.completion" and body["model"] == "chat-primary"
    assert body["choices"] == [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                "message": {"role": "assistant", "content": text.reply}}]
    prompt = count_prompt_tokens(text.requests[-1].messages)
    assert body["usage"]["prompt_tokens"] == prompt
    assert body["usage"]["completion_tokens"] == text.completion_tokens()
    assert body["usage"]["total_tokens"] == prompt + text.completion_tokens()


def test_unary_chat_sends_the_composed_prompt_and_the_models_sampling(fake_gateway, fakes,
                                                                       key):
    resp = _chat(fake_gateway, key, max_tokens=5)

    assert resp.status_code == 200, resp.text
    (call,) = fakes["text-xs"].calls
    assert (call.method, call.model_id, call.stream) == ("complete", "chat-primary", False)
    request = call.args[1]
    assert isinstance(request, TextRequest)
    assert request.request_id == resp.headers["cf-ray"]
    assert request.messages == [
        {"role": "system", "content": "You are the pipeline test assistant."},
        {"role": "user", "content": "Name a fast fox"}]
    assert request.sampling.temperature == 0.3  # the catalog's default
    assert request.sampling.max_tokens == 5
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert resp.json()["usage"]["completion_tokens"] == 5


def test_unary_chat_settles_the_measured_tokens(fake_gateway, key, books):
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    expected = {"input": (usage["prompt_tokens"], per_million(INPUT_USD, usage["prompt_tokens"])),
                "output": (usage["completion_tokens"],
                           per_million(OUTPUT_USD, usage["completion_tokens"]))}
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "chat-primary"
    assert charge.lines == expected
    assert charge.total_nanos == sum(amount for _, amount in expected.values())
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_unary_chat_usage_history_lists_each_priced_line(fake_gateway, key, books):
    resp = _chat(fake_gateway, key)

    usage = resp.json()["usage"]
    lines = {line["sku"]: line for line in books.usage_history(resp.headers["cf-ray"])}
    assert set(lines) == {"chat-primary-llm-input-mtoken", "chat-primary-llm-output-mtoken"}
    output = lines["chat-primary-llm-output-mtoken"]
    assert output["pricePerUnitUsd"] == OUTPUT_USD
    assert output["amount"] == -per_million(OUTPUT_USD, usage["completion_tokens"]) / 1e9
    assert output["inferenceDetails"]["promptTokens"] == usage["prompt_tokens"]
    assert output["inferenceDetails"]["completionTokens"] == usage["completion_tokens"]


def test_unary_chat_answer_carries_model_balance_rate_limit_and_timing_headers(fake_gateway,
                                                                               key):
    resp = _chat(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    h = resp.headers
    assert h["x-service-model-id"] == "chat-primary"
    assert h["x-service-model-router"] == "direct"
    assert h["x-service-balance-usd"] == "10"  # the balance before the request
    assert int(h["x-ratelimit-remaining-requests"]) == int(h["x-ratelimit-limit-requests"]) - 1
    assert len(h["cf-ray"]) == 32
    steps = [part.split(";")[0].strip() for part in h["server-timing"].split(",")]
    assert "model" in steps and "settle" in steps


def test_unary_chat_by_alias_is_answered_by_the_model_it_names(fake_gateway, fakes, key):
    resp = _chat(fake_gateway, key, model="default")

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-service-model-id"] == "chat-primary"
    assert resp.headers["x-service-model-router"] == "alias"
    assert [c.model_id for c in fakes["text-xs"].calls] == ["chat-primary"]
