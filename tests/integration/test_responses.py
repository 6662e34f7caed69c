"""`POST /responses` through the real Serve app, with the `openai` SDK."""

from __future__ import annotations

import json
import time

import httpx
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


def _read_then_leave(platform, key: str, path: str, body: dict, events: int) -> str:
    """POST a stream, read `events` SSE data lines and close the connection; the id."""
    seen: list[dict] = []
    with httpx.Client(timeout=120) as http, http.stream(
            "POST", f"{platform.base_url}{path}", json=body,
            headers={"Authorization": f"Bearer {key}"}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                seen.append(json.loads(line[6:]))
                if len(seen) == events:
                    break
    first = seen[0]
    return first["response"]["id"] if "response" in first else first["id"]


def _ended(platform, key: str, url: str) -> dict:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        body = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
        if body.get("status") not in ("queued", "in_progress"):
            return body
        time.sleep(0.5)
    raise AssertionError(f"{url} did not end: {body}")


def test_a_background_stream_whose_client_left_runs_to_its_end(platform, inference_key):
    """Under Serve a client that leaves cancels its request and the model calls made for it:
    the generation of a background stream is not one of them, and completes unwatched."""
    response_id = _read_then_leave(
        platform, inference_key, "/responses",
        {"model": SMOL, "input": "Count from one to forty in words.", "temperature": 0,
         "max_output_tokens": 48, "background": True, "stream": True}, events=4)

    done = _ended(platform, inference_key, f"{platform.base_url}/responses/{response_id}")

    assert done["status"] == "completed", done
    assert done["usage"]["output_tokens"] > 4


def test_a_resumable_chat_stream_whose_client_left_runs_to_its_end(platform, inference_key):
    stream_id = _read_then_leave(
        platform, inference_key, "/chat/completions",
        {"model": SMOL, "temperature": 0, "max_tokens": 48, "stream": True,
         "stream_options": {"resumable": True, "include_usage": True},
         "messages": [{"role": "user", "content": "Count from one to forty in words."}]},
        events=3)
    url = f"{platform.base_url}/chat/completions/{stream_id}?stream=true"

    with httpx.Client(timeout=300) as http, http.stream(
            "GET", url, headers={"Authorization": f"Bearer {inference_key}",
                                 "Last-Event-ID": "2"}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: {")]

    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    assert "length" in finishes or "stop" in finishes, chunks[-3:]
    assert chunks[-1]["usage"]["completion_tokens"] > 3
