"""Reading a response's events as they come, on any replica: the events after the one a
client names, each once, then live ones until the response has ended. The streams one
account follows here at once are bounded.

A reader waits to be woken: by the worker of its own replica at once (`notify` for new
events, `end` once the response's row is written ended, or it was deleted), and with Redis
by the other replicas' appends and ends, which the event log announces and each replica
hears on one subscription (`listen`, events.py). On a wake-up it reads the events after its
last; the response's row only when an end was announced, once it read the last event, or
when nothing woke it for `FALLBACK_S` (the writer is in another process with no Redis
between them, or an announcement was lost): the row is not read per event."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from serve_app.errors import ApiError
from serve_app.limits.limit_headers import limit_headers
from serve_app.responses.events import EventLog
from serve_app.responses.progress import CHAT_STREAM
from serve_app.responses.store import ResponseStore

logger = logging.getLogger("serve_app.responses")

# How long a reader waits for a wake-up before it reads the row and the events again: the
# delay of a reader in another process than the writer's with no Redis between them.
FALLBACK_S = 1.0
# Once it read the last event, how often it reads the row until the end written after it.
ENDING_S = 0.25
# The last event of a response (a chat stream's is `[DONE]`).
_LAST = ("response.completed", "response.failed", "response.incomplete")


def sse(seq: int, data: str, *, chat: bool) -> tuple[str, bool]:
    """An event of the log as the stream sends it, its number as the SSE id (a response's
    events are named by their type too, as the Responses API streams them), and whether it
    is the last one."""
    if chat:
        return f"id: {seq}\ndata: {data}\n\n", data == "[DONE]"
    kind = json.loads(data)["type"]
    return f"id: {seq}\nevent: {kind}\ndata: {data}\n\n", kind in _LAST


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


@dataclass(eq=False)
class _Reader:
    """One waiting reader of a response: woken by each append, told of an end."""

    woken: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False  # an end was announced since it last read the row


async def _woken(reader: _Reader, within_s: float) -> bool:
    """Wait up to `within_s` for a wake-up (False: none came)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            await reader.woken.wait()
        return True
    return False


class Followers:
    """The readers of this replica (`origin`: the name its writers append under): what wakes
    them, and how many each account has."""

    def __init__(self, store: ResponseStore, events: EventLog, *,
                 followers_per_account: int, origin: str = "") -> None:
        self.store, self.events, self.origin = store, events, origin
        self.followers_per_account = followers_per_account
        self.counts: Counter[str] = Counter()  # streams followed per account, here
        self._readers: dict[str, set[_Reader]] = {}

    def notify(self, response_id: str) -> None:
        """New events: its readers here read them now."""
        self._wake(response_id, False)

    async def end(self, response_id: str) -> None:
        """The response ended or was deleted here (its row written): its readers here read
        the row now, those of other replicas once the announcement reaches them."""
        self._wake(response_id, True)
        try:
            await self.events.announce_end(response_id, self.origin)
        except Exception:  # their next look finds the end
            logger.warning("announcing the end of response %s failed", response_id,
                           exc_info=True)

    async def listen(self) -> None:
        """Wake the readers here of what other replicas append or end (until cancelled)."""
        await self.events.listen(self.origin, self._wake)

    def _wake(self, response_id: str, ended: bool) -> None:
        for reader in self._readers.get(response_id, ()):
            reader.ended = reader.ended or ended
            reader.woken.set()

    @contextlib.contextmanager
    def _reading(self, response_id: str) -> Iterator[_Reader]:
        """A reader of the response, woken while it is within."""
        reader = _Reader()
        readers = self._readers.setdefault(response_id, set())
        readers.add(reader)
        try:
            yield reader
        finally:
            readers.discard(reader)
            if not readers and self._readers.get(response_id) is readers:
                del self._readers[response_id]

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
        has ended. Its end is written after its last event: the events read after a row
        that says it ended are all of them."""
        with self._reading(response_id) as reader:
            read_row, ended, chat, last = True, False, False, False
            while True:
                reader.woken.clear()  # a wake-up from here on is seen
                if read_row:
                    reader.ended = False
                    view = await self.store.get(response_id)
                    if view is None:  # deleted meanwhile
                        return
                    ended, chat = view.ended, view.response.get("object") == CHAT_STREAM
                for seq, data in await self.events.read(response_id, after):
                    if seq != after + 1:  # never skip one: the rest is read again
                        break
                    event, is_last = sse(seq, data, chat=chat)
                    last = last or is_last
                    yield event
                    after = seq
                if ended:
                    return
                woken = await _woken(reader, ENDING_S if last else FALLBACK_S)
                read_row = reader.ended or not woken or last

    async def ended(self, response_id: str, within_s: float) -> None:
        """Wait up to `within_s` for the response to end (or be deleted)."""
        deadline = asyncio.get_running_loop().time() + within_s
        with self._reading(response_id) as reader:
            while True:
                reader.woken.clear()
                reader.ended = False
                view = await self.store.get(response_id)
                left = deadline - asyncio.get_running_loop().time()
                if view is None or view.ended or left <= 0:
                    return
                with contextlib.suppress(TimeoutError):  # an end, not its events, or a look
                    async with asyncio.timeout(min(FALLBACK_S, left)):
                        while not reader.ended:
                            reader.woken.clear()
                            await reader.woken.wait()
