"""Where the counts live, behind one interface:

* `LocalLimiter`: in this process (unit tests, a single replica without Ray).
* `RayLimiter`: one named Ray actor for the whole cluster, the embedded default; the
  decisions waiting together go in one actor call.
* `RedisLimiter` (redis_backend.py): a Lua script on a Redis server; the decisions waiting
  together go in one pipelined round trip. Several Serve applications or clusters share one
  count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from serve_app.limits.core import LimiterCore, Outcome
from serve_app.limits.leases import LeaseBook
from serve_app.limits.policy import BUDGET_WINDOW_MS, WINDOW_MS
from serve_app.metrics import metrics

logger = logging.getLogger("serve_app.limits")

ACTOR_NAME = "rate-limiter"
ACTOR_NAMESPACE = "inference-platform"
# A decision that takes longer is made in the replica instead (the actor is out of reach).
ACTOR_TIMEOUT_S = 2.0


class LimiterBackend(Protocol):
    name: str

    async def decide(self, bucket: str, rpm: int, tpm: int, tokens: int,
                     budgets: list[tuple[str, int]], now_ms: int) -> Outcome: ...

    async def adjust(self, bucket: str, window_ms: int, delta: int) -> None: ...

    def adjust_soon(self, bucket: str, window_ms: int, delta: int) -> None:
        """Send a correction at once, without waiting for it to be applied."""

    async def record(self, key: str, now_ms: int, member: str) -> int: ...

    async def peek(self, buckets: list[str], now_ms: int) -> list[int]:
        """`LimiterCore.peek` on the shared count: reads, never counts nor writes."""

    async def close(self) -> None: ...


class LocalLimiter:
    name = "local"

    def __init__(self) -> None:
        self.core = LimiterCore()

    async def decide(self, bucket: str, rpm: int, tpm: int, tokens: int,
                     budgets: list[tuple[str, int]], now_ms: int) -> Outcome:
        return self.core.decide(bucket, rpm, tpm, tokens, WINDOW_MS, BUDGET_WINDOW_MS, budgets,
                                now_ms)

    async def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
        self.core.adjust(bucket, window_ms, delta)

    def adjust_soon(self, bucket: str, window_ms: int, delta: int) -> None:
        self.core.adjust(bucket, window_ms, delta)

    async def record(self, key: str, now_ms: int, member: str) -> int:
        return self.core.record(key, now_ms, BUDGET_WINDOW_MS)

    async def peek(self, buckets: list[str], now_ms: int) -> list[int]:
        return self.core.peek(buckets, now_ms, WINDOW_MS)

    async def close(self) -> None:
        return None


def run_calls(core: LimiterCore, calls: list[tuple]) -> list[list[int] | None]:
    """What the actor does with one replica's call: decisions, token corrections and the
    leases' operations, in the order they were sent."""
    out: list[list[int] | None] = []
    for call in calls:
        kind = call[0]
        if kind == ADJUST:
            core.adjust(*call[1:])
            out.append(None)
        elif kind == GIVE_BACK:
            core.give_back(*call[1:])
            out.append(None)
        elif kind == PEEK:
            _, buckets, now = call
            out.append(core.peek(buckets, now, WINDOW_MS))
        elif kind == LEASE:
            _, bucket, slots, tokens, rpm, tpm, budgets, now = call
            out.append(core.lease(bucket, slots, tokens, rpm, tpm, WINDOW_MS, budgets, now,
                                  BUDGET_WINDOW_MS))
        else:
            bucket, rpm, tpm, tokens, budgets, now = call
            out.append(core.decide(bucket, rpm, tpm, tokens, WINDOW_MS, BUDGET_WINDOW_MS,
                                   budgets, now).to_wire())
    return out


def _actor_class() -> Any:
    import ray  # imported here: the gateway runs without Ray in unit tests

    @ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1)
    class RateLimiterActor:
        """The cluster's one count. Calls run one at a time, so each batch is atomic."""

        def __init__(self) -> None:
            self.core = LimiterCore()
            self.calls = 0

        def decide_many(self, calls: list[tuple]) -> list[list[int] | None]:
            self.calls += 1
            if self.calls % 10_000 == 0:
                self.core.expire(int(time.time() * 1000), WINDOW_MS, BUDGET_WINDOW_MS)
            return run_calls(self.core, calls)

        def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
            self.core.adjust(bucket, window_ms, delta)

        def record(self, key: str, now_ms: int) -> int:
            return self.core.record(key, now_ms, BUDGET_WINDOW_MS)

    return RateLimiterActor


Call = tuple[str, int, int, int, list[tuple[str, int]], int]
# Operations travelling with the decisions to the actor: a token correction
# (ADJUST, bucket, window_ms, delta); a lease request (LEASE, bucket, slots, tokens, rpm, tpm,
# budgets, now_ms); what a lease did not use (GIVE_BACK, bucket, window_ms, slots, tokens);
# a read of counts (PEEK, buckets, now_ms).
ADJUST, LEASE, GIVE_BACK, PEEK = "adjust", "lease", "give_back", "peek"


class DecisionBatcher:
    """Sends the decisions that arrive while the previous batch is in flight as one batch:
    one round trip each at low load, many decisions per round trip under load."""

    def __init__(self, send: Callable[[list[Call]], Awaitable[list[list[int]]]]) -> None:
        self._send = send
        self._pending: list[tuple[tuple, asyncio.Future | None]] = []
        self._flusher: asyncio.Task | None = None

    async def decide(self, call: Call) -> Outcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._queue(call, future)
        return Outcome.from_wire(await future)

    def send_later(self, op: tuple) -> None:
        """Queue an operation whose answer nobody waits for, in order with the decisions."""
        self._queue(op, None)

    def ask(self, op: tuple) -> asyncio.Future:
        """Queue an operation; its answer arrives in the returned future."""
        future = asyncio.get_running_loop().create_future()
        self._queue(op, future)
        return future

    def _queue(self, op: tuple, future: asyncio.Future | None) -> None:
        self._pending.append((op, future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._send([call for call, _ in batch])
                except Exception as exc:  # the sender's own fallback failed too
                    for _, future in batch:
                        if future is not None and not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if future is not None and not future.done():
                        future.set_result(result)
        finally:
            self._flusher = None


class RayLimiter:
    name = "ray"

    def __init__(self) -> None:
        self._actor: Any = None
        self._actor_lock = asyncio.Lock()
        self._batcher = DecisionBatcher(self._send)
        # While the actor cannot be reached (it is restarting), count in this replica.
        self._fallback = LocalLimiter()
        self.leases = LeaseBook()

    async def _get_actor(self) -> Any:
        """The shared actor, found or created by name. The lookup is a blocking round trip to
        Ray's control store (slow while the actor restarts): it runs on a thread, once."""
        if self._actor is None:
            async with self._actor_lock:
                if self._actor is None:
                    self._actor = await asyncio.to_thread(
                        lambda: _actor_class().options(
                            name=ACTOR_NAME, namespace=ACTOR_NAMESPACE, get_if_exists=True,
                            lifetime="detached").remote())
        return self._actor

    async def decide(self, bucket: str, rpm: int, tpm: int, tokens: int,
                     budgets: list[tuple[str, int]], now_ms: int) -> Outcome:
        leased = self.leases.take(bucket, tokens, now_ms)
        if leased is not None:
            return leased
        unused = self.leases.finish(bucket)
        if unused is not None:
            self._batcher.send_later((GIVE_BACK, bucket, *unused))
        wanted = self.leases.wanted(bucket)
        if wanted is not None:
            slots, lease_tokens = wanted
            reply = self._batcher.ask((LEASE, bucket, slots, lease_tokens, rpm, tpm, budgets,
                                       now_ms))
            reply.add_done_callback(lambda f: self.leases.granted(
                bucket, None if f.cancelled() or f.exception() else f.result()))
        return await self._batcher.decide((bucket, rpm, tpm, tokens, budgets, now_ms))

    async def _send(self, calls: list[tuple]) -> list[list[int] | None]:
        # Lease requests go after everything else of the call: the decisions that waited with
        # them are counted first, and a lease never takes what they needed.
        order = sorted(range(len(calls)), key=lambda i: calls[i][0] == LEASE)
        results = await self._send_in_order([calls[i] for i in order])
        out: list[list[int] | None] = [None] * len(calls)
        for position, index in enumerate(order):
            out[index] = results[position]
        return out

    async def _send_in_order(self, calls: list[tuple]) -> list[list[int] | None]:
        try:
            actor = await asyncio.wait_for(self._get_actor(), ACTOR_TIMEOUT_S)
            return await asyncio.wait_for(actor.decide_many.remote(calls), ACTOR_TIMEOUT_S)
        except Exception as exc:  # the actor is down, restarting or out of reach
            logger.warning("rate-limit actor unreachable (%s): counting in this replica for "
                           "now", exc)
            metrics().limiter_fallbacks.inc(tags={"backend": "ray"})
            self._actor = None
            # The actor's own rules on this replica's count; no leases while counting here.
            return [None if call[0] in (LEASE, GIVE_BACK)
                    else run_calls(self._fallback.core, [call])[0] for call in calls]

    async def peek(self, buckets: list[str], now_ms: int) -> list[int]:
        # With the decisions waiting beside it, in one actor call.
        return await self._batcher.ask((PEEK, buckets, now_ms))

    async def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
        await (await self._get_actor()).adjust.remote(bucket, window_ms, delta)

    def adjust_soon(self, bucket: str, window_ms: int, delta: int) -> None:
        # Into the bucket's lease when this replica holds one (no actor call at all);
        # otherwise with the decisions, in one actor call: an actor call costs the replica
        # about a millisecond of CPU, and this replica's next decision still comes after it.
        if not self.leases.absorb(bucket, window_ms, delta):
            self._batcher.send_later((ADJUST, bucket, window_ms, delta))

    async def record(self, key: str, now_ms: int, member: str) -> int:
        return await (await self._get_actor()).record.remote(key, now_ms)

    async def close(self) -> None:
        return None
