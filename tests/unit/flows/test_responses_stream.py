"""A streamed `/responses` answer as the Responses API's clients read it: every event of the
convention in its order (created, in progress, the item and its content part opened, the text or
the call's arguments in deltas, each closed, completed), numbered from 0, so that the `openai`
SDK's stream helper (and a UI showing the arguments as they come) builds the same answer the
final event carries."""

from __future__ import annotations

import json

import pytest

from tests.fakes import FakeTextDeployment, crashed

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture
def text(fakes) -> FakeTextDeployment:
    return fakes["text-xs"]


def _says(text: FakeTextDeployment, reply: str) -> None:
    for engine in text.engines.values():
        engine.reply = reply


def test_a_streamed_text_answer_sends_every_event_in_order(sdk, text):
    with sdk.responses.stream(model="chat-primary", input="Name a fast fox") as stream:
        events = list(stream)
        final = stream.get_final_response()

    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 2  # streamed in pieces
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text == text.reply
    part_done = next(e for e in events if e.type == "response.content_part.done")
    assert part_done.part.text == text.reply
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.content == []  # its one part is added by the next event
    assert all(e.logprobs == [] for e in events if e.type.startswith("response.output_text"))


def test_a_stream_that_breaks_ends_with_response_failed_after_what_it_sent(sdk, text):
    text.fail_with(crashed(), after_pieces=2)
    with sdk.responses.stream(model="chat-primary", input="Name a fast fox") as stream:
        events = list(stream)

    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-1] == "response.failed" and "response.completed" not in kinds
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")
    failed = events[-1].response
    assert failed.status == "failed"
    assert (failed.error.code, failed.error.message) == ("INFERENCE_FAILED", "Inference failed")
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_a_streamed_call_sends_its_arguments_as_a_delta_before_they_are_done(sdk, text):
    _says(text, '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    with sdk.responses.stream(model="chat-primary", input="Weather in Rome?", tools=[WEATHER],
                              tool_choice="required") as stream:
        events = list(stream)
        final = stream.get_final_response()

    kinds = [event.type for event in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done",
                     "response.completed"]
    delta = next(e for e in events if e.type == "response.function_call_arguments.delta")
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(delta.delta) == json.loads(call.arguments) == {"city": "Rome"}


def test_an_answer_held_back_as_a_possible_call_is_still_streamed_as_text(sdk, text):
    """With tools offered, text that may open a call is held back; once it is text after all,
    it still goes out as a delta (not only in the closing events)."""
    _says(text, "<tool_call> is not a call here")
    with sdk.responses.stream(model="chat-primary", input="Say it", tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()

    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == final.output_text == "<tool_call> is not a call here"
    assert [e.type for e in events][2:4] == ["response.output_item.added",
                                             "response.content_part.added"]


def test_text_before_a_streamed_call_streams_as_text_and_the_call_stays_a_call(sdk, text):
    _says(text, '<think>Rome it is.</think>'
                '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>')
    with sdk.responses.stream(model="chat-primary", input="Weather in Rome?",
                              tools=[WEATHER]) as stream:
        events = list(stream)
        final = stream.get_final_response()

    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert streamed == "<think>Rome it is.</think>"
    message, call = final.output
    assert message.type == "message" and final.output_text == streamed
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Rome"}
    assert [event.sequence_number for event in events] == list(range(len(events)))
