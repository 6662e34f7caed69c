"""Calls of concurrent requests to one deployment method, merged into fewer handle calls.

Each handle call costs the ingress about a millisecond of CPU however small it is. The first
request goes out at once (nothing waits for company); requests that arrive while a call runs
go together in the next call. At concurrency 1 nothing changes; under load one call carries
many requests, and the model replica receives whole batches instead of assembling them.

A call that would run beside others waits until it carries `min_items_beside` items (or until
the others end). So under load the calls alternate in halves: the replica encodes one while
the ingress answers the other's requests and gathers their next ones, instead of idling while
a single call's requests go round. Without that floor, the second call would leave with the
first few requests to come back and the replica would encode small, costly batches.

Room is kept for others: a request whose owner (its account) has nothing in a call or waiting
goes out at once in a call of its own when every call is taken, so one account's stream of
large requests never holds another's first one back here (the model replica then serves the
texts of each call fairly: deployments/fair_batches.py).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

Send = Callable[[list[Any]], Awaitable[Sequence[Any]]]


class _Waiting(Generic[Item]):
    __slots__ = ("future", "items", "owner")

    def __init__(self, items: list[Item], future: asyncio.Future, owner: Hashable) -> None:
        self.items, self.future, self.owner = items, future, owner


class CallBatcher(Generic[Item, Result]):
    """`await submit(items)` returns `send(all items of the call)`'s results for `items`."""

    def __init__(self, send: Send, *, max_in_flight: int = 2, max_items: int = 64,
                 min_items_beside: int = 1) -> None:
        self._send = send
        self._max_in_flight = max_in_flight
        self._max_items = max_items
        self._min_items_beside = min(min_items_beside, max_items)
        self._waiting: list[_Waiting[Item]] = []
        self._in_flight = 0
        self._express_in_flight = 0
        # owner -> its requests in a call or waiting
        self._busy: collections.Counter[Hashable] = collections.Counter()

    async def submit(self, items: list[Item], owner: Hashable = None) -> list[Result]:
        """`owner`: whose request it is (None: nobody's in particular, never sent ahead)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        waiting = _Waiting(items, future, owner)
        if owner is not None:
            self._busy[owner] += 1
            future.add_done_callback(lambda _: self._done_with(owner))
        if (owner is not None and self._busy[owner] == 1 and not self._express_in_flight
                and self._in_flight >= self._max_in_flight):
            self._express_in_flight += 1
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._call([waiting], express=True))
        else:
            self._waiting.append(waiting)
            self._start_calls()
        return await future

    def _done_with(self, owner: Hashable) -> None:
        self._busy[owner] -= 1
        if self._busy[owner] <= 0:
            del self._busy[owner]

    def _start_calls(self) -> None:
        while self._waiting and self._in_flight < self._max_in_flight:
            if self._in_flight and self._waiting_items() < self._min_items_beside:
                return
            batch, count = [], 0
            while self._waiting:
                if self._waiting[0].future.done():  # its caller left: nothing to send for it
                    self._waiting.pop(0)
                    continue
                if batch and count + len(self._waiting[0].items) > self._max_items:
                    break
                waiting = self._waiting.pop(0)
                batch.append(waiting)
                count += len(waiting.items)
            if not batch:
                return
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._call(batch))

    def _waiting_items(self) -> int:
        return sum(len(w.items) for w in self._waiting if not w.future.done())

    async def _call(self, batch: list[_Waiting[Item]], *, express: bool = False) -> None:
        try:
            results = await self._send([item for w in batch for item in w.items])
        except BaseException as exc:  # every caller of the call gets the failure
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            start = 0
            for waiting in batch:
                end = start + len(waiting.items)
                if not waiting.future.done():
                    waiting.future.set_result(list(results[start:end]))
                start = end
        finally:
            self._in_flight -= 1
            if express:
                self._express_in_flight -= 1
            self._start_calls()
