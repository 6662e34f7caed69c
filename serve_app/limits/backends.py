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
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from serve_app.limits.core import LimiterCore, Outcome
from serve_app.limits.policy import BUDGET_WINDOW_MS, WINDOW_MS

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

    async def record(self, key: str, now_ms: int, member: str) -> int: ...

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

    async def record(self, key: str, now_ms: int, member: str) -> int:
        return self.core.record(key, now_ms, BUDGET_WINDOW_MS)

    async def close(self) -> None:
        return None


def _actor_class() -> Any:
    import ray  # imported here: the gateway runs without Ray in unit tests

    @ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=1)
    class RateLimiterActor:
        """The cluster's one count. Calls run one at a time, so each batch is atomic."""

        def __init__(self) -> None:
            self.core = LimiterCore()
            self.calls = 0

        def decide_many(self, calls: list[tuple]) -> list[list[int]]:
            self.calls += 1
            if self.calls % 10_000 == 0:
                self.core.expire(calls[-1][-1], WINDOW_MS, BUDGET_WINDOW_MS)
            return [self.core.decide(bucket, rpm, tpm, tokens, WINDOW_MS, BUDGET_WINDOW_MS,
                                     budgets, now).to_wire()
                    for bucket, rpm, tpm, tokens, budgets, now in calls]

        def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
            self.core.adjust(bucket, window_ms, delta)

        def record(self, key: str, now_ms: int) -> int:
            return self.core.record(key, now_ms, BUDGET_WINDOW_MS)

    return RateLimiterActor


Call = tuple[str, int, int, int, list[tuple[str, int]], int]


class DecisionBatcher:
    """Sends the decisions that arrive while the previous batch is in flight as one batch:
    one round trip each at low load, many decisions per round trip under load."""

    def __init__(self, send: Callable[[list[Call]], Awaitable[list[list[int]]]]) -> None:
        self._send = send
        self._pending: list[tuple[Call, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None

    async def decide(self, call: Call) -> Outcome:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self._pending.append((call, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush())
        return Outcome.from_wire(await future)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    results = await self._send([call for call, _ in batch])
                except Exception as exc:  # the sender's own fallback failed too
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flusher = None


class RayLimiter:
    name = "ray"

    def __init__(self) -> None:
        self._actor: Any = None
        self._batcher = DecisionBatcher(self._send)
        # While the actor cannot be reached (it is restarting), count in this replica.
        self._fallback = LocalLimiter()

    def _get_actor(self) -> Any:
        if self._actor is None:
            self._actor = _actor_class().options(
                name=ACTOR_NAME, namespace=ACTOR_NAMESPACE, get_if_exists=True,
                lifetime="detached").remote()
        return self._actor

    async def decide(self, bucket: str, rpm: int, tpm: int, tokens: int,
                     budgets: list[tuple[str, int]], now_ms: int) -> Outcome:
        return await self._batcher.decide((bucket, rpm, tpm, tokens, budgets, now_ms))

    async def _send(self, calls: list[Call]) -> list[list[int]]:
        try:
            return await asyncio.wait_for(self._get_actor().decide_many.remote(calls),
                                          ACTOR_TIMEOUT_S)
        except Exception as exc:  # the actor is down, restarting or out of reach
            logger.warning("rate-limit actor unreachable (%s): counting in this replica for "
                           "now", exc)
            self._actor = None
            return [(await self._fallback.decide(*call)).to_wire() for call in calls]

    async def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
        await self._get_actor().adjust.remote(bucket, window_ms, delta)

    async def record(self, key: str, now_ms: int, member: str) -> int:
        return await self._get_actor().record.remote(key, now_ms)

    async def close(self) -> None:
        return None
