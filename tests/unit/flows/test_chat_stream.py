"""A streamed chat completion through admission, the text deployment's stream and settlement."""

from __future__ import annotations

from tests.unit.flows.books import per_million
from tests.unit.flows.sse import DONE, content, events

INPUT_USD, OUTPUT_USD = 10, 20  # chat-primary (catalog.yaml), USD per million tokens


def _stream(gateway, key: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": "Name a fast fox"}],
        "stream": True, **body})


def test_streamed_chat_sends_the_reply_as_chunk_events_ending_in_done(fake_gateway, fakes,
                                                                       key):
    resp = _stream(fake_gateway, key)

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    sent = events(resp.text)
    assert sent[-1] == DONE
    chunks = sent[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "chat-primary"
               for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert content(chunks) == fakes["text-xs"].reply
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in c for c in chunks)  # not asked for
    (call,) = fakes["text-xs"].calls
    assert (call.method, call.stream) == ("generate", True)


def test_streamed_chat_reports_usage_in_its_last_chunk_when_asked(fake_gateway, fakes, key):
    resp = _stream(fake_gateway, key, stream_options={"include_usage": True})

    sent = events(resp.text)
    assert sent[-1] == DONE
    last = sent[-2]
    assert last["choices"] == []
    text = fakes["text-xs"]
    assert last["usage"]["completion_tokens"] == text.completion_tokens()
    assert last["usage"]["total_tokens"] == (last["usage"]["prompt_tokens"]
                                             + text.completion_tokens())


def test_streamed_chat_settles_the_measured_tokens(fake_gateway, key, books):
    before = books.balance_nanos()

    resp = _stream(fake_gateway, key, stream_options={"include_usage": True})

    assert resp.status_code == 200, resp.text
    usage = events(resp.text)[-2]["usage"]
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "chat-primary"
    assert charge.lines == {
        "input": (usage["prompt_tokens"], per_million(INPUT_USD, usage["prompt_tokens"])),
        "output": (usage["completion_tokens"],
                   per_million(OUTPUT_USD, usage["completion_tokens"]))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_streamed_chat_answer_carries_model_balance_and_rate_limit_headers(fake_gateway, key):
    resp = _stream(fake_gateway, key)

    h = resp.headers
    assert h["x-service-model-id"] == "chat-primary"
    assert h["x-service-model-router"] == "direct"
    assert h["x-service-balance-usd"] == "10"
    assert int(h["x-ratelimit-remaining-requests"]) == int(h["x-ratelimit-limit-requests"]) - 1
    assert "first-token" in h["server-timing"]  # the stream starts once the model answered


def test_streamed_chat_with_several_choices_charges_every_choice(fake_gateway, fakes, key,
                                                                  books):
    resp = _stream(fake_gateway, key, n=2, stream_options={"include_usage": True})

    sent = events(resp.text)
    finished = {c["choices"][0]["index"] for c in sent[:-2]
                if c["choices"] and c["choices"][0]["finish_reason"] == "stop"}
    assert finished == {0, 1}
    completion = 2 * fakes["text-xs"].completion_tokens()
    assert sent[-2]["usage"]["completion_tokens"] == completion
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.lines["output"] == (completion, per_million(OUTPUT_USD, completion))


def test_a_streamed_tool_call_opens_no_text_before_its_call(fake_gateway, fakes, key):
    for engine in fakes["text-xs"].engines.values():
        engine.reply = '<tool_call>{"name": "note", "arguments": {"text": "hi"}}</tool_call>'
    tool = {"type": "function", "function": {
        "name": "note", "parameters": {"type": "object",
                                       "properties": {"text": {"type": "string"}}}}}

    resp = _stream(fake_gateway, key, tools=[tool])

    chunks = events(resp.text)[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": None}
    assert all(d.get("content") is None for d in deltas)  # no text, not even an empty one
    (call,) = [t for d in deltas for t in d.get("tool_calls", [])]
    assert call["function"]["name"] == "note"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_text_before_a_streamed_tool_call_streams_and_the_call_stays_a_call(fake_gateway,
                                                                             fakes, key):
    # A thinking model reasons first, then calls: the reasoning reaches the client as text,
    # the call as a tool call (never as text).
    for engine in fakes["text-xs"].engines.values():
        engine.reply = ('<think>The user wants a note.</think>'
                        '<tool_call>{"name": "note", "arguments": {"text": "hi"}}</tool_call>')
    tool = {"type": "function", "function": {
        "name": "note", "parameters": {"type": "object",
                                       "properties": {"text": {"type": "string"}}}}}

    resp = _stream(fake_gateway, key, tools=[tool])

    chunks = events(resp.text)[:-1]
    assert content(chunks) == "<think>The user wants a note.</think>"
    deltas = [c["choices"][0]["delta"] for c in chunks]
    (call,) = [t for d in deltas for t in d.get("tool_calls", [])]
    assert call["function"]["name"] == "note"
    assert call["function"]["arguments"] == '{"text": "hi"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
