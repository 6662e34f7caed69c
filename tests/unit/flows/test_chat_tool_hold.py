"""The hold covers the prompt as the engine is sent it: tool call arguments and tool
descriptions are written into the prompt with non-ASCII characters escaped (`\\ud83d\\ude00`, 12
bytes for an emoji of 4), and the hold is sized on that rendering, not on the request's bytes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.unit.flows.books import per_million
from tests.unit.flows.conftest import CATALOG

INPUT_USD, OUTPUT_USD = 10, 20  # chat-primary (catalog.yaml), per million tokens
EMOJI = "\U0001f600"
CONTEXT = 100_000  # so that the context does not cap the hold


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog, chat-primary with a long context."""
    catalog = yaml.safe_load(CATALOG.read_text())
    for model in catalog["models"]:
        if model["id"] == "chat-primary":
            model["context_length"] = CONTEXT
    path = tmp_path / "long-context-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


def _body(arguments: str, description: str) -> dict:
    return {
        "model": "chat-primary", "max_tokens": 1,
        "tools": [{"type": "function", "function": {
            "name": "note", "description": description,
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}}],
        "messages": [
            {"role": "user", "content": "Take a note."},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "note", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "user", "content": "Thanks."}]}


def test_the_hold_covers_tool_calls_as_the_engine_sees_them(fake_gateway, fakes, key, books):
    """The attack: tool call arguments of emoji, 4 bytes each in the request and 12 in the
    engine's prompt (and tokens to match): the hold was sized on the 4. Now the hold's input
    tokens cover every byte of the prompt the engine is sent."""
    arguments = json.dumps({"text": EMOJI * 600}, ensure_ascii=False)
    body = _body(arguments, "Keeps a note " + EMOJI * 200)
    fake = fakes["text-xs"]
    answers: list = []
    fake.pause()
    try:
        asking = threading.Thread(target=lambda: answers.append(fake_gateway.client.post(
            "/api/v1/chat/completions", headers=fake_gateway.auth(key), json=body)))
        asking.start()
        deadline = time.monotonic() + 30
        while not fake.calls:  # the request is admitted and its hold taken
            assert time.monotonic() < deadline, "the request never reached the model"
            time.sleep(0.01)
        (request,) = fake.requests
        held = books.held(request.request_id)
    finally:
        fake.resume()
    asking.join()

    (resp,) = answers
    assert resp.status_code == 200, resp.text
    assert "\\ud83d\\ude00" in request.messages[2]["content"]  # the rendering this is about
    sent = json.dumps(request.messages, ensure_ascii=False).encode()
    request_bytes = len(json.dumps(body, ensure_ascii=False).encode())
    assert len(sent) > request_bytes + 4096  # far more than the request's own bytes
    assert held is not None
    assert held - per_million(OUTPUT_USD, 1) >= per_million(INPUT_USD, len(sent))
    assert books.open_holds() == 0
