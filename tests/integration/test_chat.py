"""`POST /chat/completions` on vLLM through the real Serve app, driven by the `openai` SDK."""

from __future__ import annotations

import base64
import json
import time

import httpx
import jsonschema
import pytest
from openai import APIStatusError
from ray import serve

pytestmark = pytest.mark.integration

TINY = "tiny-chat"
SMOL = "smollm2-135m-instruct"



def test_unary_chat_answers_with_usage_and_model_headers(client):
    raw = client.chat.completions.with_raw_response.create(
        model=TINY, messages=[{"role": "user", "content": "Hello"}], max_tokens=16)
    completion = raw.parse()
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == TINY
    assert completion.choices[0].message.role == "assistant"
    assert isinstance(completion.choices[0].message.content, str)
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert 0 < completion.usage.completion_tokens <= 16
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == (completion.usage.prompt_tokens
                                             + completion.usage.completion_tokens)
    assert raw.headers["x-service-model-id"] == TINY
    assert raw.headers["x-service-model-name"] == "Tiny Chat (test model)"
    assert raw.headers["x-service-model-router"] == "direct"
    assert raw.headers["x-service-is-content-violation"] == "false"


def test_a_real_model_gives_a_real_answer(client):
    completion = client.chat.completions.create(
        model=SMOL, temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in completion.choices[0].message.content


def test_streamed_chat_matches_unary_and_ends_with_usage(client):
    args = dict(model=SMOL, temperature=0, max_tokens=20,
                messages=[{"role": "user", "content": "Name three colours."}])
    unary = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unary.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finals == [unary.choices[0].finish_reason]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == unary.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == unary.usage.prompt_tokens


def test_stream_ends_with_done(platform, inference_key):
    with httpx.stream("POST", f"{platform.base_url}/chat/completions",
                      headers=platform.auth(inference_key), timeout=120,
                      json={"model": TINY, "stream": True, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)


def test_n_gives_several_choices(client):
    completion = client.chat.completions.create(
        model=TINY, n=2, max_tokens=8, seed=7,
        messages=[{"role": "user", "content": "Say something"}])
    assert sorted(c.index for c in completion.choices) == [0, 1]


def test_stop_sequences_and_length_limit(client):
    stopped = client.chat.completions.create(
        model=SMOL, temperature=0, max_tokens=60, stop=["5"],
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}])
    assert "5" not in stopped.choices[0].message.content
    assert stopped.choices[0].finish_reason == "stop"
    limited = client.chat.completions.create(
        model=TINY, max_tokens=5, temperature=1.0, seed=3,
        messages=[{"role": "user", "content": "Write a long story."}])
    if limited.choices[0].finish_reason == "length":
        assert limited.usage.completion_tokens == 5


def test_json_schema_reply_parses_and_validates(client):
    # Bounded fields: a random-weight model would otherwise write one string until max_tokens.
    schema = {"type": "object",
              "properties": {"city": {"type": "string", "maxLength": 12},
                             "country": {"type": "string", "enum": ["FR", "DE", "IT"]},
                             "capital": {"type": "boolean"}},
              "required": ["city", "country", "capital"], "additionalProperties": False}
    completion = client.chat.completions.create(
        model=TINY, max_tokens=128, temperature=0,
        messages=[{"role": "user", "content": "Give me a city as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "city", "schema": schema}})
    jsonschema.validate(json.loads(completion.choices[0].message.content), schema)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Local time of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}}


def test_tool_call_in_the_standard_shape(client):
    completion = client.chat.completions.create(
        model=TINY, max_tokens=64, temperature=0, tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        messages=[{"role": "user", "content": "What time is it in Oslo?"}])
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_time"
    assert "city" in json.loads(call.function.arguments)


def test_required_tool_call_streams_as_a_tool_call_delta(client):
    chunks = list(client.chat.completions.create(
        model=TINY, max_tokens=64, temperature=0, tools=[WEATHER_TOOL], tool_choice="required",
        stream=True, messages=[{"role": "user", "content": "Weather in Rome?"}]))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    json.loads(calls[0].function.arguments)
    assert [c.choices[0].finish_reason for c in chunks if c.choices
            and c.choices[0].finish_reason] == ["tool_calls"]


def test_logprobs(client):
    completion = client.chat.completions.create(
        model=TINY, max_tokens=4, logprobs=True, top_logprobs=2,
        messages=[{"role": "user", "content": "hi"}])
    entries = completion.choices[0].logprobs.content
    assert len(entries) == completion.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in entries)


def _prompt_tokens(client, **extra) -> int:
    completion = client.chat.completions.create(max_tokens=1, **{
        "model": TINY, "messages": [{"role": "user", "content": "hi"}], **extra})
    return completion.usage.prompt_tokens


def test_service_system_prompt_comes_first_and_can_be_removed(client):
    # Every variant keeps a system message, so the chat template adds no default of its own.
    caller = [{"role": "system", "content": "Always answer in French."},
              {"role": "user", "content": "hi"}]
    service_only = _prompt_tokens(client)
    both = _prompt_tokens(client, messages=caller)
    caller_only = _prompt_tokens(client, messages=caller, extra_body={
        "service_parameters": {"include_service_system_prompt": False}})
    as_suffix = _prompt_tokens(client, messages=caller,
                               model=f"{TINY}:include_service_system_prompt=false")
    assert caller_only < both  # the service prompt is there by default and can be removed
    assert service_only < both  # the caller's system prompt is appended, not a replacement
    assert as_suffix == caller_only


def test_fallbacks_answer_when_the_first_model_is_offline(client, platform, inference_key):
    raw = client.chat.completions.with_raw_response.create(
        model="big-offline-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
        extra_body={"fallbacks": [{"model": TINY}]})
    assert raw.parse().model == TINY
    assert raw.headers["x-service-model-id"] == TINY
    assert raw.headers["x-service-model-router"] == "fallback"
    with pytest.raises(APIStatusError) as offline:
        client.chat.completions.create(model="big-offline-model", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])
    assert offline.value.status_code == 503
    assert offline.value.response.json()["code"] == "MODEL_OFFLINE"


def test_a_client_that_disconnects_stops_generation(platform, inference_key):
    text_xs = serve.get_deployment_handle("text-xs", app_name="inference")
    before = len(text_xs.stats.remote().result()[TINY]["cancelled_tokens"])
    with httpx.stream("POST", f"{platform.base_url}/chat/completions",
                      headers=platform.auth(inference_key), timeout=120,
                      json={"model": TINY, "stream": True, "max_tokens": 900, "seed": 1,
                            "temperature": 1.0, "messages": [{"role": "user", "content": "go"}]}
                      ) as resp:
        for n, _ in enumerate(resp.iter_lines()):
            if n >= 3:
                break
    # The engine notices the hang-up and stops early, short of the 900 tokens asked for.
    deadline = time.monotonic() + 180
    stats = text_xs.stats.remote().result()[TINY]
    while time.monotonic() < deadline and len(stats["cancelled_tokens"]) == before:
        time.sleep(0.5)
        stats = text_xs.stats.remote().result()[TINY]
    assert len(stats["cancelled_tokens"]) == before + 1
    assert 0 < stats["cancelled_tokens"][-1] < 900
    assert stats["unfinished"] == 0


def test_web_search_results_reach_the_model_and_the_response(client, platform):
    before = len(platform.web.searches)
    plain = client.chat.completions.create(
        model=TINY, max_tokens=1, messages=[{"role": "user", "content": "Who keeps the light?"}])
    searched = client.chat.completions.create(
        model=TINY, max_tokens=1, messages=[{"role": "user", "content": "Who keeps the light?"}],
        extra_body={"service_parameters": {"enable_web_search": "on",
                                           "enable_web_citations": True}})
    assert platform.web.searches[before:] == [{"query": "Who keeps the light?", "limit": 5}]
    assert searched.usage.prompt_tokens > plain.usage.prompt_tokens + 10
    citations = searched.model_extra["service_parameters"]["web_search_citations"]
    assert citations[0]["url"] == "https://example.org/lh"


def test_search_results_can_lead_the_stream(client):
    chunks = list(client.chat.completions.create(
        model=TINY, max_tokens=2, stream=True, messages=[{"role": "user", "content": "light?"}],
        extra_body={"service_parameters": {"enable_web_search": "on",
                                           "include_search_results_in_stream": True}}))
    first = chunks[0].model_extra["service_parameters"]["web_search_citations"]
    assert first[0]["title"] == "Lighthouse report"


def test_scraping_fetches_urls_from_the_message_and_skips_search(client, platform):
    searches = len(platform.web.searches)
    url = f"{platform.web.base}/page/zebra"
    completion = client.chat.completions.create(
        model=TINY, max_tokens=1, messages=[{"role": "user", "content": f"Summarise {url}"}],
        extra_body={"service_parameters": {"enable_web_scraping": True,
                                           "enable_web_search": "on"}})
    docs = completion.model_extra["service_parameters"]["web_search_citations"]
    assert docs[0]["title"] == "Zebra facts"
    assert "black and white stripes" in docs[0]["content"] and "x=1" not in docs[0]["content"]
    assert len(platform.web.searches) == searches


def test_scraping_refuses_private_addresses(client, platform):
    fetched = len(platform.web.fetched)
    # Same server, but named in a way the allow-list does not cover: a private address.
    url = f"http://localhost:{platform.web.port}/page/zebra"
    completion = client.chat.completions.create(
        model=TINY, max_tokens=1, messages=[{"role": "user", "content": f"Read {url}"}],
        extra_body={"service_parameters": {"enable_web_scraping": True}})
    assert len(platform.web.fetched) == fetched
    assert "service_parameters" not in (completion.model_extra or {})


def test_file_parts_are_read_as_text(client):
    data = base64.b64encode(b"The secret word is pineapple. " * 20).decode()
    with_file = _prompt_tokens(client, messages=[{"role": "user", "content": [
        {"type": "text", "text": "hi"},
        {"type": "file", "file": {"filename": "note.txt", "file_data": data}}]}])
    assert with_file > _prompt_tokens(client) + 50


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "https://example.org/cat.png"}},
    {"type": "video_url", "video_url": {"url": "https://example.org/v.mp4"}},
])
def test_media_parts_are_refused_by_text_only_models(client, part):
    """(Audio parts are heard by the transcription model instead: test_chat_audio.py.)"""
    with pytest.raises(APIStatusError) as refused:
        client.chat.completions.create(model=TINY, max_tokens=1, messages=[
            {"role": "user", "content": [{"type": "text", "text": "look"}, part]}])
    assert refused.value.status_code == 400
    assert refused.value.response.json()["code"] == "INVALID_MODEL"


@pytest.mark.parametrize("extra,field", [
    ({"temperature": 3}, "temperature"),
    ({"n": 0}, "n"),
    ({"anon_user_id": "a||b"}, "anon_user_id"),
    ({"top_logprobs": 2}, "_errors"),
    ({"messages": []}, "messages"),
    ({"tool_choice": "required"}, "_errors"),
    ({"service_parameters": {"enable_web_search": "maybe"}}, "service_parameters"),
])
def test_bad_requests_are_400_detailed_errors(platform, inference_key, extra, field):
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], **extra}
    resp = httpx.post(f"{platform.base_url}/chat/completions", json=body,
                      headers=platform.auth(inference_key))
    assert resp.status_code == 400, resp.text
    details = resp.json()["details"]
    assert field in details and (field != "_errors" or details["_errors"])


def test_too_long_a_completion_is_refused(client):
    with pytest.raises(APIStatusError) as refused:
        client.chat.completions.create(model=TINY, max_tokens=200, messages=[
            {"role": "user", "content": "word " * 900}])
    assert refused.value.status_code == 400
    assert refused.value.response.json()["code"] == "TOO_MANY_TOKENS"


def test_unknown_model_and_alias(client):
    with pytest.raises(APIStatusError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[
            {"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404
    aliased = client.chat.completions.create(model="gpt-4o-mini", max_tokens=2, messages=[
        {"role": "user", "content": "hi"}])
    assert aliased.model == TINY


def test_langchain_chat_model_works_unchanged(platform, inference_key):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=SMOL, base_url=platform.base_url, api_key=inference_key,
                     temperature=0, max_tokens=24, max_retries=0)
    reply = llm.invoke("What is the capital of France?")
    assert "Paris" in reply.content
