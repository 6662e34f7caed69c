"""Background responses: what the routes ask of them, on the parts that do the work.

`create` admits the request as a streamed one (limits, the hold, the fair-share tenant: the
caller's), writes the response's row (refused past the account's bound) with what would
continue it, and hands the billed events to a worker of this replica (drive.py). Readers on
any replica follow the log (follow.py). A replica that dies leaves a lease that runs out: the
sweep of any other continues the response where its events stop (takeover.py), or fails one
that cannot be continued (its hold is then released by the billing sweep: nothing is
charged), and deletes ended responses past their keeping time with their events
(sweep.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine

from serve_app.accounts.key_store import KeyRecord
from serve_app.chat.plan import ChatPlan
from serve_app.chat.response_objects import background_stream
from serve_app.chat.serving import ChatService
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.errors import ApiError
from serve_app.limits.limit_headers import limit_headers
from serve_app.models.calls import outliving_the_request
from serve_app.pipeline.bill import BilledEvents
from serve_app.pipeline.context import RequestContext
from serve_app.responses.capacity_wait import CapacityWait
from serve_app.responses.drive import Drive, Drives, abandon
from serve_app.responses.events import EventLog, RedisEventLog, TableEventLog
from serve_app.responses.follow import Followers, last_event_id
from serve_app.responses.progress import CHAT_STREAM, Progress
from serve_app.responses.store import ResponseStore, ResponseView
from serve_app.responses.sweep import SWEEP_INTERVAL_S, Sweep
from serve_app.responses.takeover import Takeover, kept_request
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.settings import Settings

__all__ = ["BackgroundResponses", "last_event_id"]  # the routes parse Last-Event-ID with it
T = TypeVar("T")


def not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response {response_id!r}: it is unknown, expired or deleted",
                    code="MEDIA_NOT_FOUND")


async def _as_is(work: Awaitable[T]) -> T:
    """A kept stream's first token is awaited whether its client stays or not."""
    return await work


class BackgroundResponses:
    def __init__(self, store: ResponseStore, events: EventLog, chat: ChatService, *,
                 kept_s: float, per_account: int, stored_bytes_per_account: int,
                 followers_per_account: int = 16, capacity_wait_s: float = 600.0) -> None:
        self.store, self.events, self.chat = store, events, chat
        # a generation refused for load before it started waits and tries again
        self.capacity_wait = CapacityWait(capacity_wait_s)
        self.kept = timedelta(seconds=kept_s)
        self.per_account, self.stored_bytes_per_account = per_account, stored_bytes_per_account
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.followers = Followers(store, events, followers_per_account=followers_per_account,
                                   origin=self.owner)
        self.drives = Drives(store, events, owner=self.owner, kept=self.kept,
                             notify=self.followers.notify, ended=self.followers.end)
        self.takeover = Takeover(store, events, self.drives, chat.router,
                                 chat.admission.billing)
        self.sweeper = Sweep(store, events, self.drives, self.takeover, kept=self.kept,
                             ended=self.followers.end)

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
                   followers_per_account=settings.responses_followers_per_account,
                   capacity_wait_s=settings.responses_capacity_wait_s)

    @property
    def followers_per_account(self) -> int:
        return self.followers.followers_per_account

    @followers_per_account.setter
    def followers_per_account(self, most: int) -> None:
        self.followers.followers_per_account = most

    @property
    def _followers(self) -> Counter[str]:
        return self.followers.counts

    @property
    def _drives(self) -> dict[str, Drive]:
        return self.drives.running

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
        with outliving_the_request():
            return await self._create(ctx, key, req)

    async def _create(self, ctx: RequestContext, key: KeyRecord,
                      req: ChatCompletionRequest) -> dict[str, Any]:
        plans: list[ChatPlan] = []
        source = await background_stream(ctx, key, req, self.chat, plans.append,
                                         self.capacity_wait.run)
        ctx.first_token_ms = None  # the model starts after the answer
        # Its own id: a request id may be the client's (X-Request-ID), reused at will.
        response_id = f"resp_{uuid.uuid4().hex}"
        model_id = self.chat.router.resolve(req.model, "text").model.id
        queued = {"id": response_id, "object": "response", "created_at": int(time.time()),
                  "model": model_id, "status": "queued", "background": True, "output": [],
                  "error": None, "usage": None}
        continuation, note_prompt = kept_request(plans[0])
        await self._keep(ctx, key, queued, source, continuation, note_prompt)
        return queued

    async def create_chat(self, ctx: RequestContext, key: KeyRecord,
                          req: ChatCompletionRequest) -> str:
        """A resumable chat completion stream (`stream_options.resumable`): admitted and
        started as any stream (an error before its first chunk is this request's answer),
        then kept and driven like a background response; its id (the chunks' `id`)."""
        self._refuse_if_full(*await self.store.usage(key.account_id))
        with outliving_the_request():
            source = await self.chat.completion_stream(ctx, key, req, _as_is)
            stream_id = f"chatcmpl-{uuid.uuid4().hex}"
            kept = {"id": stream_id, "object": CHAT_STREAM, "created": int(time.time()),
                    "model": req.model, "status": "in_progress"}
            await self._keep(ctx, key, kept, source)
        return stream_id

    async def _keep(self, ctx: RequestContext, key: KeyRecord, kept: dict[str, Any],
                    source: BilledEvents, continuation: str | None = None,
                    note_prompt: Callable[[], str | None] | None = None) -> None:
        """Write the row of `kept` (refused past the account's bound: the hold released),
        with what would continue it (`continuation`, takeover.py), and start driving
        `source` on a task of this replica."""
        response_id = kept["id"]
        encoded = json.dumps(kept, separators=(",", ":"))
        kept_bytes = len(continuation) if continuation is not None else 0
        now = utcnow()
        row = StoredResponse(id=response_id, account_id=key.account_id,
                             request_id=ctx.request_id, status=kept["status"],
                             response=encoded,
                             stored_bytes=len(encoded) + kept_bytes, lease_owner=self.owner,
                             lease_expires_at=now + self.store.lease,
                             expires_at=now + self.kept, continuation=continuation)
        try:
            await self.events.claim(response_id, self.owner)  # before its row: none unclaimed
            written = await self.store.add_within(row, self.per_account,
                                                  self.stored_bytes_per_account)
            if not written:  # the bound, reached meanwhile by a concurrent request
                self._refuse_if_full(self.per_account, self.stored_bytes_per_account)
        except BaseException as failure:
            await abandon(source, failure)
            raise
        self.drives.start(response_id, source, Progress(kept, kept_bytes=kept_bytes,
                                                        note_prompt=note_prompt))

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
        """The events after number `after`, each once, then live ones until the end
        (follow.py); a resumed stream past the account's bound is refused (429)."""
        return self.followers.follow(account_id, response_id, after, resumed=resumed)

    async def cancel(self, key: KeyRecord, response_id: str, *,
                     chat: bool = False) -> ResponseView:
        """Stop the generation (the model first), charge what it made and release the rest
        of the hold; the response as it then stands. An ended response stays as it is."""
        view = await self.own(key, response_id, chat=chat)
        if view.ended:
            return view
        await self.store.request_cancel(response_id)
        if not await self.drives.cancel(response_id):
            # driven by another replica, which reads the request as it renews its lease:
            # its next lease beat, or the sweep
            await self.followers.ended(
                response_id, self.store.lease.total_seconds() * 2 + SWEEP_INTERVAL_S)
        return await self.own(key, response_id, chat=chat)

    async def delete(self, key: KeyRecord, response_id: str, *, chat: bool = False) -> None:
        """Delete the response (`chat`: the resumable chat stream) and its events; one still
        running is cancelled first."""
        view = await self.own(key, response_id, chat=chat)
        if not view.ended:
            await self.cancel(key, response_id, chat=chat)
        await self.sweeper.forget(response_id)

    # -- upkeep

    async def sweep(self) -> None:
        await self.sweeper.sweep()

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """The sweep, and the wake-ups of this replica's readers by other replicas' writers
        (until cancelled)."""
        await asyncio.gather(self.sweeper.run(interval_s), self.followers.listen())

    async def stop(self) -> None:
        """Stop this replica's generations (each charges what it made) and close the log."""
        await self.drives.stop()
        await self.events.close()
