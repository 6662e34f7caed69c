"""Background responses: the worker that drives a generation detached from the request that
asked for it, and what the routes ask of it.

`create` admits the request as a streamed one (limits, the hold, the fair-share tenant: the
caller's), writes the response's row (refused past the account's bound) and hands the billed
events to a task of this replica, which owns them from then on: it numbers nothing itself
(the events come numbered, chat/response_objects.py) but appends each to the event log
before anyone may read it, renews its lease on the row, and settles the hold exactly once,
where a streamed answer does (`SETTLE`: what the engine made, whether anyone watched), or
when it is cut short (a cancel: the model is stopped first, then what it made is charged and
the rest of the hold released).

Readers on any replica follow the log (`follow`): the events after the one they name, then
live ones until the response has ended. A replica that dies leaves a lease that runs out: the
sweep of any other fails the response (its hold, taken by the dead replica's billing service,
is released by the billing sweep: nothing is charged), and deletes ended responses past their
keeping time with their events. A worker that lost its lease while alive finds its next append
refused (the sweep ended the log) or its renewal failing: it stops the engine and writes
nothing more; what the model made is charged only if its hold is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

from sqlalchemy import Engine

from serve_app.accounts.key_store import KeyRecord
from serve_app.chat.response_objects import background_stream
from serve_app.chat.serving import ChatService
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.errors import ApiError, stream_error_body
from serve_app.limits.limit_headers import limit_headers
from serve_app.pipeline.bill import SETTLE, BilledEvents
from serve_app.pipeline.context import RequestContext
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog
from serve_app.responses.store import ResponseStore, ResponseView
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.settings import Settings

logger = logging.getLogger("serve_app.responses")
T = TypeVar("T")

# How often a reader on another replica than the worker's looks for new events (the worker's
# own replica wakes its readers at once).
POLL_S = 0.25
SWEEP_INTERVAL_S = 10.0
INTERRUPTED = "The generation was interrupted: the Gateway replica that ran it stopped"
CHAT_STREAM = "chat.completion.stream"  # the kept object of a resumable chat stream
STOPPED = "The generation was stopped (the Gateway replica that ran it shut down)"


def not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response {response_id!r}: it is unknown, expired or deleted",
                    code="MEDIA_NOT_FOUND")


def sse(seq: int, data: str, *, chat: bool) -> str:
    """An event of the log as the stream sends it, its number as the SSE id (a response's
    events are named by their type too, as the Responses API streams them)."""
    if chat:
        return f"id: {seq}\ndata: {data}\n\n"
    return f"id: {seq}\nevent: {json.loads(data)['type']}\ndata: {data}\n\n"


def last_event_id(header: str | None) -> int:
    """SSE's `Last-Event-ID`: the number of the last event the client received (-1: none)."""
    if header is None or not header.strip():
        return -1
    try:
        seq = int(header)
    except ValueError:
        seq = -2
    if seq < -1:
        raise ApiError(400, "Last-Event-ID must be the number (the SSE id) of an event",
                       code="INVALID_REQUEST")
    return seq


async def _as_is(work: Awaitable[T]) -> T:
    """A kept stream's first token is awaited whether its client stays or not."""
    return await work


@dataclass(eq=False)
class _Progress:
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


class LeaseLost(Exception):
    """The response is no longer this worker's: the sweep of another replica failed it."""


@dataclass(eq=False)
class _Drive:
    task: asyncio.Task
    cancelled: bool = False  # by a cancel (not by a shutdown)
    lost: bool = False  # its lease (the sweep ended the response)


class BackgroundResponses:
    def __init__(self, store: ResponseStore, events: EventLog, chat: ChatService, *,
                 kept_s: float, per_account: int, stored_bytes_per_account: int,
                 followers_per_account: int = 16) -> None:
        self.store, self.events, self.chat = store, events, chat
        self.kept = timedelta(seconds=kept_s)
        self.per_account, self.stored_bytes_per_account = per_account, stored_bytes_per_account
        self.followers_per_account = followers_per_account
        self._followers: Counter[str] = Counter()  # streams followed per account, here
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._drives: dict[str, _Drive] = {}
        self._signals: dict[str, asyncio.Event] = {}
        self._endings: set[asyncio.Task] = set()

    @classmethod
    def from_settings(cls, settings: Settings, engine: Engine,
                      chat: ChatService) -> BackgroundResponses:
        """Events in Redis where `REDIS_URL` is set, else in the database."""
        events: EventLog = (RedisEventLog(settings.redis_url, prefix=settings.redis_prefix,
                                          kept_s=settings.responses_kept_s)
                            if settings.redis_url else TableEventLog(engine))
        return cls(ResponseStore(engine, lease=timedelta(seconds=settings.job_lease_s)),
                   events, chat, kept_s=settings.responses_kept_s,
                   per_account=settings.responses_per_account,
                   stored_bytes_per_account=settings.responses_stored_mb_per_account
                   * 1024 * 1024,
                   followers_per_account=settings.responses_followers_per_account)

    # -- creating

    def _refuse_if_full(self, kept: int, stored: int) -> None:
        if kept >= self.per_account or stored >= self.stored_bytes_per_account:
            raise ApiError(
                429, f"This account keeps too many background responses (at most "
                     f"{self.per_account}, {self.stored_bytes_per_account // (1024 * 1024)} MB "
                     "of objects and events): delete finished ones (DELETE /responses/{id}) "
                     "or wait for them to expire", code="RATE_LIMIT_EXCEEDED",
                headers=limit_headers(retry_after_s=1))

    async def create(self, ctx: RequestContext, key: KeyRecord,
                     req: ChatCompletionRequest) -> dict[str, Any]:
        """Admit `req` (a chat request of a `/responses` body), keep its response and start
        its generation on a task of this replica; the queued object."""
        self._refuse_if_full(*await self.store.usage(key.account_id))
        source = await background_stream(ctx, key, req, self.chat)
        ctx.first_token_ms = None  # the model starts after the answer
        # Its own id: a request id may be the client's (X-Request-ID), reused at will.
        response_id = f"resp_{uuid.uuid4().hex}"
        model_id = self.chat.router.resolve(req.model, "text").model.id
        queued = {"id": response_id, "object": "response", "created_at": int(time.time()),
                  "model": model_id, "status": "queued", "background": True, "output": [],
                  "error": None, "usage": None}
        await self._keep(ctx, key, queued, source)
        return queued

    async def create_chat(self, ctx: RequestContext, key: KeyRecord,
                          req: ChatCompletionRequest) -> str:
        """A resumable chat completion stream (`stream_options.resumable`): admitted and
        started as any stream (an error before its first chunk is this request's answer),
        then kept and driven like a background response; its id (the chunks' `id`)."""
        self._refuse_if_full(*await self.store.usage(key.account_id))
        source = await self.chat.completion_stream(ctx, key, req, _as_is)
        stream_id = f"chatcmpl-{uuid.uuid4().hex}"
        kept = {"id": stream_id, "object": CHAT_STREAM, "created": int(time.time()),
                "model": req.model, "status": "in_progress"}
        await self._keep(ctx, key, kept, source)
        return stream_id

    async def _keep(self, ctx: RequestContext, key: KeyRecord, kept: dict[str, Any],
                    source: BilledEvents) -> None:
        """Write the row of `kept` (refused past the account's bound: the hold released)
        and start driving `source` on a task of this replica."""
        response_id = kept["id"]
        encoded = json.dumps(kept, separators=(",", ":"))
        now = utcnow()
        row = StoredResponse(id=response_id, account_id=key.account_id,
                             request_id=ctx.request_id, status=kept["status"],
                             response=encoded,
                             stored_bytes=len(encoded), lease_owner=self.owner,
                             lease_expires_at=now + self.store.lease,
                             expires_at=now + self.kept)
        try:
            written = await self.store.add_within(row, self.per_account,
                                                  self.stored_bytes_per_account)
            if not written:  # the bound, reached meanwhile by a concurrent request
                self._refuse_if_full(self.per_account, self.stored_bytes_per_account)
        except BaseException as failure:
            await _abandon(source, failure)
            raise
        progress = _Progress(kept)
        task = asyncio.create_task(self._drive(response_id, source, progress),
                                   name=f"response-{response_id}")
        self._drives[response_id] = _Drive(task)
        task.add_done_callback(lambda done: self._unstarted(done, response_id, source, progress))

    def _unstarted(self, task: asyncio.Task, response_id: str, source: BilledEvents,
                   progress: _Progress) -> None:
        """A drive cancelled before its first step runs none of its code: it still ends
        (its hold released, its row written), on a task of its own."""
        if task.cancelled() and not progress.ending:
            ending = asyncio.create_task(self._finish(response_id, source, progress,
                                                      asyncio.CancelledError()))
            self._endings.add(ending)
            ending.add_done_callback(self._endings.discard)

    # -- driving

    def _notify(self, response_id: str) -> None:
        signal = self._signals.pop(response_id, None)
        if signal is not None:
            signal.set()

    async def _record(self, response_id: str, event: str, progress: _Progress) -> None:
        if progress.chat:
            await self._record_chunk(response_id, event, progress)
            return
        payload = json.loads(event.split("data: ", 1)[1])
        if "response" in payload:  # the object the events carry has the stored one's id
            payload["response"]["id"] = response_id
        data = _compact(payload)
        if not await self.events.append(response_id, int(payload["sequence_number"]), data):
            raise LeaseLost(response_id)
        progress.saw(payload, len(data))
        if payload["type"] == "response.created" and not await self.store.write(
                response_id, self.owner, status="in_progress", response=progress.response):
            raise LeaseLost(response_id)
        self._notify(response_id)

    async def _record_chunk(self, response_id: str, event: str, progress: _Progress) -> None:
        """A chat stream's event (a chunk, an error, `[DONE]`), numbered here."""
        data = event.split("data: ", 1)[1].rstrip("\n")
        if data != "[DONE]":
            payload = json.loads(data)
            if "id" in payload:  # the chunks carry the stream's id
                payload["id"] = response_id
            progress.failed = progress.failed or "error" in payload
            data = _compact(payload)
        seq = progress.seq + 1
        if not await self.events.append(response_id, seq, data):
            raise LeaseLost(response_id)
        progress.seq, progress.stored_bytes = seq, progress.stored_bytes + len(data)
        self._notify(response_id)

    async def _drive(self, response_id: str, source: BilledEvents, progress: _Progress) -> None:
        renewing = asyncio.create_task(self._renew(response_id, progress))
        failure: BaseException | None = None
        try:
            async for event in source.events:
                if event is SETTLE:
                    break
                assert isinstance(event, str)
                await self._record(response_id, event, progress)
        except BaseException as exc:  # a cancel, a shutdown, a failure of the model's
            failure = exc
        try:
            await asyncio.shield(self._finish(response_id, source, progress, failure))
        finally:
            renewing.cancel()

    async def _finish(self, response_id: str, source: BilledEvents, progress: _Progress,
                      failure: BaseException | None) -> None:
        progress.ending = True
        try:
            await self._end(response_id, source, progress, failure)
        except LeaseLost:  # ended by the sweep while this end was written: its end stands
            logger.warning("background response %s was ended by the sweep", response_id)
        except Exception:
            logger.exception("background response %s did not end cleanly", response_id)
        finally:
            self._drives.pop(response_id, None)
            self._notify(response_id)

    async def _end(self, response_id: str, source: BilledEvents, progress: _Progress,
                   failure: BaseException | None) -> None:
        """Settle once (the model stopped first when cut short), keep the last events, and
        write the response's end."""
        drive = self._drives.get(response_id)
        lost = isinstance(failure, LeaseLost) or (drive is not None and drive.lost)
        if lost:  # the sweep's verdict stands: what the model made is charged if still held
            source.billed.charge_only_if_held()
        try:
            if failure is not None:  # a source with a stop of its own is stopped by it
                await (source.stop() if source.stop is not None else _aclose(source.events))
        finally:
            await source.billed.close(failure)
        if lost:
            logger.warning("background response %s was ended by the sweep: its worker "
                           "stopped", response_id)
            return
        if failure is None:
            async for event in source.events:  # the last ones: response.completed (failed)
                assert isinstance(event, str)
                await self._record(response_id, event, progress)
            if progress.chat:
                status = "failed" if progress.failed else "completed"
            else:
                status = "completed" if progress.last_kind == "response.completed" \
                    else "failed"
            final = {**progress.response, "status": status}
        else:
            if drive is not None and drive.cancelled:
                final = progress.cut_short("cancelled")
            else:
                error = failure if isinstance(failure, ApiError) else ApiError(
                    500, STOPPED if isinstance(failure, asyncio.CancelledError)
                    else "Inference failed", code="INFERENCE_FAILED")
                if not isinstance(failure, (ApiError, asyncio.CancelledError)):
                    logger.error("background response %s failed", response_id,
                                 exc_info=failure)
                final = {**progress.cut_short("failed"),
                         "error": stream_error_body(error, "responses")}
                if progress.chat:  # the chat stream's error event, then its end
                    await self._record(response_id, "data: " + _compact(
                        stream_error_body(error, "chat")), progress)
                    await self._record(response_id, "data: [DONE]", progress)
                else:
                    failed = {"type": "response.failed", "sequence_number": progress.seq + 1,
                              "response": final}
                    await self._record(response_id, f"data: {_compact(failed)}\n\n",
                                       progress)
        size = progress.stored_bytes + len(_compact(final))
        await self.store.write(response_id, self.owner, status=final["status"],
                               response=final, stored_bytes=size, ended=True,
                               kept_for=self.kept)

    async def _renew(self, response_id: str, progress: _Progress) -> None:
        """Keep the lease while the generation runs, note its bytes, and stop it when a
        cancel was asked through another replica, or the lease was lost."""
        while True:
            await asyncio.sleep(self.store.lease.total_seconds() / 3)
            try:
                ours = await self.store.write(response_id, self.owner,
                                              stored_bytes=progress.stored_bytes)
                view = await self.store.get(response_id)
            except Exception:  # the database hiccupped: try again at the next beat
                logger.exception("renewing the lease of response %s failed", response_id)
                continue
            drive = self._drives.get(response_id)
            if drive is None:
                return
            if view is None or not ours or view.cancel_requested:
                if not ours:
                    logger.warning("response %s is no longer ours: stopping it", response_id)
                drive.cancelled = view is not None and view.cancel_requested
                drive.lost = not ours
                drive.task.cancel()
                return

    # -- reading and acting on one

    async def own(self, key: KeyRecord, response_id: str, *,
                  chat: bool = False) -> ResponseView:
        """The caller's response (`chat`: resumable chat stream); any other is unknown to
        them (404)."""
        view = await self.store.get(response_id)
        if view is None or view.account_id != key.account_id \
                or (view.response.get("object") == CHAT_STREAM) != chat:
            raise not_found(response_id)
        return view

    def follow(self, account_id: str, response_id: str, after: int, *,
               resumed: bool = True) -> AsyncIterator[str]:
        """The events after number `after` (`_follow`), counted among the streams the account
        follows on this replica; a resumed one past `followers_per_account` is refused (429).
        The stream of the request that started the response is counted, never refused."""
        if resumed and self._followers[account_id] >= self.followers_per_account:
            raise ApiError(
                429, f"This account already follows {self.followers_per_account} streams of "
                     "background responses at once: close one, or poll "
                     "GET /responses/{id} without stream", code="RATE_LIMIT_EXCEEDED",
                headers=limit_headers(retry_after_s=1))
        return self._counted(account_id, self._follow(response_id, after))

    async def _counted(self, account_id: str, events: AsyncIterator[str]) -> AsyncIterator[str]:
        """Counted from its first step (a stream the server never starts is never counted;
        requests racing for the last place may pass it by one each)."""
        self._followers[account_id] += 1
        try:
            async for event in events:
                yield event
        finally:
            self._followers[account_id] -= 1
            if self._followers[account_id] <= 0:
                del self._followers[account_id]

    async def _follow(self, response_id: str, after: int) -> AsyncIterator[str]:
        """The events after number `after`, each once, then live ones until the response
        has ended (its end is written after its last event)."""
        signal = asyncio.Event()
        try:
            while True:
                signal = self._signals.setdefault(response_id, asyncio.Event())
                view = await self.store.get(response_id)
                if view is None:  # deleted meanwhile
                    return
                for seq, data in await self.events.read(response_id, after):
                    if seq != after + 1:  # never skip one: the rest is read again
                        break
                    yield sse(seq, data, chat=view.response.get("object") == CHAT_STREAM)
                    after = seq
                if view.ended:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), POLL_S)
        finally:  # a reader's wake-up left behind would stay (no worker here to take it)
            if self._signals.get(response_id) is signal:
                del self._signals[response_id]

    async def cancel(self, key: KeyRecord, response_id: str) -> ResponseView:
        """Stop the generation (the model first), charge what it made and release the rest
        of the hold; the response as it then stands. An ended response stays as it is."""
        view = await self.own(key, response_id)
        if view.ended:
            return view
        await self.store.request_cancel(response_id)
        drive = self._drives.get(response_id)
        if drive is not None:  # driven here: stopped now
            drive.cancelled = True
            drive.task.cancel()
            await asyncio.wait([drive.task])
            if self._endings:  # it was cancelled before its first step: it ends aside
                await asyncio.wait(list(self._endings))
        else:  # driven by another replica, which reads the request as it renews its lease
            await self._ended(response_id)
        return await self.own(key, response_id)

    async def _ended(self, response_id: str) -> None:
        """Wait for the response to end: its worker's next lease beat, or the sweep."""
        beats = int((self.store.lease.total_seconds() * 2 + SWEEP_INTERVAL_S) / POLL_S) + 1
        for _ in range(beats):
            signal = self._signals.setdefault(response_id, asyncio.Event())
            view = await self.store.get(response_id)
            if view is None or view.ended:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signal.wait(), POLL_S)

    async def delete(self, key: KeyRecord, response_id: str) -> None:
        """Delete the response and its events (one still running is cancelled first)."""
        view = await self.own(key, response_id)
        if not view.ended:
            await self.cancel(key, response_id)
        await self._forget(response_id)

    async def _forget(self, response_id: str) -> None:
        await self.events.delete(response_id)
        await self.store.delete(response_id)
        self._notify(response_id)

    # -- upkeep

    async def sweep(self) -> None:
        """Fail the responses whose worker died (their lease ran out), and delete ended
        responses past their keeping time, with their events."""
        for view in await self.store.orphaned():
            if view.lease_owner == self.owner and view.id in self._drives:
                continue  # ours and alive: its renewal is late, not gone
            failed = {**view.response, "status": "failed", "error": {
                "code": "INFERENCE_FAILED", "message": INTERRUPTED}}
            if await self.store.fail_orphan(view, failed, self.kept):
                logger.warning("background response %s failed: its worker is gone", view.id)
                await self.events.end(view.id, partial(_failed_event, failed))
                self._notify(view.id)
        for response_id in await self.store.expired():
            await self._forget(response_id)

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                logger.exception("the background responses' sweep failed")
            await asyncio.sleep(interval_s)

    async def stop(self) -> None:
        """Stop this replica's generations (each charges what it made) and close the log."""
        drives = list(self._drives.values())
        for drive in drives:
            drive.task.cancel()
        if drives:
            await asyncio.wait([drive.task for drive in drives])
        if self._endings:
            await asyncio.wait(list(self._endings))
        await self.events.close()


def _compact(value: dict[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _failed_event(failed: dict[str, Any], seq: int) -> str:
    return _compact({"type": "response.failed", "sequence_number": seq, "response": failed})


async def _aclose(events: AsyncIterator[object]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


async def _abandon(source: BilledEvents, failure: BaseException) -> None:
    """A generation that will not run: its events closed (the model never started), its hold
    released."""
    try:
        await _aclose(source.events)
    finally:
        await source.billed.close(failure)
