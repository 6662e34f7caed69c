"""Reading a response's events as they come, on any replica: the events after the one a
client names, each once, then live ones until the response has ended. The worker of this
replica wakes its readers at once (`notify`); a reader of another replica's response polls.
The streams one account follows here at once are bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator

from serve_app.errors import ApiError
from serve_app.limits.limit_headers import limit_headers
from serve_app.responses.events import EventLog
from serve_app.responses.progress import CHAT_STREAM
from serve_app.responses.store import ResponseStore

# How often a reader on another replica than the worker's looks for new events (the worker's
# own replica wakes its readers at once).
POLL_S = 0.25


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


class Followers:
    """The readers of this replica: what wakes them, and how many each account has."""

    def __init__(self, store: ResponseStore, events: EventLog, *,
                 followers_per_account: int) -> None:
        self.store, self.events = store, events
        self.followers_per_account = followers_per_account
        self.counts: Counter[str] = Counter()  # streams followed per account, here
        self._signals: dict[str, asyncio.Event] = {}

    def notify(self, response_id: str) -> None:
        """New events or an end of the response: its readers here look now."""
        signal = self._signals.pop(response_id, None)
        if signal is not None:
            signal.set()

    def follow(self, account_id: str, response_id: str, after: int, *,
               resumed: bool = True) -> AsyncIterator[str]:
        """The events after number `after` (`_follow`), counted among the streams the account
        follows on this replica; a resumed one past `followers_per_account` is refused (429).
        The stream of the request that started the response is counted, never refused."""
        if resumed and self.counts[account_id] >= self.followers_per_account:
            raise ApiError(
                429, f"This account already follows {self.followers_per_account} streams of "
                     "background responses at once: close one, or poll "
                     "GET /responses/{id} without stream", code="RATE_LIMIT_EXCEEDED",
                headers=limit_headers(retry_after_s=1))
        return self._counted(account_id, self._follow(response_id, after))

    async def _counted(self, account_id: str, events: AsyncIterator[str]) -> AsyncIterator[str]:
        """Counted from its first step (a stream the server never starts is never counted;
        requests racing for the last place may pass it by one each)."""
        self.counts[account_id] += 1
        try:
            async for event in events:
                yield event
        finally:
            self.counts[account_id] -= 1
            if self.counts[account_id] <= 0:
                del self.counts[account_id]

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

    async def ended(self, response_id: str, within_s: float) -> None:
        """Wait up to `within_s` for the response to end (or be deleted)."""
        for _ in range(int(within_s / POLL_S) + 1):
            signal = self._signals.setdefault(response_id, asyncio.Event())
            view = await self.store.get(response_id)
            if view is None or view.ended:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signal.wait(), POLL_S)
