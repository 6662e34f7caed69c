"""Tool calls and reasoning an upstream server parsed itself, back as the text the Gateway's
tool parser and thinking filter read (deployments/engines/openai_parsed.py)."""

from __future__ import annotations

from typing import Any

from deployments.engines.openai_parsed import ParsedText


def _call(index: int, name: str | None = None, arguments: Any = None) -> dict[str, Any]:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    return {"tool_calls": [{"index": index, "function": function}]}


def test_streamed_calls_open_with_their_name_and_close_when_the_next_starts_or_the_end():
    parsed = ParsedText()
    parts = [parsed.text(0, d, False) for d in (
        _call(0, "get_weather"), _call(0, arguments='{"city": '), _call(0, arguments='"Oslo"}'),
        _call(1, "get_time"))]
    parts.append(parsed.text(0, {}, True))
    assert parts == ['<tool_call>{"name": "get_weather", "arguments": ', '{"city": ', '"Oslo"}',
                     '}</tool_call><tool_call>{"name": "get_time", "arguments": ',
                     "{}}</tool_call>"]  # arguments that never came are {}


def test_reasoning_is_thinking_closed_by_the_first_content_or_the_end():
    parsed = ParsedText()
    text = "".join(parsed.text(0, d, False) for d in (
        {"reasoning_content": "Think"}, {"reasoning_content": "ing."}, {"content": "Hi"}))
    assert text == "<think>Thinking.</think>Hi"
    assert parsed.text(1, {"reasoning": "Only this."}, True) == "<think>Only this.</think>"


def test_each_choice_keeps_its_own_state():
    parsed = ParsedText()
    assert parsed.text(0, _call(0, "a"), False) == '<tool_call>{"name": "a", "arguments": '
    assert parsed.text(1, {"reasoning_content": "b"}, False) == "<think>b"
    assert parsed.text(0, {}, True) == "{}}</tool_call>"
    assert parsed.text(1, {"content": "c"}, True) == "</think>c"


def test_a_unary_message_is_one_finished_part():
    message = {"role": "assistant", "content": None, "reasoning_content": "Why.",
               "tool_calls": [{"id": "x", "type": "function", "function": {
                   "name": "f", "arguments": {"q": 1}}}]}  # the object, not its JSON
    assert ParsedText().text(0, message, True) == \
        '<think>Why.</think><tool_call>{"name": "f", "arguments": {"q": 1}}</tool_call>'
    assert ParsedText().text(0, {"content": "plain"}, True) == "plain"
    assert ParsedText().text(0, None, True) == ""
