"""What an upstream server parsed itself, back into the text our pipeline reads.

A server started with its own tool or reasoning parser (vLLM `--enable-auto-tool-choice
--tool-call-parser ...`, `--reasoning-parser ...`; SGLang; TGI) answers tool calls in
`tool_calls` and reasoning in `reasoning_content` (some servers: `reasoning`), the content left
empty. The Gateway's one tool parser (serve_app/chat/tools.py) and thinking filter
(serve_app/chat/filters.py) read text, so each choice's parts become text again: reasoning as
`<think>...</think>` before the content, each call as
`<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>`. Streamed, a call opens with its
name when it starts, its argument fragments follow as they come, and it closes when the next
call starts or the choice finishes (arguments that never came are `{}`). A unary message is
the same as one delta that finishes its choice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass
class _Choice:
    thinking: bool = False  # a `<think>` is open
    call: int | None = None  # the upstream index of the open tool call
    arguments: bool = False  # the open call's arguments have begun


class ParsedText:
    """The text of every choice of one answer, delta by delta (a choice keeps its state
    between deltas: an open `<think>`, an open tool call)."""

    def __init__(self) -> None:
        self._choices: dict[int, _Choice] = {}

    def text(self, index: int, part: Any, finished: bool) -> str:
        """The text of choice `index`'s `part` (a streamed delta, or a unary message), with
        what it leaves open closed when `finished`."""
        state = self._choices.setdefault(index, _Choice())
        part = part if isinstance(part, dict) else {}
        out: list[str] = []
        reasoning = next((part[f] for f in _REASONING_FIELDS if isinstance(part.get(f), str)
                          and part[f]), "")
        content = part.get("content") if isinstance(part.get("content"), str) else ""
        calls = [c for c in part.get("tool_calls") or [] if isinstance(c, dict)]
        if reasoning:
            if not state.thinking:
                out.append(_close_call(state) + "<think>")
                state.thinking = True
            out.append(reasoning)
        if content or calls:
            out.append(_close_thinking(state))
        if content:
            out.append(_close_call(state))
            out.append(content)
        for position, call in enumerate(calls):
            out.append(_call_text(state, call, position))
        if finished:
            out.append(_close_call(state))
            out.append(_close_thinking(state))
        return "".join(out)


def _call_text(state: _Choice, call: dict[str, Any], position: int) -> str:
    """A call's opening (a new index, or the first call) and its argument fragment."""
    index = call.get("index", position)
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    out: list[str] = []
    if state.call is None or index != state.call:
        out.append(_close_call(state))
        name = function.get("name") if isinstance(function.get("name"), str) else ""
        out.append(f'<tool_call>{{"name": {json.dumps(name)}, "arguments": ')
        state.call, state.arguments = index, False
    arguments = function.get("arguments")
    if isinstance(arguments, dict):  # some servers send the object, not its JSON
        arguments = json.dumps(arguments)
    if isinstance(arguments, str) and arguments:
        out.append(arguments)
        state.arguments = True
    return "".join(out)


def _close_call(state: _Choice) -> str:
    if state.call is None:
        return ""
    closing = ("" if state.arguments else "{}") + "}</tool_call>"
    state.call, state.arguments = None, False
    return closing


def _close_thinking(state: _Choice) -> str:
    if not state.thinking:
        return ""
    state.thinking = False
    return "</think>"
