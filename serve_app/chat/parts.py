"""Content parts of chat messages: their base64 payloads decoded within a size, and parts turned
into other parts one at a time (files and audio become text before the model sees them)."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Awaitable, Callable
from typing import Any

from serve_app.errors import invalid_request, payload_too_large
from serve_app.schemas.chat import ChatCompletionRequest, ChatMessage

_DATA_URL = re.compile(r"^data:([\w.+/-]+)?(;[\w=.-]+)*;base64,", re.I)


def decode_payload(value: str, max_bytes: int, too_large: str, not_base64: str
                   ) -> tuple[bytes, str]:
    """The bytes of a base64 payload (bare or a `data:` URL) and the URL's media type (lower
    case, "" when none). Its size is judged before decoding (4 characters per 3 bytes): 413
    `too_large` past `max_bytes`, 400 `not_base64` when it is not base64."""
    media_type = ""
    match = _DATA_URL.match(value)
    if match:
        media_type = (match.group(1) or "").lower()
        value = value[match.end():]
    if len(value) * 3 // 4 > max_bytes:
        raise payload_too_large(too_large)
    try:
        return base64.b64decode(value, validate=True), media_type
    except (binascii.Error, ValueError) as exc:
        raise invalid_request(not_base64, "messages") from exc


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
