"""A model on a server the operator runs (`engine: openai`), through the real text deployment
class in process, against a real HTTP server on a socket (tests/fakes/upstream_server.py): what
the Gateway receives for a unary chat (one non-streamed call upstream) and a streamed one, the
upstream's refusals as ours, an answer that is no chat completion, a stream cut mid-way, a
client that leaves either, an upstream that stops answering and comes back, and its address
and key kept from answers and logs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from deployments.protocol import Chunk, EngineError, Sampling, TextEvent, TextRequest, Usage
from deployments.spec import ModelSpec
from deployments.text import TextDeployment
from tests.fakes.served import class_of
from tests.fakes.upstream_server import (
    CACHED_TOKENS,
    PROMPT_TOKENS,
    REPLY,
    UpstreamServer,
    upstream_server,
)

MODEL = "pool-chat"
KEY = "sk-upstream-secret-0123456789"


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    with upstream_server() as server:
        yield server


def _deployment(upstream: UpstreamServer, monkeypatch: pytest.MonkeyPatch,
                **options: Any) -> Any:
    monkeypatch.setenv("POOL_KEY_FOR_TEST", KEY)
    spec: ModelSpec = {"id": MODEL, "engine": "openai", "weights": None,
                       "engine_options": {"base_url": upstream.base_url,
                                          "upstream_model": "upstream-model",
                                          "api_key_env": "POOL_KEY_FOR_TEST", **options},
                       "max_queue_wait_s": 5.0}
    return class_of(TextDeployment)([spec])


def _request(**sampling: Any) -> TextRequest:
    return TextRequest("req-1", [{"role": "user", "content": "Say hello."}],
                       Sampling(**sampling))


async def _streamed(deployment: Any, request: TextRequest) -> list[TextEvent]:
    events: list[TextEvent] = []
    async for piece in deployment.generate(MODEL, request):
        events.extend(piece if isinstance(piece, list) else [piece])
    return events


def _text(events: list[TextEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, Chunk))


async def test_a_unary_chat_is_the_upstreams_answer_billed_by_its_usage(upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch)
    events = await deployment.complete(MODEL, _request(temperature=0.2, max_tokens=50))
    assert _text(events) == REPLY
    assert [e.finish_reason for e in events if isinstance(e, Chunk)][-1] == "stop"
    assert events[-1] == Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=10,
                               cached_tokens=CACHED_TOKENS)
    [body] = upstream.bodies
    # one JSON body back, not a stream to parse: a non-streamed answer always has its usage
    assert body["model"] == "upstream-model" and body["stream"] is False
    assert "stream_options" not in body
    assert (body["temperature"], body["max_tokens"]) == (0.2, 50)
    assert body["messages"] == [{"role": "user", "content": "Say hello."}]
    assert upstream.authorizations == [f"Bearer {KEY}"]


async def test_a_unary_chat_of_several_choices_with_logprobs_has_one_chunk_each(
        upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch)
    events = await deployment.complete(MODEL, _request(n=2, max_tokens=3, logprobs=True,
                                                       top_logprobs=1))
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert [(c.index, c.text, c.finish_reason) for c in chunks] == [
        (0, "Hello from the ", "length"), (1, "Hello from the ", "length")]
    assert [[entry["token"] for entry in c.logprobs or []] for c in chunks] == [
        ["Hello ", "from ", "the "]] * 2
    assert (chunks[0].prompt_tokens, chunks[1].prompt_tokens) == (PROMPT_TOKENS, None)
    assert events[-1] == Usage(PROMPT_TOKENS, 6, CACHED_TOKENS)
    [body] = upstream.bodies
    assert (body["n"], body["logprobs"], body["top_logprobs"]) == (2, True, 1)


async def test_a_unary_answer_without_usage_is_billed_as_counted(upstream, monkeypatch):
    upstream.report_usage = False
    deployment = _deployment(upstream, monkeypatch)
    events = await deployment.complete(MODEL, _request())
    assert _text(events) == REPLY
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.cached_tokens == 0
    # the prompt and the reply estimated at about four bytes a token
    assert usage.prompt_tokens > 0 and usage.completion_tokens == len(REPLY) // 4 + 1


@pytest.mark.parametrize("behaviour", ["malformed", "cut"])
async def test_a_unary_answer_that_is_no_chat_completion_is_a_500_and_counts_as_a_failure(
        upstream, monkeypatch, behaviour):
    upstream.behaviour = behaviour
    deployment = _deployment(upstream, monkeypatch)
    [failed] = await deployment.complete(MODEL, _request())
    assert (failed.status, failed.code) == (500, "INFERENCE_FAILED")
    assert (await deployment.stats())[MODEL]["upstream"]["failures_in_a_row"] == 1


async def test_a_client_that_leaves_a_unary_chat_closes_the_upstream_call_at_once(
        upstream, monkeypatch):
    upstream.behaviour = "slow"
    deployment = _deployment(upstream, monkeypatch)
    call = asyncio.get_running_loop().create_task(deployment.complete(MODEL, _request()))
    for _ in range(600):  # the upstream has the request
        if upstream.bodies:
            break
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert await asyncio.to_thread(upstream.left.wait, 30), "the upstream kept generating"
    stats = (await deployment.stats())[MODEL]
    assert stats["unfinished"] == 0 and stats["cancelled_tokens"] == [0]
    assert stats["upstream"] == {"online": True, "failures_in_a_row": 0}


async def test_a_streamed_chat_carries_the_prompt_on_its_first_chunk_and_ends_with_usage(
        upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch, usage_every_chunk=True)
    events = await _streamed(deployment, _request(max_tokens=4))
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert _text(events) == "Hello from the upstream "
    assert chunks[0].prompt_tokens == PROMPT_TOKENS
    assert chunks[0].cached_tokens == CACHED_TOKENS
    assert sum(c.tokens for c in chunks) == 4 and chunks[-1].finish_reason == "length"
    assert events[-1] == Usage(PROMPT_TOKENS, 4, CACHED_TOKENS)
    assert upstream.bodies[0]["stream"] is True
    assert upstream.bodies[0]["stream_options"] == {"include_usage": True,
                                                    "continuous_usage_stats": True}


async def test_chats_one_after_another_reuse_one_connection_to_the_upstream(
        upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch, usage_every_chunk=True)
    for _ in range(3):
        assert _text(await _streamed(deployment, _request())) == REPLY
        assert _text(await deployment.complete(MODEL, _request())) == REPLY
    assert len(upstream.client_ports) == 6 and len(set(upstream.client_ports)) == 1


async def test_an_output_schema_and_tools_reach_the_upstream(upstream, monkeypatch):
    deployment = _deployment(upstream, monkeypatch)
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    request = TextRequest("req-2", [{"role": "user", "content": "hi"}], json_schema=schema,
                          tools=tools)
    await deployment.complete(MODEL, request)
    [body] = upstream.bodies
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": schema, "strict": True}}
    assert body["tools"] == tools


@pytest.mark.parametrize("status", ["429", "503"])
async def test_an_upstream_at_capacity_is_a_503_with_its_retry_after(upstream, monkeypatch,
                                                                     status):
    upstream.behaviour = status
    deployment = _deployment(upstream, monkeypatch)
    [refused] = await deployment.complete(MODEL, _request())
    assert isinstance(refused, EngineError)
    assert (refused.status, refused.code, refused.retry_after) == (503, "MODEL_AT_CAPACITY", 7)
    [streamed] = await _streamed(deployment, _request())
    assert streamed == refused
    # a refusal for load is an answer: the upstream stays online
    assert (await deployment.stats())[MODEL]["upstream"]["online"] is True


async def test_an_upstream_400_stays_a_400_with_its_message_and_not_its_address(
        upstream, monkeypatch):
    upstream.behaviour = "400"
    deployment = _deployment(upstream, monkeypatch)
    [refused] = await deployment.complete(MODEL, _request())
    assert isinstance(refused, EngineError) and refused.status == 400
    assert refused.message.startswith("max_tokens is too large for")
    assert "127.0.0.1" not in refused.message
    assert upstream.bodies[0]["stream"] is False
    assert await _streamed(deployment, _request()) == [refused]


async def test_an_upstream_that_fails_is_a_500_the_gateway_passes_to_fallbacks(
        upstream, monkeypatch):
    upstream.behaviour = "500"
    deployment = _deployment(upstream, monkeypatch)
    [failed] = await deployment.complete(MODEL, _request())
    assert (failed.status, failed.code, failed.message) == (500, "INFERENCE_FAILED",
                                                            "Inference failed")


async def test_a_stream_cut_mid_way_ends_with_an_error_after_what_was_delivered(
        upstream, monkeypatch):
    upstream.behaviour, upstream.cut_after = "cut", 3
    deployment = _deployment(upstream, monkeypatch)
    events = await _streamed(deployment, _request())
    assert _text(events) == "Hello from the "
    assert isinstance(events[-1], EngineError)
    assert (events[-1].status, events[-1].code) == (500, "INFERENCE_FAILED")
    chunks = [e for e in events if isinstance(e, Chunk)]
    # what the client pays for: the prompt (estimated: the upstream reported nothing yet)
    # and the three words it received
    assert chunks[0].prompt_tokens and sum(c.tokens for c in chunks) == 3
    assert not any(isinstance(e, Usage) for e in events)


async def test_a_client_that_leaves_closes_the_upstream_stream_at_once(upstream, monkeypatch):
    upstream.behaviour = "slow"
    deployment = _deployment(upstream, monkeypatch)
    stream = deployment.generate(MODEL, _request())
    first = await anext(stream)
    assert _text(first if isinstance(first, list) else [first])
    await stream.aclose()
    assert await asyncio.to_thread(upstream.left.wait, 30), "the upstream kept generating"
    stats = (await deployment.stats())[MODEL]
    assert stats["unfinished"] == 0 and len(stats["cancelled_tokens"]) == 1


async def test_an_upstream_down_goes_offline_after_its_failures_and_a_probe_brings_it_back(
        upstream, monkeypatch):
    upstream.behaviour = "down"
    deployment = _deployment(upstream, monkeypatch, failures_to_offline=2,
                             probe_interval_s=0.05)
    for _ in range(2):
        [failed] = await deployment.complete(MODEL, _request())
        assert failed.status == 500
    assert (await deployment.stats())[MODEL]["upstream"] == {"online": False,
                                                             "failures_in_a_row": 2}
    [offline] = await deployment.complete(MODEL, _request())
    assert (offline.status, offline.code, offline.retry_after) == (503, "MODEL_OFFLINE", 0.05)
    assert len(upstream.bodies) == 2  # an offline upstream is not asked
    upstream.behaviour = "ok"
    for _ in range(600):  # the probe's next round
        if (await deployment.stats())[MODEL]["upstream"]["online"]:
            break
        await asyncio.sleep(0.05)
    events = await deployment.complete(MODEL, _request())
    assert _text(events) == REPLY


async def test_an_upstream_that_does_not_answer_is_a_503_offline(monkeypatch):
    with upstream_server() as gone:
        pass  # its port now refuses connections
    deployment = _deployment(gone, monkeypatch)
    [refused] = await deployment.complete(MODEL, _request())
    assert (refused.status, refused.code) == (503, "MODEL_OFFLINE")
    assert refused.retry_after


async def test_the_upstreams_address_and_key_reach_no_answer_and_no_log(
        upstream, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    deployment = _deployment(upstream, monkeypatch, failures_to_offline=10)
    answers: list[Any] = []
    for behaviour in ("ok", "400", "500", "cut", "malformed", "429"):
        upstream.behaviour = behaviour
        answers += await deployment.complete(MODEL, _request())
        answers += await _streamed(deployment, _request())
    answers += [await deployment.stats()]
    address = upstream.base_url.removeprefix("http://").removesuffix("/v1")
    for text in [repr(a) for a in answers] + [r.getMessage() for r in caplog.records]:
        assert address not in text and KEY not in text
