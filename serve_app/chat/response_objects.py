"""`/responses` on the chat machinery: the request becomes a chat request, the chat answer
becomes a response object (or the response.* event stream)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from typing import Any

from deployments.protocol import Chunk, TextEvent, Usage
from serve_app.accounts.key_store import KeyRecord
from serve_app.chat import tools as tool_calls
from serve_app.chat.serving import (
    ChatPlan,
    ChatService,
    chunks_with_first,
)
from serve_app.errors import ApiError, stream_error_body
from serve_app.pipeline.bill import SETTLE, BilledEvents, Mark, aclose
from serve_app.pipeline.context import RequestContext
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.schemas.responses import (
    FunctionCallItem,
    FunctionCallOutputItem,
    NamedTool,
    ResponsesRequest,
)


def _parts(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type in ("input_text", "output_text"):
            parts.append({"type": "text", "text": part.text or ""})
        elif part.type == "input_image":
            url = part.image_url if isinstance(part.image_url, str) else (
                (part.image_url or {}).get("url", ""))
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif part.type == "input_file":
            parts.append({"type": "file", "file": {"file_data": part.file_data,
                                                   "filename": part.filename}})
    return parts


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else []
    for item in [] if isinstance(req.input, str) else req.input:
        if isinstance(item, FunctionCallItem):
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": item.call_id, "type": "function",
                 "function": {"name": item.name, "arguments": item.arguments}}]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": item.output})
        else:
            messages.append({"role": item.role, "content": _parts(item.content)})
    messages.extend(items)
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
        "temperature": req.temperature, "top_p": req.top_p, "user": req.user,
        "anon_user_id": req.anon_user_id,
        "fallbacks": [f.model_dump() for f in req.fallbacks or []] or None,
        "reasoning": req.reasoning.model_dump() if req.reasoning else None,
    }
    if req.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in req.tools]
    if isinstance(req.tool_choice, NamedTool):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    fmt = req.text.format if req.text else None
    if fmt and fmt.type == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name, "schema": fmt.schema_ or {}}}
    elif fmt and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    params = req.service_parameters or req.venice_parameters
    if params is not None:
        body["service_parameters"] = params.model_dump(exclude_unset=True)
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None})
    except Exception as exc:  # a mapping the chat rules refuse: report it as ours
        raise ApiError(400, f"Invalid request: {exc}", code="INVALID_REQUEST") from exc


def _usage(plan: ChatPlan) -> dict[str, Any]:
    u = plan.usage
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _message_item(text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
            "name": call["function"]["name"], "arguments": call["function"]["arguments"],
            "status": "completed"}


def _response(plan: ChatPlan, model_id: str, output: list[dict[str, Any]], status: str,
              created: int) -> dict[str, Any]:
    return {"id": f"resp_{plan.request_id}", "object": "response", "created_at": created,
            "model": model_id, "status": status, "output": output, "error": None,
            "usage": _usage(plan) if status == "completed" else None}


async def respond(ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                  chat_service: ChatService) -> dict[str, Any]:
    """The response object of `req` (a chat request: `to_chat_request`)."""
    async def shape(plan: ChatPlan) -> dict[str, Any]:
        created = int(time.time())
        chat = await chat_service.run_unary(plan)
        message = chat["choices"][0]["message"]
        output = [_call_item(c) for c in message.get("tool_calls") or []]
        if message.get("content") is not None:
            output.append(_message_item(message["content"]))
        return _response(plan, chat["model"], output, "completed", created)

    return await chat_service.answer(ctx, key, req, shape)


def _event(kind: str, seq: int, **fields: Any) -> str:
    payload = {"type": kind, "sequence_number": seq, **fields}
    return f"event: {kind}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def stream_response(ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                          chat_service: ChatService) -> BilledEvents:
    """The response.* events of `req`, the model started before the answer is."""
    async def start(plan: ChatPlan) -> AsyncIterator[str | Mark]:
        routed, stream, first = await chat_service.start_model_stream(plan)
        return _events(plan, routed.model.id, chunks_with_first(first, stream))

    return await chat_service.stream(ctx, key, req, start)


async def background_stream(ctx: RequestContext, key: KeyRecord, req: ChatCompletionRequest,
                            chat_service: ChatService,
                            planned: Callable[[ChatPlan], None] | None = None,
                            starting: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
                            | None = None) -> BilledEvents:
    """The response.* events of `req` for a background response: admitted, held for and
    prepared now (what refuses it is this request's answer), the model started only when the
    events are first read, by the worker that drives them (serve_app/responses/), not by
    this request. Closing the events stops the model. `planned` is shown the plan once
    prepared (its engine request composed); `starting` runs the start of the model (it may
    try it again while the model refuses it for load: serve_app/responses/capacity_wait.py)."""
    async def start(plan: ChatPlan) -> AsyncIterator[str | Mark]:
        plan.answered_by = plan.candidates[0]  # the model asked for, until one answers
        if planned is not None:
            planned(plan)

        async def events() -> AsyncIterator[str | Mark]:
            def start_model() -> Awaitable[Any]:
                return chat_service.start_model_stream(plan)

            routed, stream, first = await (start_model() if starting is None
                                           else starting(start_model))
            try:
                async with aclosing(_events(plan, routed.model.id,
                                            chunks_with_first(first, stream))) as shaped:
                    async for event in shaped:
                        yield event
            finally:
                await aclose(stream)
        return events()

    return await chat_service.stream(ctx, key, req, start)


async def _events(plan: ChatPlan, model_id: str, chunks: AsyncIterator[TextEvent]
                  ) -> AsyncIterator[str | Mark]:
    created, seq = int(time.time()), -1  # numbered from 0, as the Responses API numbers them
    item = _message_item("", status="in_progress")
    text_part = {"type": "output_text", "text": "", "annotations": []}
    text_filter = plan.output_filter()
    buffered, shown = "", ""  # held back: it may be a tool call

    def next_seq() -> int:
        nonlocal seq
        seq += 1
        return seq

    def message_opened() -> Iterator[str]:
        yield _event("response.output_item.added", next_seq(), output_index=0,
                     item={**item, "content": []})  # its part comes next
        yield _event("response.content_part.added", next_seq(), item_id=item["id"],
                     output_index=0, content_index=0, part=text_part)

    def text_delta(text: str) -> str:
        return _event("response.output_text.delta", next_seq(), item_id=item["id"],
                      output_index=0, content_index=0, delta=text, logprobs=[])

    try:
        started = _response(plan, model_id, [], "in_progress", created)
        yield _event("response.created", next_seq(), response=started)
        yield _event("response.in_progress", next_seq(), response=started)
        async for chunk in chunks:
            if isinstance(chunk, Usage):
                plan.usage.record(chunk)
                continue
            assert isinstance(chunk, Chunk)  # an EngineError raised in stream_model
            if chunk.index != 0:
                continue
            plan.usage.saw(chunk)
            text = text_filter.feed(chunk.text)
            if plan.tool_mode == "auto":  # text before a possible call goes out now
                text, buffered = tool_calls.release(buffered + text)
            elif plan.tool_mode == "forced":
                buffered += text
                continue
            if text:
                if not shown:
                    for event in message_opened():
                        yield event
                shown += text
                yield text_delta(text)
        rest = buffered + text_filter.flush()
        calls = tool_calls.parse_calls(rest, plan.known_tools) if plan.tool_mode != "none" \
            else None
        output: list[dict[str, Any]] = []
        if shown or not calls:  # a message: the text streamed, or no call was made
            if not shown:  # no text streamed (an empty answer, or all of it held back)
                for event in message_opened():
                    yield event
            if rest and not calls:
                yield text_delta(rest)
                shown += rest
            final = _message_item(shown)
            final["id"] = item["id"]
            yield _event("response.output_text.done", next_seq(), item_id=item["id"],
                         output_index=0, content_index=0, text=shown, logprobs=[])
            yield _event("response.content_part.done", next_seq(), item_id=item["id"],
                         output_index=0, content_index=0, part=final["content"][0])
            yield _event("response.output_item.done", next_seq(), output_index=0, item=final)
            output.append(final)
        for index, call in enumerate(calls or (), start=len(output)):
            done = _call_item(call)
            yield _event("response.output_item.added", next_seq(), output_index=index,
                         item={**done, "status": "in_progress", "arguments": ""})
            # the arguments are parsed whole: they come in one delta
            yield _event("response.function_call_arguments.delta", next_seq(),
                         item_id=done["id"], output_index=index, delta=done["arguments"])
            yield _event("response.function_call_arguments.done", next_seq(),
                         item_id=done["id"], output_index=index, arguments=done["arguments"])
            yield _event("response.output_item.done", next_seq(), output_index=index, item=done)
            output.append(done)
        yield SETTLE  # durable before the stream says it is complete
        yield _event("response.completed", next_seq(),
                     response=_response(plan, model_id, output, "completed", created))
    except ApiError as exc:
        yield SETTLE  # what was delivered before the failure, nothing more
        yield _event("response.failed", next_seq(), response={
            **_response(plan, model_id, [], "failed", created),
            "error": stream_error_body(exc, "responses")})
