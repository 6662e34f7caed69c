"""The Redis backend: the rules of core.py as Lua scripts; the decisions of a replica that
wait together go in one pipelined round trip.

Keys carry the owner in a hash tag (`{owner}`), so a request's bucket and budgets sit in one
Redis Cluster slot. When Redis cannot be reached, decisions fall back to this replica's own
count (logged) and Redis is tried again a second later: the service keeps answering through a
Redis restart, and the shared count resumes when Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from serve_app.limits.backends import Call, DecisionBatcher, LocalLimiter
from serve_app.limits.core import Outcome
from serve_app.limits.policy import BUDGET_WINDOW_MS, WINDOW_MS
from serve_app.metrics import metrics

logger = logging.getLogger("serve_app.limits")

RETRY_AFTER_S = 1.0
MAX_CONNECTIONS = 32

# KEYS[1] bucket hash, KEYS[2..] budget sorted sets.
# ARGV: now, rpm, tpm, tokens, window, budget window, then one limit per budget.
DECIDE = """
local now = tonumber(ARGV[1])
local rpm, tpm, tokens = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local window, bwin = tonumber(ARGV[5]), tonumber(ARGV[6])
for i = 2, #KEYS do
  local limit = tonumber(ARGV[5 + i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - bwin)
  local count = redis.call('ZCARD', KEYS[i])
  if count > limit then
    local at = redis.call('ZRANGE', KEYS[i], count - limit - 1, count - limit - 1, 'WITHSCORES')
    return {0, i - 1, limit, count, tonumber(at[2]) + bwin}
  end
end
local b = redis.call('HMGET', KEYS[1], 's', 'r', 't')
local start, req, used = tonumber(b[1]), tonumber(b[2]) or 0, tonumber(b[3]) or 0
if (not start) or now >= start + window then start, req, used = now, 0, 0 end
if rpm > 0 and req + 1 > rpm then return {1, -1, start, req, used} end
if tpm > 0 and used > 0 and used + tokens > tpm then return {1, -2, start, req, used} end
req, used = req + 1, used + tokens
redis.call('HSET', KEYS[1], 's', start, 'r', req, 't', used)
redis.call('PEXPIRE', KEYS[1], math.max(1, start + window - now))
return {1, 0, start, req, used}
"""

# KEYS[1] bucket hash; ARGV: window start, delta.
ADJUST = """
local s = redis.call('HGET', KEYS[1], 's')
if s and tonumber(s) == tonumber(ARGV[1]) then
  local t = redis.call('HINCRBY', KEYS[1], 't', ARGV[2])
  if t < 0 then redis.call('HSET', KEYS[1], 't', 0) end
end
return 1
"""

# KEYS[1] budget sorted set; ARGV: now, budget window, unique member.
RECORD = """
local now, bwin = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - bwin)
redis.call('PEXPIRE', KEYS[1], bwin)
return redis.call('ZCARD', KEYS[1])
"""


# KEYS: bucket hashes (one owner: one slot); ARGV: now, window. Reads only.
PEEK = """
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local b = redis.call('HMGET', KEYS[i], 's', 'r', 't')
  local start = tonumber(b[1])
  if (not start) or now >= start + window then
    table.insert(out, 0)
    table.insert(out, 0)
    table.insert(out, 0)
  else
    table.insert(out, start)
    table.insert(out, tonumber(b[2]) or 0)
    table.insert(out, tonumber(b[3]) or 0)
  end
end
return out
"""


def _tagged(prefix: str, key: str) -> str:
    owner, _, rest = key.partition("|")
    return f"{prefix}:{{{owner}}}|{rest}"


class RedisLimiter:
    name = "redis"

    def __init__(self, url: str, prefix: str = "rl") -> None:
        # A bounded pool that waits for a free connection: a burst of requests queues for
        # Redis instead of opening a connection each.
        # A pooled connection broken by a Redis restart is retried once on a new one.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=2.0, socket_timeout=0.5,
            socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError, RedisTimeoutError])
        self._redis = aioredis.Redis(connection_pool=pool)
        self._prefix = prefix
        self._decide = self._redis.register_script(DECIDE)
        self._adjust = self._redis.register_script(ADJUST)
        self._record = self._redis.register_script(RECORD)
        self._peek = self._redis.register_script(PEEK)
        self._fallback = LocalLimiter()
        self._down_until = 0.0
        self._batcher = DecisionBatcher(self._send)
        self._pending: set[asyncio.Task] = set()  # corrections on their way

    def _available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _went_down(self, exc: Exception) -> None:
        metrics().limiter_fallbacks.inc(tags={"backend": "redis"})
        if self._available():
            logger.warning("Redis unreachable (%s): counting in this replica for now", exc)
        self._down_until = time.monotonic() + RETRY_AFTER_S

    async def decide(self, bucket: str, rpm: int, tpm: int, tokens: int,
                     budgets: list[tuple[str, int]], now_ms: int) -> Outcome:
        return await self._batcher.decide((bucket, rpm, tpm, tokens, budgets, now_ms))

    def _script_input(self, call: Call) -> tuple[list[str], list[int]]:
        bucket, rpm, tpm, tokens, budgets, now_ms = call
        keys = [_tagged(self._prefix, bucket)] + [_tagged(self._prefix, k) for k, _ in budgets]
        args = [now_ms, rpm, tpm, tokens, WINDOW_MS, BUDGET_WINDOW_MS,
                *[limit for _, limit in budgets]]
        return keys, args

    async def _send(self, calls: list[Call]) -> list[list[int]]:
        """The decisions waiting together, pipelined: one round trip for all of them."""
        if self._available():
            try:
                if len(calls) == 1:
                    keys, args = self._script_input(calls[0])
                    return [[int(x) for x in await self._decide(keys=keys, args=args)]]
                async with self._redis.pipeline(transaction=False) as pipe:
                    for call in calls:
                        keys, args = self._script_input(call)
                        await self._decide(keys=keys, args=args, client=pipe)
                    return [[int(x) for x in r] for r in await pipe.execute()]
            except (RedisError, OSError) as exc:
                self._went_down(exc)
        return [(await self._fallback.decide(*call)).to_wire() for call in calls]

    async def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
        if self._available():
            try:
                await self._adjust(keys=[_tagged(self._prefix, bucket)], args=[window_ms, delta])
                return
            except (RedisError, OSError) as exc:
                self._went_down(exc)
        await self._fallback.adjust(bucket, window_ms, delta)

    def adjust_soon(self, bucket: str, window_ms: int, delta: int) -> None:
        task = asyncio.get_running_loop().create_task(self.adjust(bucket, window_ms, delta))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def record(self, key: str, now_ms: int, member: str) -> int:
        if self._available():
            try:
                return int(await self._record(keys=[_tagged(self._prefix, key)],
                                              args=[now_ms, BUDGET_WINDOW_MS, member]))
            except (RedisError, OSError) as exc:
                self._went_down(exc)
        return await self._fallback.record(key, now_ms, member)

    async def peek(self, buckets: list[str], now_ms: int) -> list[int]:
        if self._available():
            try:
                keys = [_tagged(self._prefix, bucket) for bucket in buckets]
                return [int(x) for x in await self._peek(keys=keys, args=[now_ms, WINDOW_MS])]
            except (RedisError, OSError) as exc:
                self._went_down(exc)
        return await self._fallback.peek(buckets, now_ms)

    async def close(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()
