"""Clients written for the reference work unchanged: what its chat request schema accepts
(shared/reference/venice/openapi.yaml) is accepted, sent as the `openai` SDK or a plain JSON
client sends it, and what the model is asked for follows it; what it refuses is still a 400."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import BadRequestError

from tests.fakes import FakeTextDeployment

CATALOG = Path(__file__).with_name("catalog.yaml")
MESSAGES = [{"role": "user", "content": "Name a fast fox"}]


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    return fakes["text-xs"]


def _post(gateway, key: str, path: str = "/api/v1/chat/completions", **body):
    return gateway.client.post(path, headers=gateway.auth(key), json=body)


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [0, -5])
def test_a_token_limit_of_zero_or_less_is_ignored(sdk, text, limit, value):
    reply = sdk.chat.completions.create(model="chat-plain", messages=MESSAGES,
                                        **{limit: value})

    assert reply.choices[0].message.content == text.reply
    assert reply.choices[0].finish_reason == "stop"
    assert text.requests[-1].sampling.max_tokens == 64  # the model's own limit


def test_the_sdk_sends_reference_values_the_platform_used_to_refuse(sdk, text):
    reply = sdk.chat.completions.create(
        model="chat-plain", messages=MESSAGES, top_p=0, verbosity="auto",
        extra_body={"repetition_penalty": 3.5, "text": {"verbosity": "auto"},
                    "venice_parameters": {"enable_e2ee": True}})

    assert reply.choices[0].message.content == text.reply
    sampling = text.requests[-1].sampling
    assert (sampling.top_p, sampling.repetition_penalty) == (0, 3.5)


def test_ten_fallbacks_are_accepted_and_eleven_refused(fake_gateway, key, text):
    ten = [{"model": "chat-thinker"}] * 9 + [{"model": "chat-cached"}]
    resp = _post(fake_gateway, key, model="chat-plain", messages=MESSAGES, fallbacks=ten)
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == text.reply

    resp = _post(fake_gateway, key, model="chat-plain", messages=MESSAGES,
                 fallbacks=[*ten, {"model": "chat-plain"}])
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert "fallbacks" in resp.text


def test_reasoning_on_a_model_that_does_not_reason_is_accepted_and_ignored(sdk, text):
    reply = sdk.chat.completions.create(
        model="chat-plain", messages=MESSAGES, reasoning_effort="high",
        extra_body={"reasoning": {"effort": "medium", "summary": "auto"}})

    assert reply.choices[0].message.content == text.reply
    assert text.requests[-1].sampling.reasoning_effort is None


@pytest.mark.parametrize(("body", "effort"), [
    ({"reasoning_effort": "low"}, "low"),
    ({"reasoning": {"effort": "high"}}, "high"),
    ({"reasoning_effort": "minimal", "reasoning": {"effort": "high"}}, "minimal"),
    ({"reasoning": {"enabled": False}}, "none"),
    ({}, None),
])
def test_reasoning_reaches_a_model_that_reasons(fake_gateway, key, text, body, effort):
    resp = _post(fake_gateway, key, model="chat-thinker", messages=MESSAGES, **body)

    assert resp.status_code == 200, resp.text
    assert text.requests[-1].sampling.reasoning_effort == effort


@pytest.mark.parametrize("body", [
    {"top_p": -0.1}, {"top_p": 1.5}, {"repetition_penalty": -1},
    {"verbosity": "loud"}, {"reasoning": {"summary": "verbose"}},
    {"reasoning_effort": "extreme"},
])
def test_what_the_reference_refuses_is_still_a_400(fake_gateway, key, text, body):
    resp = _post(fake_gateway, key, model="chat-plain", messages=MESSAGES, **body)

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert text.requests == []  # the model never saw it


def test_an_infinite_repetition_penalty_is_a_400(fake_gateway, key, text):
    resp = fake_gateway.client.post(
        "/api/v1/chat/completions", headers={**fake_gateway.auth(key),
                                             "content-type": "application/json"},
        content=b'{"model": "chat-plain", "messages": [{"role": "user", "content": "Hi"}],'
                b' "repetition_penalty": Infinity}')

    assert resp.status_code == 400, resp.text
    assert text.requests == []


def test_the_sdk_sees_a_refused_value_as_a_bad_request(sdk):
    with pytest.raises(BadRequestError):
        sdk.chat.completions.create(model="chat-plain", messages=MESSAGES, top_p=2)


def test_responses_take_top_p_zero_ten_fallbacks_and_reasoning(fake_gateway, key, text):
    resp = _post(fake_gateway, key, "/api/v1/responses", model="chat-plain",
                 input="Name a fast fox", top_p=0, fallbacks=[{"model": "chat-cached"}] * 10,
                 reasoning={"effort": "high", "summary": "concise"})

    assert resp.status_code == 200, resp.text
    assert resp.json()["output"][0]["content"][0]["text"] == text.reply
    assert text.requests[-1].sampling.top_p == 0
