"""The text family in process: the real `TextDeployment` (deployments/text.py) with a fake
engine behind it, so its fair-share gate, its stream (coalesced lists, deployments/streaming.py)
and its merge of a unary reply are the ones the Gateway meets in production.

The fake engine answers every choice with `reply`, one token per word, in `pieces` chunks;
`max_tokens` cuts it (finish_reason `length`); with a `context` set, a prompt that leaves less
than `max_tokens` of it is refused with TOO_MANY_TOKENS, as vLLM refuses it. The prompt
counts one token per word and one per message. Asked to continue a final assistant message
(the chat template's `continue_final_message`), it answers the rest of `reply` after that
message's words (all of it when the message is not its beginning), the message counted in the
prompt without its role's token (as a template counts the generation prompt in neither).
Like vLLM's prefix cache, a prompt's longest prefix shared with an earlier prompt under the
same `cache_salt` counts as cached (all but its last token at most).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from deployments.protocol import Chunk, EngineError, Message, TextEvent, TextRequest, Usage
from deployments.text import TextDeployment
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of

DEFAULT_REPLY = "The quick brown fox jumps over the lazy dog."


def words(text: str) -> list[str]:
    """One token per word, with its trailing space: the pieces add up to `text`."""
    return re.findall(r"\S+\s*", text)


def _message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def prompt_token_list(messages: list[Message]) -> list[str]:
    """The fake's tokenizer: one token per word of each message, after one for its role."""
    return [token for m in messages
            for token in [f"<{m.get('role')}>", *words(_message_text(m))]]


def count_prompt_tokens(messages: list[Message]) -> int:
    return len(prompt_token_list(messages))


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class FakeTextEngine(FakeEngine):
    """A text engine (deployments/engines/text.py `TextEngine`) that answers in microseconds.
    A failure set on it comes after `after_pieces` chunks: an exception is raised (the engine
    crashed), an EngineError is yielded (its own report, as vLLM's engine reports one)."""

    max_model_len = 32_768
    max_num_seqs = 64

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(weights, options)
        self.reply = DEFAULT_REPLY
        self.pieces = 3
        self._prompts_seen: dict[str | None, list[list[str]]] = {}  # by cache salt
        self.context: int | None = None  # vLLM's max_model_len, enforced when set

    def cached_tokens(self, prompt: list[str], salt: str | None = None) -> int:
        """What the prefix cache serves of `prompt` under `salt`, which it then holds too."""
        seen = self._prompts_seen.setdefault(salt, [])
        shared = max((_common_prefix(prompt, earlier) for earlier in seen), default=0)
        seen.append(prompt)
        return min(shared, len(prompt) - 1)

    def chunks(self, request: TextRequest) -> list[TextEvent]:
        """The whole answer to `request`: each choice's chunks, then the usage."""
        assert isinstance(request, TextRequest), request
        n = request.sampling.n
        said = words(self.reply)
        messages = request.messages
        continued = bool(request.chat_template_kwargs.get("continue_final_message")) \
            and bool(messages) and messages[-1].get("role") == "assistant"
        if continued:
            begun = words(_message_text(messages[-1]))
            if said[:len(begun)] == begun:
                said = said[len(begun):]
        prompt_list = prompt_token_list(messages) if not continued else [
            *prompt_token_list(messages[:-1]), *words(_message_text(messages[-1]))]
        prompt = len(prompt_list)
        limit = request.sampling.max_tokens
        context = self.context
        if context is not None and limit is not None and prompt + limit > context:
            return [EngineError(400, f"{prompt} prompt tokens and max_tokens {limit} exceed "
                                     f"the context of {context}",
                                code="TOO_MANY_TOKENS", field="max_tokens")]
        if limit is None and context is not None:  # the context's rest, as vLLM fills it in
            limit = context - prompt
        finish = "stop"
        if limit is not None and len(said) > limit:
            said, finish = said[:limit], "length"
        size = max(1, -(-len(said) // max(1, self.pieces)))
        groups = [said[i:i + size] for i in range(0, len(said), size)] or [[]]
        cached = self.cached_tokens(prompt_list, request.cache_salt)
        chunks: list[TextEvent] = []
        for index in range(n):
            for g, group in enumerate(groups):
                chunks.append(Chunk(
                    index=index, text="".join(group), tokens=len(group),
                    finish_reason=finish if g == len(groups) - 1 else None,
                    # the real engine puts the prompt's count on the first chunk
                    prompt_tokens=prompt if not chunks else None,
                    cached_tokens=cached if not chunks else None))
        chunks.append(Usage(prompt_tokens=prompt,
                            completion_tokens=n * sum(len(g) for g in groups),
                            cached_tokens=cached))
        return chunks

    async def generate(self, request: TextRequest) -> AsyncIterator[TextEvent]:
        answer = self.chunks(request)
        failure = self.failure
        if failure is not None:
            answer = answer[:self.after_pieces]
        for event in answer:
            await asyncio.sleep(0)
            yield event
        if isinstance(failure, BaseException):
            raise failure
        if isinstance(failure, EngineError):
            yield failure

    def stats(self) -> dict[str, Any]:
        return {"unfinished": 0, "cancelled_tokens": []}

    def shutdown(self) -> None:
        """Nothing to stop."""


class FakeTextDeployment(ServedDeployment):
    """A text-* deployment: the real `TextDeployment`, its models on `FakeTextEngine`s (or the
    `engine` given) answering `reply` in `pieces` chunks."""

    METHODS = ("generate", "complete", "stats")
    DEPLOYMENT = class_of(TextDeployment)
    ENGINE = FakeTextEngine

    def __init__(self, deployment_name: str = "text-xs",
                 models: Sequence[str | ModelOptions] = ("chat",), *,
                 reply: str = DEFAULT_REPLY, pieces: int = 3,
                 engine: type[FakeTextEngine] | None = None) -> None:
        super().__init__(deployment_name, models, engine=engine)
        self.reply = reply
        for fake in self.engines.values():
            fake.reply, fake.pieces = reply, max(1, pieces)

    @property
    def requests(self) -> list[TextRequest]:
        """The engine requests of the calls so far, in order."""
        return [c.args[1] for c in self.calls if c.method in ("generate", "complete")]

    def completion_tokens(self, max_tokens: int | None = None) -> int:
        """What one choice of the reply counts (cut at `max_tokens`)."""
        count = len(words(self.reply))
        return min(count, max_tokens) if max_tokens else count
