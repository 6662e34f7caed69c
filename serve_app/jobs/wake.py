"""The pause of a background loop between its rounds."""

from __future__ import annotations

import asyncio
import contextlib


async def until_woken(wake: asyncio.Event, seconds: float) -> None:
    """Return when `wake` is set or after `seconds`, whichever is first; a cancellation always
    propagates. (`asyncio.wait_for` on Python 3.11 swallows a cancellation that arrives as the
    event is set: a loop stopped just as a job ended would never end.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await wake.wait()
