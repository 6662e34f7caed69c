"""The rounds of a background loop (the job worker, webhook deliveries) and the pause between
them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

logger = logging.getLogger("serve_app.jobs")


async def until_woken(wake: asyncio.Event, seconds: float) -> None:
    """Return when `wake` is set or after `seconds`, whichever is first; a cancellation always
    propagates. (`asyncio.wait_for` on Python 3.11 swallows a cancellation that arrives as the
    event is set: a loop stopped just as a job ended would never end.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()


async def run_rounds(work: Callable[[], Awaitable[None]], sweep: Callable[[], Awaitable[object]],
                     *, wake: asyncio.Event, poll_interval_s: float, sweep_interval_s: float,
                     name: str) -> None:
    """Forever: `sweep` when `sweep_interval_s` passed since the last one, then `work`; a round
    that fails is logged and the next one runs; between rounds, wait for `wake` or
    `poll_interval_s`."""
    last_sweep = 0.0
    while True:
        try:
            if time.monotonic() - last_sweep > sweep_interval_s:
                last_sweep = time.monotonic()
                await sweep()
            await work()
        except Exception:
            logger.exception("the %s round failed", name)
        wake.clear()
        await until_woken(wake, poll_interval_s)
