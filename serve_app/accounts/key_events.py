"""Key change notices, so that a revoked or edited key stops working on every replica at once.

The replica that changes a key publishes its hash to `KeyEventHub`, a one-replica Serve
deployment. Every ingress replica long-polls the hub and drops the named keys from its cache;
its next poll acknowledges the change. `publish` returns once every live subscriber has
acknowledged (or after `ACK_TIMEOUT_S`, when a subscriber is gone), so the admin call that
revokes a key answers only after no replica will accept it any more.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ray import serve

logger = logging.getLogger("serve_app.key_events")

POLL_TIMEOUT_S = 10.0
ACK_TIMEOUT_S = 3.0
# A subscriber that has not polled for this long is taken to be gone.
SUBSCRIBER_EXPIRY_S = POLL_TIMEOUT_S * 3

Invalidate = Callable[[Iterable[str] | None], None]


class KeyEvents(Protocol):
    async def publish(self, key_hashes: list[str]) -> None: ...

    async def run(self, invalidate: Invalidate) -> None: ...


class LocalKeyEvents:
    """One process, one cache: publishing invalidates directly (unit tests, plain uvicorn)."""

    def __init__(self) -> None:
        self._invalidate: Invalidate | None = None

    async def publish(self, key_hashes: list[str]) -> None:
        if self._invalidate is not None:
            self._invalidate(key_hashes)

    async def run(self, invalidate: Invalidate) -> None:
        self._invalidate = invalidate
        await asyncio.Event().wait()


@serve.deployment(
    num_replicas=1,
    max_ongoing_requests=10_000,
    ray_actor_options={"num_cpus": 0},
)
class KeyEventHub:
    def __init__(self) -> None:
        self._version = 0
        self._log: deque[tuple[int, list[str]]] = deque(maxlen=10_000)
        self._changed = asyncio.Condition()
        self._acked: dict[str, tuple[int, float]] = {}  # subscriber -> (version, seen at)

    async def publish(self, key_hashes: list[str]) -> int:
        async with self._changed:
            self._version += 1
            version = self._version
            self._log.append((version, list(key_hashes)))
            self._changed.notify_all()
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._all_acked(version)), ACK_TIMEOUT_S)
            except TimeoutError:
                logger.warning("key change %d not acknowledged by every replica in %.1fs",
                               version, ACK_TIMEOUT_S)
        return version

    def _all_acked(self, version: int) -> bool:
        now = time.monotonic()
        return all(acked >= version for acked, seen in self._acked.values()
                   if now - seen < SUBSCRIBER_EXPIRY_S)

    async def poll(self, subscriber: str, since: int) -> tuple[int, list[str] | None]:
        """Wait for changes after `since`. None in place of hashes means: drop every key
        (first poll, a restarted hub, or a subscriber too far behind the log)."""
        async with self._changed:
            self._acked[subscriber] = (since, time.monotonic())
            self._changed.notify_all()
            if since < 0 or since > self._version:
                return self._version, None
            if since == self._version:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self._version > since), POLL_TIMEOUT_S)
                except TimeoutError:
                    return self._version, []
            if self._log and self._log[0][0] > since + 1:
                return self._version, None
            hashes = [h for v, batch in self._log if v > since for h in batch]
            return self._version, hashes


class ServeKeyEvents:
    """The ingress side of `KeyEventHub`, through a deployment handle."""

    def __init__(self, hub: Any) -> None:
        self._hub = hub
        self._subscriber = uuid.uuid4().hex

    async def publish(self, key_hashes: list[str]) -> None:
        await self._hub.publish.remote(key_hashes)

    async def run(self, invalidate: Invalidate) -> None:
        since = -1
        while True:
            try:
                version, hashes = await self._hub.poll.remote(self._subscriber, since)
            except Exception:
                logger.exception("key event poll failed; dropping cached keys")
                invalidate(None)
                since = -1
                await asyncio.sleep(1.0)
                continue
            invalidate(hashes)
            since = version
