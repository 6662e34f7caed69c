"""Server-sent events of a streamed answer, as a client reads them."""

from __future__ import annotations

import json
from typing import Any

DONE = "[DONE]"


def events(body: str) -> list[Any]:
    """Each `data:` payload in order: JSON decoded, `[DONE]` kept as the string."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == DONE else json.loads(data))
    return out


def content(chunks: list[Any]) -> str:
    """The text of choice 0 the stream's chunks carry."""
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if isinstance(c, dict) and c.get("choices"))
