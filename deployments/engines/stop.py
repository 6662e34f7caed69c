"""Stopping an engine whose client left: the replica's call is cancelled (Serve cancels it when
the Gateway's request is), a `StopSignal` is set, and the engine, which checks it between its
units of work (Whisper segments, diffusion steps, pictures), stops with `Stopped`. The turn at
the engine is held until its thread has returned, so the next request never starts beside a
thread still computing for nobody."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The engine stopped before the end: its request was cancelled."""


class StopSignal:
    """Set from the event loop; checked by the engine's thread between units of work."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raises Stopped once the signal is set."""
        if self._event.is_set():
            raise Stopped


def check(stop: StopSignal | None) -> None:
    """`stop.check()` when there is a signal (engines also run without one: jobs, tests)."""
    if stop is not None:
        stop.check()


async def until_stopped(work: Callable[[StopSignal], T]) -> T:
    """`work(signal)` in a worker thread. Should the awaiting task be cancelled, the signal is
    set and the cancellation waits for the thread to return (it stops at its next check)
    before it goes on: whatever holds the engine (a fair-share turn, a lock) is held until
    the engine is free."""
    signal = StopSignal()
    worker = asyncio.ensure_future(asyncio.to_thread(work, signal))
    try:
        return await asyncio.shield(worker)
    except asyncio.CancelledError:
        signal.set()
        while not worker.done():
            try:
                await asyncio.shield(worker)
            except asyncio.CancelledError:  # cancelled again: keep waiting for the thread
                continue
            except BaseException:  # Stopped, or whatever the engine raised on the way out
                break
        raise
