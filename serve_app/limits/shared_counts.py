"""The rate-limit headers of a route without a model read a key's shared counts; this replica
keeps that read a short while and shares it.

One read in flight per key, shared by the key's concurrent answers, kept PEEK_FRESH_S; a
decision about the key on this replica drops it (`forget`), so the next answer reads again and
a client sees its own requests counted. A read that fails or takes too long is not kept. A read
of the Ray limiter actor costs the replica about a millisecond of CPU: a client polling
`GET /api_keys/rate_limits` now costs one a second, not one a poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from serve_app.limits.backends import LimiterBackend
from serve_app.limits.policy import WINDOW_MS

PEEK_FRESH_S = 1.0
MAX_KEYS_KEPT = 100_000


class SharedCountsRead:
    def __init__(self, backend: LimiterBackend,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.monotonic = monotonic
        # key id -> (monotonic time read, the read of its buckets' counts)
        self._reads: dict[str, tuple[float, asyncio.Future[list[int]]]] = {}

    async def counts(self, key_id: str, buckets: list[str], now: int,
                     timeout_s: float | None) -> list[int]:
        """The buckets' counts (`[window start, requests, tokens]` each) from the shared
        count, or from this replica's read of them while it is fresh (read less than
        PEEK_FRESH_S ago, nothing decided here about the key since, every window read still
        running). `timeout_s`: the longest a read may take (TimeoutError)."""
        found = self._reads.get(key_id)
        if found is not None and self.monotonic() - found[0] < PEEK_FRESH_S:
            read = found[1]
            if read.done() and not read.cancelled() and read.exception() is None:
                if _windows_running(read.result(), now):
                    return read.result()
            elif not read.done():
                async with asyncio.timeout(timeout_s):
                    return await asyncio.shield(read)  # the read in flight, shared
        if len(self._reads) > MAX_KEYS_KEPT:
            self._reads.clear()
        read = asyncio.ensure_future(self.backend.peek(buckets, now))
        self._reads[key_id] = (self.monotonic(), read)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(read)
        except BaseException:
            if self._reads.get(key_id, (0.0, None))[1] is read:
                del self._reads[key_id]  # a read that failed or took too long is not kept
            raise

    def forget(self, key_id: str) -> None:
        """Drop this replica's read of the key's counts: a decision here changed them."""
        self._reads.pop(key_id, None)


def _windows_running(counts: list[int], now: int) -> bool:
    """Whether every window of a read of counts is still running at `now`: a window that
    ended reads as empty now."""
    starts = [start for start in counts[::3] if start]
    return not starts or now < min(starts) + WINDOW_MS
