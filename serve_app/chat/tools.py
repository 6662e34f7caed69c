"""Tool calling for any model: the tools are described in the system prompt; a required or
named tool is enforced by a JSON schema on the output (structured generation), so even a small
model returns a well-formed call; with `auto`, a reply in the tool-call form is parsed out."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from serve_app.schemas.chat import ChatCompletionRequest, ToolChoiceFunction

_OPEN = "<tool_call>"
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
# The published name of the call that carries web results as documents
# (`return_search_results_as_documents`), for frameworks that read tool calls.
SEARCH_DOCUMENTS_TOOL = "venice_web_search_documents"


def tool_mode(req: ChatCompletionRequest) -> str:
    """`none`, `auto` or `forced`."""
    if not req.tools or req.tool_choice == "none":
        return "none"
    if req.tool_choice == "required" or isinstance(req.tool_choice, ToolChoiceFunction):
        return "forced"
    return "auto"


def tools_system_prompt(req: ChatCompletionRequest) -> str:
    specs = "\n".join(json.dumps(t.function.model_dump(exclude_none=True)) for t in req.tools or [])
    return ("You can call these functions:\n" + specs + "\nTo call one, reply with only "
            '<tool_call>{"name": <function name>, "arguments": {<arguments>}}</tool_call>.')


def as_given(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | None,
                                                 str | dict[str, Any] | None]:
    """The request's tools and tool choice in the convention's form, for a server that
    parses tool calls itself (None, None: the request has no tools)."""
    if not req.tools:
        return None, None
    tools = [{"type": "function", "function": t.function.model_dump(exclude_none=True)}
             for t in req.tools]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        return tools, choice.model_dump(exclude_none=True)
    return tools, choice


def uses_tools(req: ChatCompletionRequest) -> bool:
    """Whether the request has tools, or calls and results of tools in its conversation."""
    return bool(req.tools) or any(m.role == "tool" or m.tool_calls for m in req.messages)


def _call_schema(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"type": "string", "const": name},
                           "arguments": parameters or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def forced_call_schema(req: ChatCompletionRequest) -> dict[str, Any]:
    tools = req.tools or []
    if isinstance(req.tool_choice, ToolChoiceFunction):
        tools = [t for t in tools if t.function.name == req.tool_choice.function.name]
    options = [_call_schema(t.function.name, t.function.parameters) for t in tools]
    return options[0] if len(options) == 1 else {"anyOf": options}


def new_call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": args}}


def search_documents_call(documents: list[dict[str, str]]) -> dict[str, Any]:
    """The tool call that hands the web results to the client as documents."""
    return new_call(SEARCH_DOCUMENTS_TOOL, {"documents": documents})


def parse_calls(text: str, known: set[str]) -> list[dict[str, Any]] | None:
    """Tool calls in a reply (`<tool_call>{...}</tool_call>` blocks or one bare JSON object
    naming a known function), or None when the reply is ordinary text."""
    bodies = _TAGGED.findall(text) or ([text.strip()] if text.strip().startswith("{") else [])
    calls = []
    for body in bodies:
        try:
            # strict=False: a model may put raw control characters (a tab) inside strings.
            obj = json.loads(body, strict=False)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in known:
            return None
        calls.append(new_call(obj["name"], obj.get("arguments", {})))
    return calls or None


def may_be_call(prefix: str) -> bool:
    """Whether streamed text so far could still turn out to be a tool call (hold it back)."""
    head = prefix.lstrip()
    return head.startswith("{") or "<tool_call>".startswith(head[:11]) or head.startswith(
        "<tool_call>")


def release(held: str) -> tuple[str, str]:
    """Streamed text held back, split into what can go out as text now and what must still
    wait: text that may be a call as a whole (may_be_call), else from the first
    `<tool_call>` (or the start of one at the end) on. Text before a call, such as a thinking
    model's `<think>` block, streams while its calls are still held."""
    if may_be_call(held):
        return "", held
    at = held.find(_OPEN)
    if at < 0:  # the tag's first characters at the very end may still become it
        at = next((len(held) - n for n in range(min(len(held), len(_OPEN) - 1), 0, -1)
                   if _OPEN.startswith(held[-n:])), len(held))
    return held[:at], held[at:]
