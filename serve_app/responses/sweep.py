"""The upkeep every replica runs: a response whose worker died (its lease ran out) is failed,
and ended responses past their keeping time are deleted with their events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from serve_app.responses.drive import Drives
from serve_app.responses.events import EventLog
from serve_app.responses.progress import compact
from serve_app.responses.store import ResponseStore

logger = logging.getLogger("serve_app.responses")

SWEEP_INTERVAL_S = 10.0
INTERRUPTED = "The generation was interrupted: the Gateway replica that ran it stopped"


class Sweep:
    def __init__(self, store: ResponseStore, events: EventLog, drives: Drives, *,
                 kept: timedelta, notify: Callable[[str], None]) -> None:
        self.store, self.events, self.drives = store, events, drives
        self.kept, self.notify = kept, notify

    async def sweep(self) -> None:
        """Fail the responses whose worker died (their lease ran out), and delete ended
        responses past their keeping time, with their events."""
        for view in await self.store.orphaned():
            if view.lease_owner == self.drives.owner and view.id in self.drives.running:
                continue  # ours and alive: its renewal is late, not gone
            failed = {**view.response, "status": "failed", "error": {
                "code": "INFERENCE_FAILED", "message": INTERRUPTED}}
            if await self.store.fail_orphan(view, failed, self.kept):
                logger.warning("background response %s failed: its worker is gone", view.id)
                await self.events.end(view.id, partial(_failed_event, failed))
                self.notify(view.id)
        for response_id in await self.store.expired():
            await self.forget(response_id)

    async def forget(self, response_id: str) -> None:
        """Delete the response and its events."""
        await self.events.delete(response_id)
        await self.store.delete(response_id)
        self.notify(response_id)

    async def run(self, interval_s: float = SWEEP_INTERVAL_S) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:
                logger.exception("the background responses' sweep failed")
            await asyncio.sleep(interval_s)


def _failed_event(failed: dict[str, Any], seq: int) -> str:
    return compact({"type": "response.failed", "sequence_number": seq, "response": failed})
