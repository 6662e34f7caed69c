"""The upkeep every replica runs: a response whose worker died (its lease ran out) is taken
over (takeover.py), or failed when it cannot be continued, and ended responses past their
keeping time are deleted with their events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Any

from serve_app.responses.drive import Drives
from serve_app.responses.events import EventLog
from serve_app.responses.progress import compact
from serve_app.responses.store import ResponseStore
from serve_app.responses.takeover import INTERRUPTED, Takeover

logger = logging.getLogger("serve_app.responses")

SWEEP_INTERVAL_S = 10.0


class Sweep:
    def __init__(self, store: ResponseStore, events: EventLog, drives: Drives,
                 takeover: Takeover, *, kept: timedelta,
                 ended: Callable[[str], Awaitable[None]]) -> None:
        self.store, self.events, self.drives, self.takeover = store, events, drives, takeover
        self.kept, self.ended = kept, ended  # wakes the readers of an ended response

    async def sweep(self) -> None:
        """Continue the responses whose worker died (their lease ran out), or fail those
        that cannot be continued, and delete ended responses past their keeping time, with
        their events."""
        for view in await self.store.orphaned():
            if view.lease_owner == self.drives.owner and view.id in self.drives.running:
                continue  # ours and alive: its renewal is late, not gone
            try:
                if await self.takeover.take(view):
                    continue
            except Exception:  # the database or the log failed: failed as one not kept
                logger.exception("taking over background response %s failed", view.id)
            failed = {**view.response, "status": "failed", "error": {
                "code": "INFERENCE_FAILED", "message": INTERRUPTED}}
            if await self.store.fail_orphan(view, failed, self.kept):
                logger.warning("background response %s failed: its worker is gone", view.id)
                await self.events.end(view.id, partial(_failed_event, failed))
                await self.ended(view.id)
        for response_id in await self.store.expired():
            await self.forget(response_id)

    async def forget(self, response_id: str) -> None:
        """Delete the response and its events."""
        await self.events.delete(response_id)
        await self.store.delete(response_id)
        await self.ended(response_id)

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                logger.exception("the background responses' sweep failed")
            await asyncio.sleep(interval_s)


def _failed_event(failed: dict[str, Any], seq: int) -> str:
    return compact({"type": "response.failed", "sequence_number": seq, "response": failed})
