"""The pause between a background loop's rounds ends on its wake-up or its timeout, and a
cancellation always ends the loop: even one that arrives as the wake-up is set (a job ending
while the service stops), which `asyncio.wait_for` swallows on Python 3.11."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.jobs.wake import until_woken


def test_a_cancellation_that_arrives_with_the_wake_up_still_cancels() -> None:
    async def scenario() -> None:
        wake = asyncio.Event()
        pause = asyncio.create_task(until_woken(wake, 3600))
        await asyncio.sleep(0)  # waiting on the event
        wake.set()
        pause.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pause

    asyncio.run(scenario())


def test_the_pause_ends_on_its_wake_up_or_its_timeout() -> None:
    async def scenario() -> None:
        wake = asyncio.Event()
        waiting = asyncio.create_task(until_woken(wake, 3600))
        await asyncio.sleep(0)
        wake.set()
        await waiting  # woken, long before the hour
        assert waiting.done() and not waiting.cancelled()
        timed_out = asyncio.create_task(until_woken(asyncio.Event(), 0))
        await timed_out  # nothing wakes it: its timeout ends it, without an error
        assert timed_out.exception() is None

    asyncio.run(scenario())
