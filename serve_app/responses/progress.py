"""What a worker saw of its response's events: enough to number the next one, to count the
bytes kept, and to shape the object of a response stopped midway."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHAT_STREAM = "chat.completion.stream"  # the kept object of a resumable chat stream


def compact(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(eq=False)
class Progress:
    """What a worker saw of its response's events: the last number, the bytes kept, the
    latest object, the items done and the text of the one under way (the object of a
    response cancelled midway)."""

    response: dict[str, Any]
    seq: int = -1
    stored_bytes: int = 0
    done_items: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    item: dict[str, Any] | None = None
    last_kind: str | None = None
    failed: bool = False  # a chat stream sent an error event
    ending: bool = False  # its end has begun (once)
    kept_bytes: int = 0  # of what would continue it (its row's `continuation`)
    # The continuation with the prompt's tokens, once the engine told them: kept before the
    # first text is (takeover.py); None once noted, or for a response that keeps none.
    note_prompt: Callable[[], str | None] | None = None

    @property
    def chat(self) -> bool:
        """A chat completion stream (its events numbered here), not a response."""
        return self.response.get("object") == CHAT_STREAM

    def saw(self, payload: dict[str, Any], size: int) -> None:
        self.seq = int(payload["sequence_number"])
        self.stored_bytes += size
        kind = self.last_kind = payload["type"]
        if "response" in payload:
            self.response = {**payload["response"], "background": True}
        if kind == "response.output_item.added":
            self.item, self.text = payload["item"], ""
        elif kind == "response.output_text.delta":
            self.text += payload["delta"]
        elif kind == "response.output_item.done":
            self.done_items.append(payload["item"])
            self.item, self.text = None, ""

    def cut_short(self, status: str) -> dict[str, Any]:
        """The object of a response stopped before its end: what it had made."""
        if self.chat:
            return {**self.response, "status": status}
        output = list(self.done_items)
        if self.item is not None and self.item.get("type") == "message":
            output.append({**self.item, "status": "incomplete", "content": [
                {"type": "output_text", "text": self.text, "annotations": []}]})
        return {**self.response, "status": status, "output": output, "usage": None}
