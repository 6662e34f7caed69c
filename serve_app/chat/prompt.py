"""The conversation the engine sees: system prompts composed in order (the service's default,
a character's, web context, tool descriptions, then the caller's), multimodal parts checked
against the model's capabilities (files are text parts by now: chat/files.py) and kept as
placeholders for a vision model (chat/media.py reads them), tool turns written as plain
text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from serve_app.chat.web import WebDocument
from serve_app.errors import UnsupportedFeature
from serve_app.models.catalog import CatalogModel
from serve_app.schemas.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ImagePart,
    TextPart,
    VideoPart,
)

# Audio parts are heard by the transcription model first (chat/audio_parts.py), on any model.
_PART_CAPABILITY = {
    ImagePart: ("supportsVision", "image inputs (image_url)"),
    VideoPart: ("supportsVideoInput", "video inputs (video_url)"),
}


def _part_capabilities(req: ChatCompletionRequest) -> list[tuple[str, str]]:
    """The capabilities the request's parts need (capability, what it is called)."""
    return [needed for message in req.messages if isinstance(message.content, list)
            for part in message.content if (needed := _PART_CAPABILITY.get(type(part)))]


def takes_parts(req: ChatCompletionRequest, model: CatalogModel) -> bool:
    """Whether `model` takes every image and video part of the request (a fallback that does
    not is passed over)."""
    return all(model.capabilities.get(name) for name, _ in _part_capabilities(req))


def check_capabilities(req: ChatCompletionRequest, model: CatalogModel) -> None:
    caps = model.capabilities
    for name, label in _part_capabilities(req):
        if not caps.get(name):
            raise UnsupportedFeature(f"Model {model.id} does not accept {label}", "messages")
    if req.tools and req.tool_choice != "none" and not caps.get("supportsFunctionCalling"):
        raise UnsupportedFeature(f"Model {model.id} does not support tools", "tools")
    if req.response_format and req.response_format.type != "text" \
            and not caps.get("supportsResponseSchema"):
        raise UnsupportedFeature(f"Model {model.id} does not support response_format",
                                 "response_format")
    if req.logprobs and not caps.get("supportsLogProbs"):
        raise UnsupportedFeature(f"Model {model.id} does not return logprobs", "logprobs")
    # As the reference: `reasoning` / `reasoning_effort` on a model that does not reason are
    # ignored (engine_request.reasoning_effort passes them on where it does), and
    # `enable_e2ee` (its default is true) does not apply to a model without E2EE.
    sp = req.service_parameters
    if sp.enable_x_search and not caps.get("supportsXSearch"):
        raise UnsupportedFeature(f"Model {model.id} has no native X search",
                                 "service_parameters")
    if sp.enable_web_search == "on" and not caps.get("supportsWebSearch"):
        raise UnsupportedFeature(f"Model {model.id} does not support web search",
                                 "service_parameters")


@dataclass
class Composition:
    service_prompt: str = ""
    character_prompt: str = ""
    web_documents: list[WebDocument] = field(default_factory=list)
    citations: bool = False
    tools_prompt: str = ""
    # The model's server takes tools as they came (`CatalogModel.native_tools`): the
    # conversation's calls and results stay in the convention's form.
    native_tools: bool = False
    # A vision model's turn: image and video parts stay in user messages as placeholders
    # ({"type": "image"}, {"type": "video"}) for its chat template, in the order of the media.
    media: bool = False


def _web_block(docs: list[WebDocument], citations: bool) -> str:
    lines = ["Use these web results to answer; they are more recent than your knowledge."]
    for number, doc in enumerate(docs, start=1):
        lines.append(f"[{number}] {doc.title} ({doc.url})\n{doc.content}")
    if citations:
        lines.append("Cite the results you use with caret superscripts such as ^1^ or ^1,2^ "
                     "after the sentence; never use brackets for citations.")
    return "\n\n".join(lines)


def _content_text(message: ChatMessage) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    pieces = []
    for part in message.content:
        # File parts arrive as text parts: chat/files.py extracts them before the prompt.
        if isinstance(part, TextPart):
            pieces.append(part.text)
    return "\n\n".join(pieces)


def engine_messages(req: ChatCompletionRequest, comp: Composition) -> list[dict[str, Any]]:
    system_parts = [comp.service_prompt, comp.character_prompt]
    if comp.web_documents:
        system_parts.append(_web_block(comp.web_documents, comp.citations))
    system_parts.append(comp.tools_prompt)
    conversation: list[dict[str, Any]] = []
    for message in req.messages:
        text = _content_text(message)
        if message.role in ("system", "developer"):
            system_parts.append(text)
        elif message.role == "tool" and comp.native_tools:
            conversation.append({"role": "tool", "tool_call_id": message.tool_call_id,
                                 "content": text})
        elif message.role == "tool":
            conversation.append({"role": "user",
                                 "content": f"Result of tool call {message.tool_call_id}: {text}"})
        elif message.role == "assistant" and message.tool_calls and comp.native_tools:
            conversation.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in message.tool_calls]})
        elif message.role == "assistant" and message.tool_calls:
            calls = "".join(
                "<tool_call>" + json.dumps({"name": c.function.name,
                                            "arguments": _json_or_text(c.function.arguments)})
                + "</tool_call>" for c in message.tool_calls)
            conversation.append({"role": "assistant", "content": (text + calls).strip()})
        elif comp.media and message.role == "user" and isinstance(message.content, list):
            conversation.append({"role": "user", "content": _media_content(message)})
        else:
            conversation.append({"role": message.role, "content": text})
    system = "\n\n".join(p.strip() for p in system_parts if p and p.strip())
    return ([{"role": "system", "content": system}] if system else []) + conversation


def rendered_bytes(req: ChatCompletionRequest, comp: Composition) -> int:
    """UTF-8 bytes of the conversation as the engine is sent it (tool calls and the tools'
    prompt as `engine_messages` writes them, non-ASCII escaped to `\\uXXXX` there), in JSON,
    which the chat template's text cannot outgrow: the hold's bound on its tokens."""
    return len(json.dumps(engine_messages(req, comp), ensure_ascii=False).encode())


def _media_content(message: ChatMessage) -> list[dict[str, Any]]:
    """A user message's parts as the chat template reads them: text, and a placeholder for
    each image and video (files and audio are text parts by now)."""
    parts: list[dict[str, Any]] = []
    for part in message.content or []:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            parts.append({"type": "image"})
        elif isinstance(part, VideoPart):
            parts.append({"type": "video"})
    return parts


def _json_or_text(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def last_user_text(req: ChatCompletionRequest) -> str:
    for message in reversed(req.messages):
        if message.role == "user":
            return _content_text(message) if not isinstance(message.content, list) else \
                "\n".join(p.text for p in message.content if isinstance(p, TextPart))
    return ""
