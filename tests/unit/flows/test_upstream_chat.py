"""Chat with a model on a server the operator runs (`engine: openai`), as a client sees it: the
Gateway in process, the real text deployment holding the model's upstream engine, a real
OpenAI-compatible server on a socket (tests/fakes/upstream_server.py) behind it. The answer
and its charge come from the upstream's usage; its refusals are the spec's errors (a 429 or 503
upstream goes to the fallbacks, or reaches the client as a 503 with Retry-After); a stream it
cuts ends with the stream's error and charges what was delivered; its address never shows."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.models.catalog import load_catalog
from serve_app.models.upstream_states import UpstreamStates
from tests.fakes.handles import DeploymentHandle
from tests.fakes.upstream_models import (
    UpstreamTextDeployment,
    upstream_catalog,
    upstream_fleet,
    upstream_model,
)
from tests.fakes.upstream_server import PROMPT_TOKENS, REPLY, UpstreamServer, upstream_server
from tests.unit.flows.conftest import CATALOG
from tests.unit.flows.sse import DONE, content, events

MODEL = "chat-upstream"
NATIVE = "chat-upstream-native-tools"  # its server parses tool calls itself
KEY = "sk-upstream-secret-for-flows"


@pytest.fixture
def upstream() -> Iterator[UpstreamServer]:
    with upstream_server() as server:
        yield server


@pytest.fixture
def gateway_catalog(tmp_path: Path, upstream: UpstreamServer,
                    monkeypatch: pytest.MonkeyPatch) -> Path:
    """The flows' catalog and a model on the upstream, with its key's variable set."""
    monkeypatch.setenv("UPSTREAM_KEY_FOR_FLOWS", KEY)

    def model(model_id: str, **options: Any) -> dict[str, Any]:
        entry = upstream_model(
            upstream, model_id, upstream_name="upstream-model",
            api_key_env="UPSTREAM_KEY_FOR_FLOWS", type="text", name="Chat upstream",
            deployment="text-m", size_class="M", context_length=4096,
            max_completion_tokens=256,
            capabilities={"supportsFunctionCalling": True, "supportsReasoning": True},
            pricing={"input": {"usd": 10, "diem": 10}, "output": {"usd": 20, "diem": 20},
                     "cache_input": {"usd": 10, "diem": 10}})
        entry["engine_options"].update(options)
        return entry

    return upstream_catalog(tmp_path, CATALOG, model(MODEL),
                            model(NATIVE, native_tools=True))


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    """The flows' fakes, but text-m is the real text deployment, holding the model."""
    return upstream_fleet(load_catalog(gateway_catalog), UpstreamTextDeployment, "text-m")


def _chat(gateway, key: str, **body: Any):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], **body})


def test_a_chat_is_the_upstreams_answer_charged_by_its_usage(fake_gateway, key, books,
                                                             upstream):
    resp = _chat(fake_gateway, key, max_tokens=100)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == MODEL
    assert resp.json()["choices"][0]["message"]["content"] == REPLY
    usage = resp.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS, 10)
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == MODEL
    assert sum(units for units, _ in charge.lines.values()) == PROMPT_TOKENS + 10
    [body] = upstream.bodies
    assert body["model"] == "upstream-model" and body["max_tokens"] == 100
    assert body["stream"] is False  # a unary chat is one non-streamed call upstream
    assert upstream.authorizations == [f"Bearer {KEY}"]


def test_a_streamed_chat_ends_with_the_upstreams_usage(fake_gateway, key, upstream):
    resp = _chat(fake_gateway, key, stream=True, stream_options={"include_usage": True})
    assert resp.status_code == 200, resp.text
    chunks = events(resp.text)
    assert chunks[-1] == DONE and content(chunks) == REPLY
    assert chunks[-2]["usage"]["completion_tokens"] == 10
    assert chunks[-2]["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert upstream.bodies[0]["stream"] is True


@pytest.mark.parametrize("status", ["429", "503"])
def test_an_upstream_at_capacity_is_a_503_with_retry_after_and_charges_nothing(
        fake_gateway, key, books, upstream, status):
    upstream.behaviour = status
    before = books.balance_nanos()
    resp = _chat(fake_gateway, key)
    assert resp.status_code == 503, resp.text
    assert resp.json()["code"] == "MODEL_AT_CAPACITY"
    assert resp.headers["retry-after"] == "7"
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_an_upstream_at_capacity_passes_the_chat_to_the_fallback(fake_gateway, key, fakes,
                                                                upstream):
    upstream.behaviour = "429"
    resp = _chat(fake_gateway, key, fallbacks=[{"model": "chat-fallback"}])
    assert resp.status_code == 200, resp.text
    assert resp.json()["model"] == "chat-fallback"
    assert [c.model_id for c in fakes["text-s"].calls] == ["chat-fallback"]


def test_an_upstream_400_is_a_400_with_its_message_and_not_its_address(fake_gateway, key,
                                                                      upstream):
    upstream.behaviour = "400"
    resp = _chat(fake_gateway, key)
    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert resp.json()["error"].startswith("max_tokens is too large for")
    assert "127.0.0.1" not in resp.text


def test_an_upstream_answer_that_is_no_chat_completion_is_a_500_and_charges_nothing(
        fake_gateway, key, books, upstream):
    upstream.behaviour = "malformed"
    before = books.balance_nanos()
    resp = _chat(fake_gateway, key)
    assert resp.status_code == 500, resp.text
    assert resp.json()["code"] == "INFERENCE_FAILED"
    assert books.balance_nanos() == before and books.open_holds() == 0


def test_a_stream_the_upstream_cuts_ends_with_its_error_and_charges_what_was_delivered(
        fake_gateway, key, books, upstream):
    upstream.behaviour, upstream.cut_after = "cut", 3
    resp = _chat(fake_gateway, key, stream=True)
    assert resp.status_code == 200
    chunks = events(resp.text)
    assert content(chunks) == "Hello from the "
    assert chunks[-2]["code"] == "INFERENCE_FAILED" and chunks[-1] == DONE
    charge = books.only_charge(resp.headers["cf-ray"])
    units = dict(charge.lines)
    assert units["output"][0] == 3 and units["input"][0] > 0  # the prompt, estimated


def test_the_model_list_shows_the_upstream_model_and_not_its_address(fake_gateway, upstream):
    resp = fake_gateway.client.get("/api/v1/models")
    assert resp.status_code == 200
    assert MODEL in [m["id"] for m in resp.json()["data"]]
    address = upstream.base_url.removeprefix("http://").removesuffix("/v1")
    assert address not in resp.text and "UPSTREAM_KEY_FOR_FLOWS" not in resp.text


def test_an_upstream_that_stops_answering_is_listed_offline_named_by_ready_and_comes_back(
        fake_gateway, key, fakes, upstream):
    router = fake_gateway.services.router
    # Every reader asks the deployment again (the Gateway's default: at most every 5 s).
    router.upstreams = UpstreamStates(router.catalog, router.deployment_handle, max_age_s=0)
    upstream.behaviour = "down"
    for _ in range(2):  # the catalog's failures_to_offline
        assert _chat(fake_gateway, key).status_code == 500
    assert _chat(fake_gateway, key).json()["code"] == "MODEL_OFFLINE"  # not asked again

    ready = fake_gateway.client.get("/ready")
    # Not the text default: the platform serves the rest, so it stays ready, naming the model.
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"][f"model:{MODEL}"] == (
        "degraded: its server does not answer (2 failures in a row); its replica probes it "
        "until it does")
    listed = fake_gateway.client.get(f"/api/v1/models/{MODEL}").json()
    assert listed["model_spec"]["offline"] is True

    upstream.behaviour = "ok"
    deployment = fakes["text-m"].deployment
    for _ in range(600):  # the replica's probe (every 0.05 s here) finds it again
        if fake_gateway.client.portal.call(deployment.stats)[MODEL]["upstream"]["online"]:
            break
        time.sleep(0.05)
    assert fake_gateway.client.get("/ready").json()["checks"][f"model:{MODEL}"] == "ok"
    assert fake_gateway.client.get(f"/api/v1/models/{MODEL}").json()["model_spec"][
        "offline"] is False
    assert _chat(fake_gateway, key).status_code == 200


# A server with its own parsers (vLLM `--enable-auto-tool-choice --tool-call-parser hermes
# --reasoning-parser ...`): reasoning in `reasoning_content`, calls in `tool_calls` streamed as
# the name, then argument fragments; the second call's arguments never come.
PARSED_DELTAS = [
    {"role": "assistant", "reasoning_content": "The user wants "},
    {"reasoning_content": "the weather."},
    {"tool_calls": [{"index": 0, "id": "call-a", "type": "function",
                     "function": {"name": "get_weather"}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
    {"tool_calls": [{"index": 1, "id": "call-b", "type": "function",
                     "function": {"name": "get_time", "arguments": ""}}]},
]
PARSED_MESSAGE = {"content": None, "reasoning_content": "The user wants the weather.",
                  "tool_calls": [
                      {"id": "call-a", "type": "function", "function": {
                          "name": "get_weather", "arguments": '{"city": "Paris"}'}},
                      {"id": "call-b", "type": "function", "function": {
                          "name": "get_time", "arguments": "{}"}}]}
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
         for name in ("get_weather", "get_time")]
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {})]


def _calls(tool_calls: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in tool_calls]


def test_tool_calls_the_upstream_parsed_reach_the_client_as_tool_calls(fake_gateway, key,
                                                                      upstream):
    upstream.parsed_message = PARSED_MESSAGE
    resp = _chat(fake_gateway, key, tools=TOOLS, tool_choice="auto")
    assert resp.status_code == 200, resp.text
    [choice] = resp.json()["choices"]
    assert _calls(choice["message"]["tool_calls"]) == CALLS
    assert choice["finish_reason"] == "tool_calls"
    assert resp.json()["usage"]["completion_tokens"] == 10  # the upstream's usage


def test_streamed_tool_call_fragments_the_upstream_parsed_reach_the_client_as_tool_calls(
        fake_gateway, key, upstream):
    # the reasoning before the calls streams as text; the calls arrive as calls
    upstream.parsed_deltas = PARSED_DELTAS
    resp = _chat(fake_gateway, key, tools=TOOLS, tool_choice="auto", stream=True,
                 stream_options={"include_usage": True})
    assert resp.status_code == 200, resp.text
    chunks = events(resp.text)[:-1]
    assert content(chunks) == "<think>The user wants the weather.</think>"
    calls = [t for c in chunks for ch in c["choices"] for t in ch["delta"].get("tool_calls", [])]
    assert _calls(calls) == CALLS
    finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finish == ["tool_calls"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(PARSED_DELTAS)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_the_upstream_parsed_is_thinking_the_client_can_strip(fake_gateway, key,
                                                                        upstream, stream):
    upstream.parsed_finish = "stop"
    upstream.parsed_message = {"reasoning_content": "Greet back.", "content": "Hello!"}
    upstream.parsed_deltas = [{"reasoning": "Greet "}, {"reasoning": "back."},
                              {"content": "Hello"}, {"content": "!"}]

    def answer(**body: Any) -> str:
        resp = _chat(fake_gateway, key, stream=stream, **body)
        assert resp.status_code == 200, resp.text
        return content(events(resp.text)) if stream else \
            resp.json()["choices"][0]["message"]["content"]

    assert answer() == "<think>Greet back.</think>Hello!"
    stripped = answer(service_parameters={"strip_thinking_response": True})
    assert stripped.strip() == "Hello!"


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-a", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call-a", "content": "Sunny, 21 C"},
]


def test_a_server_that_parses_tools_is_sent_them_as_they_came(fake_gateway, key, upstream):
    upstream.parsed_message = PARSED_MESSAGE
    forced = {"type": "function", "function": {"name": "get_weather"}}
    resp = _chat(fake_gateway, key, model=NATIVE, tools=TOOLS, tool_choice=forced,
                 messages=HISTORY)
    assert resp.status_code == 200, resp.text
    [choice] = resp.json()["choices"]
    assert _calls(choice["message"]["tool_calls"]) == CALLS
    [body] = upstream.bodies
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "get_time"]
    assert body["tool_choice"] == forced
    assert "response_format" not in body  # the server enforces the choice, not a schema
    # the conversation's call and result in the convention's form, no tools described
    system, *conversation = body["messages"]
    assert system["role"] == "system" and "get_weather" not in system["content"]
    assert conversation == HISTORY


def test_a_server_that_parses_tools_streams_its_calls_as_tool_calls(fake_gateway, key,
                                                                    upstream):
    upstream.parsed_deltas = PARSED_DELTAS
    resp = _chat(fake_gateway, key, model=NATIVE, tools=TOOLS, stream=True)
    assert resp.status_code == 200, resp.text
    chunks = events(resp.text)[:-1]
    calls = [t for c in chunks for ch in c["choices"] for t in ch["delta"].get("tool_calls", [])]
    assert _calls(calls) == CALLS
    [body] = upstream.bodies
    assert body["tools"] == TOOLS and "tool_choice" not in body


def test_without_native_tools_the_tools_are_described_in_the_conversation(fake_gateway, key,
                                                                         upstream):
    upstream.parsed_message = PARSED_MESSAGE
    resp = _chat(fake_gateway, key, tools=TOOLS, messages=HISTORY)
    assert resp.status_code == 200, resp.text
    [body] = upstream.bodies
    assert "tools" not in body and "tool_choice" not in body
    system, *conversation = body["messages"]
    assert system["role"] == "system" and "get_weather" in system["content"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "user"]


def test_a_fallback_that_takes_tools_otherwise_is_passed_over(fake_gateway, key, fakes,
                                                             upstream):
    upstream.behaviour = "503"
    resp = _chat(fake_gateway, key, model=NATIVE, tools=TOOLS,
                 fallbacks=[{"model": "chat-fallback"}])
    assert resp.status_code == 503, resp.text
    assert fakes["text-s"].calls == []
    resp = _chat(fake_gateway, key, model=NATIVE, fallbacks=[{"model": "chat-fallback"}])
    assert resp.status_code == 200, resp.text  # no tools: the fallback answers
    assert resp.json()["model"] == "chat-fallback"
