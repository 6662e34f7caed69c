"""Content parts of chat messages, turned into other parts one at a time (files and audio
become text before the model sees them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from serve_app.schemas.chat import ChatCompletionRequest, ChatMessage


async def replace_parts(req: ChatCompletionRequest, kind: type | tuple[type, ...],
                        replace: Callable[[Any], Awaitable[Any]]) -> ChatCompletionRequest:
    """`req` with each part of type `kind` replaced by what `replace` makes of it, in order,
    one after the other."""
    messages: list[ChatMessage] = []
    for message in req.messages:
        if not isinstance(message.content, list):
            messages.append(message)
            continue
        content = [await replace(part) if isinstance(part, kind) else part
                   for part in message.content]
        messages.append(message.model_copy(update={"content": content}))
    return req.model_copy(update={"messages": messages})
