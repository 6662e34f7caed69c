"""A background response whose model refuses it for load waits and tries again.

A client that asked for a background response expects the platform to queue it: when the
model's replica refuses to start the generation for load (503 `MODEL_AT_CAPACITY`, the
fair-share gate's `max_queue_wait` or a full queue, with `Retry-After`) before anything was
produced, the response stays `queued` and its worker waits the refusal's `Retry-After`
(with a small jitter, so that refused responses do not all come back at once) and tries
again, until the model starts or the response's bound passes; then it fails with the last
refusal, as it would have at once. Only a refusal for load waits: any other error (a 400, a
failure of the engine, a model offline) is the response's answer at once. The worker keeps
its hold and renews its lease meanwhile (drive.py); a cancel ends the wait at once."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from serve_app.errors import ApiError, refused_for_capacity

logger = logging.getLogger("serve_app.responses")
T = TypeVar("T")

JITTER = 0.1  # of the Retry-After, added at random: at most a tenth more
DEFAULT_RETRY_AFTER_S = 1.0  # a refusal for load without Retry-After


class CapacityWait:
    """Tries a model call until it is not refused for load or `bound_s` has passed since the
    first try. `clock`, `sleep` and `jitter` (in [0, 1)) are injectable for tests."""

    def __init__(self, bound_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                 jitter: Callable[[], float] = random.random) -> None:
        self.bound_s, self.clock, self.sleep, self.jitter = bound_s, clock, sleep, jitter

    def pause(self, refused: ApiError) -> float:
        """The wait the refusal asks for, with its jitter."""
        try:
            asked = float(refused.headers.get("Retry-After", DEFAULT_RETRY_AFTER_S))
        except ValueError:  # an HTTP date: not sent by our refusals
            asked = DEFAULT_RETRY_AFTER_S
        return asked * (1 + JITTER * self.jitter())

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`'s result; its refusal for load once the bound has passed."""
        deadline = self.clock() + self.bound_s
        while True:
            try:
                return await attempt()
            except ApiError as refused:
                left = deadline - self.clock()
                if not refused_for_capacity(refused) or left <= 0:
                    raise
                wait = min(self.pause(refused), left)
                logger.info("background response refused for load (%s): trying again in "
                            "%.1f s", refused.message, wait)
                await self.sleep(wait)
