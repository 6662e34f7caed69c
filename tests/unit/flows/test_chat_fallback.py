"""Chat when the model fails: a fallback answers (and is what is charged); without one the
error reaches the client, nothing is charged and the hold goes back."""

from __future__ import annotations

import pytest
from openai import APIError, OpenAI

from tests.fakes import at_capacity, count_prompt_tokens, crashed, offline, reported
from tests.unit.flows.books import per_million
from tests.unit.flows.sse import DONE, content, events

FALLBACK_INPUT_USD, FALLBACK_OUTPUT_USD = 30, 60  # chat-fallback (catalog.yaml)


def _chat(gateway, key: str, *, fallbacks: bool = True, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        **({"fallbacks": [{"model": "chat-fallback"}]} if fallbacks else {}), **body})


def test_a_fallback_answers_when_the_primary_is_at_capacity(fake_gateway, fakes, key):
    fakes["text-xs"].fail_with(at_capacity())

    resp = _chat(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "chat-fallback"
    assert resp.json()["choices"][0]["message"]["content"] == fakes["text-s"].reply
    assert resp.headers["x-service-model-id"] == "chat-fallback"
    assert resp.headers["x-service-model-router"] == "fallback"
    assert [c.model_id for c in fakes["text-xs"].calls] == ["chat-primary"]
    assert [c.model_id for c in fakes["text-s"].calls] == ["chat-fallback"]
    # the fallback gets its own sampling (its catalog default), the same prompt
    primary, fallback = fakes["text-xs"].requests[0], fakes["text-s"].requests[0]
    assert fallback.messages == primary.messages
    assert fallback.sampling.temperature == 0.7


def test_a_fallback_answer_is_charged_at_the_fallbacks_price(fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(reported(503, "the engine is overloaded",
                                        code="MODEL_AT_CAPACITY"))
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "chat-fallback"
    assert charge.lines == {
        "input": (usage["prompt_tokens"],
                  per_million(FALLBACK_INPUT_USD, usage["prompt_tokens"])),
        "output": (usage["completion_tokens"],
                   per_million(FALLBACK_OUTPUT_USD, usage["completion_tokens"]))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_a_streamed_request_falls_back_before_its_first_event(fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(offline())

    resp = _chat(fake_gateway, key, stream=True)

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-service-model-router"] == "fallback"
    sent = events(resp.text)
    assert sent[-1] == DONE
    assert content(sent[:-1]) == fakes["text-s"].reply
    assert {c["model"] for c in sent[:-1]} == {"chat-fallback"}
    assert books.only_charge(resp.headers["cf-ray"]).model_id == "chat-fallback"


@pytest.mark.parametrize(("failure", "status", "code"), [
    (at_capacity(), 503, "MODEL_AT_CAPACITY"),
    (offline(), 503, "MODEL_OFFLINE"),
    (crashed(), 500, "INFERENCE_FAILED"),
    (reported(500, "the engine gave up"), 500, "INFERENCE_FAILED"),
], ids=["at-capacity", "offline", "crashed", "reported-500"])
def test_a_failing_model_without_fallback_charges_nothing_and_releases_the_hold(
        fake_gateway, fakes, key, books, failure, status, code):
    fakes["text-xs"].fail_with(failure)
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, fallbacks=False)

    assert resp.status_code == status, resp.text
    assert resp.json()["code"] == code
    assert books.charges(resp.headers["cf-ray"]) == []
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_a_failing_stream_without_fallback_is_an_error_before_the_stream_starts(
        fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(at_capacity())
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, fallbacks=False, stream=True)

    assert resp.status_code == 503
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_when_every_model_fails_the_last_error_is_answered_and_nothing_charged(
        fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(at_capacity())
    fakes["text-s"].fail_with(crashed())
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key)

    assert resp.status_code == 500
    assert resp.json()["code"] == "INFERENCE_FAILED"
    assert len(fakes["text-xs"].calls) == len(fakes["text-s"].calls) == 1
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_a_bad_request_reported_by_the_engine_is_not_passed_to_the_fallback(
        fake_gateway, fakes, key, books):
    fakes["text-xs"].fail_with(reported(400, "max_tokens is too large", code="TOO_MANY_TOKENS",
                                        field="max_tokens"))

    resp = _chat(fake_gateway, key)

    assert resp.status_code == 400
    assert resp.json()["code"] == "TOO_MANY_TOKENS"
    assert resp.json()["details"]["max_tokens"]["_errors"] == ["max_tokens is too large"]
    assert fakes["text-s"].calls == []
    assert books.entries() == 0
    assert books.open_holds() == 0


@pytest.mark.parametrize("failure", [crashed(), reported(500, "the engine gave up")],
                         ids=["crashed", "reported-500"])
def test_a_stream_that_breaks_midway_ends_with_an_error_event_and_charges_what_it_sent(
        fake_gateway, fakes, key, books, failure):
    """Before, a broken stream released its hold: the tokens it had sent were free. Now the
    prompt the engine read and the tokens sent are charged, nothing more."""
    fakes["text-xs"].fail_with(failure, after_pieces=2)
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, stream=True)

    assert resp.status_code == 200  # the stream had started
    sent = events(resp.text)
    assert sent[-1] == DONE
    message = "Inference failed" if isinstance(failure, Exception) else "the engine gave up"
    assert sent[-2] == {"error": {"message": message, "type": "server_error",
                                  "code": "INFERENCE_FAILED"}, "code": "INFERENCE_FAILED"}
    delivered = content(sent[:-2])  # what came before the failure was sent
    assert 0 < len(delivered.split()) < fakes["text-xs"].completion_tokens()
    assert fakes["text-s"].calls == []  # too late for a fallback
    (request,) = fakes["text-xs"].requests
    prompt, completion = count_prompt_tokens(request.messages), len(delivered.split())
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {"input": (prompt, per_million(10, prompt)),
                            "output": (completion, per_million(20, completion))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_the_openai_sdk_raises_a_stream_that_breaks_midway_with_the_servers_message(
        fake_gateway, fakes, key):
    fakes["text-xs"].fail_with(crashed(), after_pieces=2)
    sdk = OpenAI(base_url="http://testserver/api/v1", api_key=key, max_retries=0,
                 http_client=fake_gateway.client)
    received = []
    with pytest.raises(APIError) as broke:
        for chunk in sdk.chat.completions.create(
                model="chat-primary", stream=True,
                messages=[{"role": "user", "content": "Name a fast fox"}]):
            received.extend(choice.delta.content or "" for choice in chunk.choices)
    assert "".join(received)  # what was sent before the failure arrived
    assert broke.value.message == "Inference failed"
    assert broke.value.body == {"message": "Inference failed", "type": "server_error",
                                "code": "INFERENCE_FAILED"}
