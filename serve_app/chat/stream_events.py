"""A planned chat's answer as a stream of chat.completion.chunk server-sent events: search
results first when asked, text as it comes (held back while it may be a tool call), tool calls,
usage, and the mark of the settlement (pipeline/bill.py) before `[DONE]`: what was
delivered is durable before the stream says it is done."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from deployments.protocol import Chunk, TextEvent
from deployments.protocol import Usage as EngineUsage
from deployments.streaming import coalesce
from serve_app.chat import tools as tool_calls
from serve_app.chat.filters import TextFilter
from serve_app.chat.plan import ChatPlan
from serve_app.errors import ApiError, stream_error_body
from serve_app.models.router import RoutedModel
from serve_app.pipeline.bill import SETTLE, Mark


def chunks_with_first(first: TextEvent, rest: AsyncIterator[TextEvent]
                      ) -> AsyncIterator[TextEvent]:
    async def gen():
        yield first
        async for chunk in rest:
            yield chunk

    return gen()


async def _queued(chunks: AsyncIterator[TextEvent]) -> AsyncIterator[TextEvent]:
    """The chunks, with those that arrived while the previous event was being written merged
    per choice: when the model outpaces this replica, one event carries several tokens."""
    async for merged in coalesce(chunks, min_interval_s=0):
        for chunk in merged:
            yield chunk


def choice_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return {"content": entries} if entries is not None else None


def citations(plan: ChatPlan) -> list[dict[str, str]]:
    return [d.as_dict() for d in plan.web_documents]


def _sse(payload: dict[str, Any] | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


async def sse_events(plan: ChatPlan, routed: RoutedModel,
                      chunks: AsyncIterator[TextEvent]) -> AsyncIterator[str | Mark]:
    base = {"id": f"chatcmpl-{plan.request_id}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": routed.model.id}

    def event(index: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: list | None = None) -> str:
        return _sse({**base, "choices": [{"index": index, "delta": delta,
                                          "logprobs": choice_logprobs(logprobs),
                                          "finish_reason": finish}]})

    filters: dict[int, TextFilter] = {}
    held: dict[int, str] = {}  # text held back while it may still be a tool call
    started: set[int] = set()
    first_call = 0  # the index of a choice's first own tool call (after the documents)
    try:
        if plan.params.include_search_results_in_stream and plan.web_documents:
            yield _sse({**base, "choices": [],
                        "service_parameters": {"web_search_citations": citations(plan)}})
        if plan.params.return_search_results_as_documents and plan.web_documents:
            # The documents come first, as a tool call of each choice; the choice's own
            # calls (if any) follow it.
            documents = tool_calls.search_documents_call(citations(plan))
            first_call = 1
            for i in range(plan.req.n):
                started.add(i)
                yield event(i, {"role": "assistant", "content": None,
                                "tool_calls": [dict(documents, index=0)]})
        async for chunk in _queued(chunks):
            if isinstance(chunk, EngineUsage):
                plan.usage.record(chunk)
                continue
            assert isinstance(chunk, Chunk)  # an EngineError raised in stream_model
            i = chunk.index
            plan.usage.saw(chunk)
            f = filters.setdefault(i, plan.output_filter())
            text = f.feed(chunk.text)
            if i not in started:
                started.add(i)
                # With tools offered the answer may be calls, not text: no text opened yet
                # (a client of the convention would show an empty text before the calls).
                yield event(i, {"role": "assistant",
                                "content": None if plan.tool_mode != "none" else ""})
            if plan.tool_mode != "none":
                held[i] = held.get(i, "") + text
                if plan.tool_mode == "auto":
                    text, held[i] = tool_calls.release(held[i])
                else:
                    text = ""
            if text or chunk.logprobs:
                yield event(i, {"content": text}, logprobs=chunk.logprobs)
            if chunk.finish_reason:
                rest = held.pop(i, "") + f.flush()
                reason = chunk.finish_reason
                calls = tool_calls.parse_calls(rest, plan.known_tools) \
                    if plan.tool_mode != "none" else None
                if calls:
                    yield event(i, {"tool_calls": [dict(c, index=n) for n, c in
                                                   enumerate(calls, start=first_call)]})
                    reason = "tool_calls"
                elif rest:
                    yield event(i, {"content": rest})
                yield event(i, {}, finish=reason)
        if plan.req.stream_options and plan.req.stream_options.include_usage:
            yield _sse({**base, "choices": [], "usage": plan.usage.as_dict()})
        yield SETTLE
        yield _sse("[DONE]")
    except ApiError as exc:
        # The response has started: report the failure in the stream itself. What was
        # delivered before it is charged (the prompt the engine read, the tokens sent, the
        # web read, the audio heard), nothing more.
        yield SETTLE
        yield _sse(stream_error_body(exc, "chat"))
        yield _sse("[DONE]")
