"""`POST /responses` through the real Serve app, with the `openai` SDK."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

SMOL = "smollm2-135m-instruct"
TINY = "tiny-chat"



def test_response_object_with_output_text_and_usage(client):
    response = client.responses.create(model=SMOL, input="What is the capital of France?",
                                       temperature=0, max_output_tokens=24,
                                       instructions="Answer in one short sentence.")
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert "Paris" in response.output_text
    assert response.usage.input_tokens > 0
    assert response.usage.total_tokens == (response.usage.input_tokens
                                           + response.usage.output_tokens)


def test_streamed_response_events(client):
    events = list(client.responses.create(model=SMOL, input="Name a colour.", temperature=0,
                                          max_output_tokens=12, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text
    assert [e.sequence_number for e in events] == sorted(e.sequence_number for e in events)


def test_function_call_output_item(client):
    tool = {"type": "function", "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object",
                           "properties": {"city": {"type": "string", "maxLength": 12}},
                           "required": ["city"]}}
    response = client.responses.create(model=TINY, input="Weather in Rome?", tools=[tool],
                                       tool_choice="required", max_output_tokens=64)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert "city" in json.loads(calls[0].arguments)


def test_message_items_and_json_schema_format(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    response = client.responses.create(
        model=TINY, max_output_tokens=32,
        input=[{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Reply as JSON."}]}],
        text={"format": {"type": "json_schema", "name": "flag", "schema": schema}})
    assert isinstance(json.loads(response.output_text)["ok"], bool)


def test_background_response_retrieved_and_its_stream_resumed(client):
    """A background response on the real engine: answered at once, run with no client
    reading, fetched once done; its stream read again from the start and after event k gives
    the same events from k on, each once, and the same text as the whole."""
    created = client.responses.create(model=SMOL, input="Name three colours.", temperature=0,
                                      max_output_tokens=24, background=True)
    assert created.status in ("queued", "in_progress") and created.background

    everything = list(client.responses.retrieve(created.id, stream=True))
    done = client.responses.retrieve(created.id)

    assert done.status == "completed"
    assert [e.sequence_number for e in everything] == list(range(len(everything)))
    assert everything[-1].type == "response.completed"
    text = "".join(e.delta for e in everything if e.type == "response.output_text.delta")
    assert text == done.output_text and text
    k = 3
    resumed = list(client.responses.retrieve(created.id, stream=True, starting_after=k))
    assert [e.sequence_number for e in resumed] == list(range(k + 1, len(everything)))
    assert "".join(e.delta for e in everything[:k + 1] + resumed
                   if e.type == "response.output_text.delta") == text
    client.responses.delete(created.id)
