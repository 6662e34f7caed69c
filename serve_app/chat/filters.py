"""Streaming text filters applied to model output: each takes deltas and returns what may be
shown now, holding back only the few characters that could still turn out to be markup."""

from __future__ import annotations

import re


class TextFilter:
    def feed(self, text: str) -> str:
        raise NotImplementedError

    def flush(self) -> str:
        return ""


class ThinkStripper(TextFilter):
    """Removes `<think>...</think>` blocks (and an unclosed one to the end)."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self) -> None:
        self._buffer = ""
        self._inside = False

    def feed(self, text: str) -> str:
        self._buffer += text
        out: list[str] = []
        while True:
            tag = self.CLOSE if self._inside else self.OPEN
            at = self._buffer.find(tag)
            if at >= 0:
                if not self._inside:
                    out.append(self._buffer[:at])
                self._buffer = self._buffer[at + len(tag):]
                self._inside = not self._inside
                continue
            # Keep a tail that might be the start of the tag.
            keep = next((k for k in range(min(len(tag) - 1, len(self._buffer)), 0, -1)
                         if tag.startswith(self._buffer[-k:])), 0)
            if not self._inside:
                out.append(self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return "".join(out)

    def flush(self) -> str:
        rest, self._buffer = ("" if self._inside else self._buffer), ""
        return rest


class CaretCitations(TextFilter):
    """Rewrites bracket citations `[1]`, `[1, 2]` into the caret form `^1^`, `^1,2^`."""

    # Not right after a word character: `items[0]` in code is an index, not a citation.
    _CITATION = re.compile(r"(?<![\w\]])\[(\d+(?:\s*,\s*\d+)*)\]")
    _PARTIAL = re.compile(r"\[[\d,\s]*$")

    def __init__(self) -> None:
        self._buffer = ""

    def _rewrite(self, text: str) -> str:
        return self._CITATION.sub(lambda m: "^" + re.sub(r"\s+", "", m.group(1)) + "^", text)

    def feed(self, text: str) -> str:
        self._buffer += text
        partial = self._PARTIAL.search(self._buffer)
        cut = partial.start() if partial else len(self._buffer)
        ready, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return self._rewrite(ready)

    def flush(self) -> str:
        rest, self._buffer = self._buffer, ""
        return self._rewrite(rest)


class FilterChain(TextFilter):
    def __init__(self, filters: list[TextFilter]) -> None:
        self.filters = filters

    def feed(self, text: str) -> str:
        for f in self.filters:
            text = f.feed(text)
        return text

    def flush(self) -> str:
        text = ""
        for f in self.filters:
            text = f.feed(text) + f.flush()
        return text
