"""A unary chat's answer from a server the operator runs (`engine: openai`), as `TextEvent`s.

A unary chat goes upstream as one non-streamed call (`stream: false`): the server answers one
JSON body instead of a stream of events to parse (for a 1-token chat, vLLM's server sends five:
the role, the token, the finish, the usage and the end). The body becomes what the streamed
path would have merged into: one `Chunk` per choice (its text, tokens, finish reason and
logprobs; the first carries the prompt's count), then the `Usage` the server reported. Tool
calls and reasoning the server parsed itself become text (deployments/engines/openai_parsed.py).
The HTTP call, its errors and the server's health are the engine's
(deployments/engines/openai_upstream.py).
"""

from __future__ import annotations

import logging
from typing import Any

from deployments.engines.openai_parsed import ParsedText
from deployments.protocol import Chunk, Usage

logger = logging.getLogger("deployments.openai_upstream")


class NotAChatCompletion(ValueError):
    """The server's 200 answer is not a chat completion (no choices, an error inside, a
    body that is not JSON)."""


def unary_events(data: Any, prompt_estimate: int) -> list[Chunk | Usage]:
    """The chunks of a non-streamed chat completion `data`, one per choice in index order,
    and its usage: the server's report, or (when it reports none, logged) the prompt's
    `prompt_estimate` and each choice's tokens as counted here."""
    if not isinstance(data, dict) or "error" in data:
        raise NotAChatCompletion
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not all(
            isinstance(choice, dict) for choice in choices):
        raise NotAChatCompletion
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    prompt, cached = _prompt(usage, prompt_estimate)
    reported = _count(usage, "completion_tokens")
    shares = _shares(reported, len(choices))
    chunks: list[Chunk] = []
    parsed = ParsedText()
    for position, choice in enumerate(sorted(choices, key=_index)):
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if content is not None and not isinstance(content, str):
            raise NotAChatCompletion
        # its tool calls and reasoning the server parsed itself, as text again
        text = parsed.text(_index(choice), message, finished=True)
        logprobs = (choice.get("logprobs") or {}).get("content") or None
        if shares is not None:
            tokens = shares[position]
        else:
            tokens = len(logprobs) if logprobs else _estimate(text)
        first = position == 0
        chunks.append(Chunk(index=_index(choice), text=text, tokens=tokens,
                            # a non-streamed answer is a finished one
                            finish_reason=choice.get("finish_reason") or "stop",
                            logprobs=logprobs,
                            prompt_tokens=prompt if first else None,
                            cached_tokens=cached if first else None))
    counted = sum(chunk.tokens for chunk in chunks)
    if reported is None:
        logger.info("upstream reported no usage: billing the counted %d prompt (estimated) "
                    "and %d completion tokens", prompt, counted)
    return [*chunks, Usage(prompt, reported if reported is not None else counted, cached)]


def _index(choice: dict[str, Any]) -> int:
    try:
        return int(choice.get("index", 0))
    except (TypeError, ValueError):
        raise NotAChatCompletion from None


def _count(usage: dict[str, Any] | None, name: str) -> int | None:
    value = (usage or {}).get(name)
    return int(value) if isinstance(value, int | float) and value >= 0 else None


def _prompt(usage: dict[str, Any] | None, estimate: int) -> tuple[int, int]:
    """The prompt's tokens (the server's figure, else the estimate) and those its prefix
    cache served (at most the prompt)."""
    prompt = _count(usage, "prompt_tokens")
    if prompt is None:
        prompt = estimate
    details = (usage or {}).get("prompt_tokens_details")
    cached = _count(details if isinstance(details, dict) else None, "cached_tokens") or 0
    return prompt, min(cached, prompt)


def _shares(reported: int | None, choices: int) -> list[int] | None:
    """The reported completion tokens shared among the choices (the first takes what does
    not divide evenly): the convention reports one figure for all of them."""
    if reported is None:
        return None
    each, left = divmod(reported, choices)
    return [each + (left if i == 0 else 0) for i in range(choices)]


def _estimate(text: str) -> int:
    """About four bytes a token (the prompt's estimate, serve_app/chat/engine_request.py)."""
    return len(text.encode()) // 4 + 1 if text else 0
