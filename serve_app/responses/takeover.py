"""A background response whose worker died is continued by another replica.

When a response is created, what a worker needs to continue it is kept in its row (its
`Continuation`: the engine request as composed for it, files read and prompts added, the
model that runs it, and who pays), bounded in size and counted among the account's stored
bytes; a response that cannot be continued keeps none (tools or an output schema, images or
videos, several choices, log probabilities, a filtered output, web pages or audio charged
with it). Its worker adds the prompt's token count once the engine told it, before the first
text is kept.

The sweep of a live replica that finds such a response's lease run out claims the lease (one
conditional update: of replicas sweeping at once one wins) and the event log (the former
writer's appends are refused from then on), reads the events kept so far, and drives the rest
of the generation like any worker (drive.py): the engine is asked to continue the assistant
text kept so far (the conversation with that text as its last, unfinished, message: the chat
template's `continue_final_message`), and the events that follow are numbered after the last
one kept, in the same message item. A client resuming with `starting_after` on any replica
reads every event once, to `response.completed`.

Billing: the hold the dead replica took is still in the ledger (the hold sweeper leaves those
of open responses). The new worker settles it once (`Bill.resume`, as the job worker does):
the prompt once and every output token made, before the cut (the continuation's prompt less
the original prompt: the tokens of the text kept, as the engine counts them) and after,
within the request's `max_tokens`. A hold that is gone (released) fails the response: nothing
is charged without a hold. A response whose cancel was asked is not continued: the engine
only counts what was made (a one-token call), which is charged, and it ends cancelled.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from deployments.protocol import Chunk, Message, Sampling, Tenant, TextRequest, Usage
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import Cost, price, token_units
from serve_app.billing.service import Billing
from serve_app.chat.plan import ChatPlan
from serve_app.errors import ApiError, stream_error_body
from serve_app.models.calls import stream_model
from serve_app.models.router import ModelRouter
from serve_app.pipeline.admission import payer_of
from serve_app.pipeline.bill import SETTLE, Bill, BilledEvents, Mark, aclose
from serve_app.responses.drive import Drives
from serve_app.responses.events import EventLog
from serve_app.responses.progress import Progress, compact
from serve_app.responses.store import ResponseStore, ResponseView

# The most a kept request may take (its messages as the engine is sent them): a larger one is
# not continued should its replica die.
MAX_CONTINUATION_BYTES = 256 * 1024
INTERRUPTED = "The generation was interrupted: the Gateway replica that ran it stopped"
# The events after which the text is still being made (its message may go on).
_OPEN_TEXT = ("response.created", "response.in_progress", "response.output_item.added",
              "response.content_part.added", "response.output_text.delta")


@dataclasses.dataclass(frozen=True)
class Continuation:
    """What another replica needs to continue a response: the engine request, the model
    that runs it, who pays, and the prompt's tokens (None until the engine told them)."""

    model_id: str
    payer: Payer
    request: TextRequest
    prompt_tokens: int | None = None
    cached_tokens: int = 0

    def encode(self) -> str:
        request = self.request
        return compact({
            "model": self.model_id, "payer": dataclasses.asdict(self.payer),
            "request": {"request_id": request.request_id, "messages": request.messages,
                        "sampling": dataclasses.asdict(request.sampling),
                        "chat_template_kwargs": request.chat_template_kwargs,
                        "prompt_cache_key": request.prompt_cache_key,
                        "cache_salt": request.cache_salt,
                        "tenant": dataclasses.asdict(request.tenant)
                        if request.tenant is not None else None},
            "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens})

    @classmethod
    def decode(cls, text: str) -> Continuation:
        kept = json.loads(text)
        request = kept["request"]
        sampling = dict(request["sampling"])
        sampling["stop"] = tuple(sampling.get("stop") or ())
        sampling["stop_token_ids"] = tuple(sampling.get("stop_token_ids") or ())
        tenant = request.get("tenant")
        return cls(kept["model"], Payer(**kept["payer"]), TextRequest(
            request_id=request["request_id"], messages=request["messages"],
            sampling=Sampling(**sampling),
            chat_template_kwargs=request["chat_template_kwargs"],
            prompt_cache_key=request["prompt_cache_key"], cache_salt=request["cache_salt"],
            tenant=Tenant(**tenant) if tenant is not None else None),
            kept["prompt_tokens"], kept["cached_tokens"])


def continuation_of(plan: ChatPlan) -> Continuation | None:
    """What would continue the plan's generation, or None when it cannot be continued (its
    output is not plain text as the engine makes it, or something besides tokens is charged
    with it)."""
    request, key = plan.engine_request, plan.key
    if request is None or key is None or plan.answered_by is None:
        return None
    sampling = request.sampling
    if plan.tool_mode != "none" or request.json_schema is not None or request.tools \
            or request.images or request.videos or sampling.n != 1 or sampling.logprobs \
            or plan.params.strip_thinking_response or plan.params.disable_thinking \
            or plan.web_documents or plan.transcriber is not None or len(plan.candidates) > 1:
        return None
    kept = Continuation(plan.answered_by.model.id, payer_of(key), request)
    try:
        size = len(kept.encode())
    except (TypeError, ValueError):  # a message part JSON does not take: not kept
        return None
    return kept if size <= MAX_CONTINUATION_BYTES else None


class CancelRequested(Exception):
    """A response taken over after its cancel was asked: it ends cancelled."""


@dataclasses.dataclass(eq=False)
class Continuing:
    """The rest of one response's generation on this replica, and what it made in all."""

    kept: Continuation
    progress: Progress  # the events kept before the cut
    router: ModelRouter
    count_only: bool = False  # a cancel was asked: count what was made, generate nothing
    prompt: int | None = None  # the original prompt's tokens
    cached: int = 0
    before: int = 0  # output tokens made before the cut
    after: int = 0  # and since

    @property
    def _model(self) -> Any:
        return self.router.resolve(self.kept.model_id, "text").model

    def measure(self) -> tuple[Cost | None, int | None]:
        """What the response made in all (nothing known before the engine answered)."""
        if self.prompt is None:
            return None, None
        made = self.before + self.after
        limit = self.kept.request.sampling.max_tokens
        if limit is not None:
            made = min(made, limit)
        model = self._model
        return price(model, token_units(model, self.prompt, made, self.cached)), \
            self.prompt + made

    def noted(self) -> str | None:
        """The kept request with the prompt's tokens, once known (for a further takeover)."""
        if self.kept.prompt_tokens is not None or self.prompt is None:
            return None
        return dataclasses.replace(self.kept, prompt_tokens=self.prompt,
                                   cached_tokens=self.cached).encode()

    def _request(self) -> TextRequest:
        """The engine request that continues the text kept so far (the original one when
        none was kept)."""
        request = self.kept.request
        text = self.progress.text
        sampling = dataclasses.replace(request.sampling, max_tokens=1) if self.count_only \
            else request.sampling
        request_id = f"{request.request_id}-{uuid.uuid4().hex[:8]}"  # the first may still run
        if not text:
            return dataclasses.replace(request, request_id=request_id, sampling=sampling)
        messages: list[Message] = [*request.messages, {"role": "assistant", "content": text}]
        if not self.count_only:
            # The text kept is in the prompt now: its tokens and `max_tokens` on top of them
            # may overflow the context, which the engine refuses (the request fit it without
            # them). The engine fills the context's rest; `events` stops at `max_tokens`.
            sampling = dataclasses.replace(sampling, max_tokens=None)
        return dataclasses.replace(
            request, request_id=request_id, messages=messages, sampling=sampling,
            chat_template_kwargs={**request.chat_template_kwargs,
                                  "continue_final_message": True,
                                  "add_generation_prompt": False})

    def _started(self, chunk: Chunk) -> None:
        """The continuation's first chunk: its prompt tells what the text kept was made of."""
        assert chunk.prompt_tokens is not None
        if self.progress.text and self.kept.prompt_tokens is not None:
            self.prompt, self.cached = self.kept.prompt_tokens, self.kept.cached_tokens
            self.before = max(chunk.prompt_tokens - self.kept.prompt_tokens, 0)
        else:  # nothing kept: the continuation is the request itself
            self.prompt, self.cached = chunk.prompt_tokens, chunk.cached_tokens or 0

    async def events(self) -> AsyncIterator[str | Mark]:
        """The events after the last one kept, numbered on, in the message under way."""
        progress = self.progress  # recorded as the events go: what was kept, read first
        seq, done_before, response = progress.seq, list(progress.done_items), progress.response
        item = progress.item or {"type": "message", "id": f"msg_{uuid.uuid4().hex}",
                                 "status": "in_progress", "role": "assistant", "content": []}
        opened = progress.item is not None
        part_added = progress.last_kind not in ("response.output_item.added", None) \
            and opened
        shown, index = progress.text, len(done_before)
        limit = self.kept.request.sampling.max_tokens

        def event(kind: str, **fields: Any) -> str:
            nonlocal seq
            seq += 1
            payload = compact({"type": kind, "sequence_number": seq, **fields})
            return f"event: {kind}\ndata: {payload}\n\n"

        def opening() -> list[str]:
            nonlocal opened, part_added
            out = []
            if not opened:
                out.append(event("response.output_item.added", output_index=index,
                                 item={**item, "content": []}))
            if not part_added:
                out.append(event("response.content_part.added", item_id=item["id"],
                                 output_index=index, content_index=0,
                                 part={"type": "output_text", "text": "", "annotations": []}))
            opened = part_added = True
            return out

        if seq < 0:  # its worker died before its first event
            started = {**response, "status": "in_progress"}
            yield event("response.created", response=started)
            yield event("response.in_progress", response=started)
        try:
            model = self._model
            handle = self.router.text(model)
            stream = stream_model(handle.generate, model.id, model.id, self._request())
            try:
                async for chunk in stream:
                    if isinstance(chunk, Usage):
                        continue  # the running count is the one charged
                    if not isinstance(chunk, Chunk) or chunk.index != 0:
                        continue
                    if chunk.prompt_tokens is not None:
                        self._started(chunk)
                    if self.count_only:
                        raise CancelRequested(progress.response.get("id"))
                    self.after += chunk.tokens
                    if chunk.text:
                        for opened_event in opening():
                            yield opened_event
                        shown += chunk.text
                        yield event("response.output_text.delta", item_id=item["id"],
                                    output_index=index, content_index=0, delta=chunk.text,
                                    logprobs=[])
                    if limit is not None and self.before + self.after >= limit:
                        break
            finally:
                await aclose(stream)
            for opened_event in opening():
                yield opened_event
            final = {**item, "status": "completed",
                     "content": [{"type": "output_text", "text": shown, "annotations": []}]}
            yield event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=shown, logprobs=[])
            yield event("response.content_part.done", item_id=item["id"], output_index=index,
                        content_index=0, part=final["content"][0])
            yield event("response.output_item.done", output_index=index, item=final)
            yield SETTLE  # durable before the stream says it is complete
            yield event("response.completed", response={
                **response, "status": "completed", "output": [*done_before, final],
                "error": None, "usage": self._usage()})
        except ApiError as exc:
            yield SETTLE  # what was made before the failure, nothing more
            yield event("response.failed", response={
                **progress.cut_short("failed"), "error": stream_error_body(exc, "responses")})

    def _usage(self) -> dict[str, Any]:
        _, tokens = self.measure()
        prompt = self.prompt or 0
        output = (tokens or prompt) - prompt
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + output}


async def _interrupted() -> AsyncIterator[str | Mark]:
    raise ApiError(500, INTERRUPTED, code="INFERENCE_FAILED")
    yield SETTLE  # an async generator  # pragma: no cover


class Takeover:
    """Continues on this replica the responses whose worker died (the module's docstring)."""

    def __init__(self, store: ResponseStore, events: EventLog, drives: Drives,
                 router: ModelRouter, billing: Billing) -> None:
        self.store, self.events, self.drives = store, events, drives
        self.router, self.billing = router, billing

    async def take(self, view: ResponseView) -> bool:
        """Claim the orphaned response `view` and continue it here (or end it: cancelled
        when its cancel was asked, failed when its hold is gone or its events cannot be
        continued). False: it keeps no continuation (the sweep fails it)."""
        if view.continuation is None:
            return False
        owner = self.drives.owner
        if not await self.store.claim(view, owner):
            return True  # another replica's sweep took it (or it ended meanwhile)
        await self.events.claim(view.id, owner)
        kept = Continuation.decode(view.continuation)
        progress = Progress(view.response, kept_bytes=len(view.continuation))
        for _, data in await self.events.read(view.id, -1):  # all of them, now they stay
            progress.saw(json.loads(data), len(data))
        assert view.created_at is not None
        bill = Bill.resume(self.billing, view.request_id, kept.payer, view.created_at)
        bill.charge_only_if_held()  # never charged once released
        continuable = progress.last_kind in (None, *_OPEN_TEXT) and not progress.done_items \
            and (not progress.text or kept.prompt_tokens is not None)
        if not continuable or not await self.billing.is_held(view.request_id):
            self.drives.start(view.id, BilledEvents(bill, _interrupted()), progress)
            return True
        continuing = Continuing(kept, progress, self.router,
                                count_only=view.cancel_requested)
        bill.measure = continuing.measure
        if kept.prompt_tokens is None:  # kept for a further takeover once known
            progress.note_prompt = continuing.noted
        drive = self.drives.start(view.id, BilledEvents(bill, continuing.events()), progress)
        drive.cancelled = view.cancel_requested
        return True


def kept_request(plan: ChatPlan) -> tuple[str | None, Callable[[], str | None] | None]:
    """The continuation of a new response (None: it cannot be continued), and what gives it
    again with the prompt's tokens once the engine told them."""
    kept = continuation_of(plan)
    if kept is None:
        return None, None

    def noted() -> str | None:
        usage = plan.usage
        if not usage.prompt_tokens:
            return None
        return dataclasses.replace(kept, prompt_tokens=usage.prompt_tokens,
                                   cached_tokens=usage.cached_tokens).encode()
    return kept.encode(), noted
