"""Per-account bounds on queued media work, so that one account cannot take the Gateway's
memory, its network or the result store for itself.

- `FetchSlots`: how many requests of one account may read media inputs (fetch a URL, decode a
  data URL, probe a clip) at once on this Gateway replica. Video jobs have no request rate
  limit (the spec); this bounds what a flood of quotes or queues can make the replica fetch.
- `JobCaps`: how many open (queued or running) jobs an account may have, and how many bytes
  its jobs may keep in the result store (inputs and finished media), checked when a job is
  queued and as each of its inputs is kept.
- `PendingIntakes`: this replica's jobs admitted and not yet written, per account, counted
  with the table's rows under a per-account lock, so that an account's concurrent requests
  cannot all pass a cap read before any of them was written. Across replicas, the job's row
  is written only if the caps still hold (table.py `add_within`).

Every refusal is a 429 `RATE_LIMIT_EXCEEDED` naming the cap.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from serve_app.errors import ApiError
from serve_app.limits.limit_headers import limit_headers

DEFAULT_FETCHES_PER_ACCOUNT = 2
DEFAULT_OPEN_JOBS_PER_ACCOUNT = 20
DEFAULT_STORED_MB_PER_ACCOUNT = 2048


def over_cap(message: str) -> ApiError:
    return ApiError(429, message, code="RATE_LIMIT_EXCEEDED",
                    headers=limit_headers(retry_after_s=1))


class FetchSlots:
    """At most `per_account` media reads of one account at a time in this replica."""

    def __init__(self, per_account: int = DEFAULT_FETCHES_PER_ACCOUNT) -> None:
        self.per_account = per_account
        self._busy: dict[str, int] = {}

    def busy(self, account_id: str) -> int:
        return self._busy.get(account_id, 0)

    @asynccontextmanager
    async def slot(self, account_id: str) -> AsyncIterator[None]:
        """One slot for the block, or a 429 when the account's are all taken (the caller is
        told to retry: a slot frees as soon as one of its fetches ends)."""
        busy = self.busy(account_id)
        if busy >= self.per_account:
            raise over_cap(f"Too many media inputs of this account are being fetched: at most "
                           f"{self.per_account} requests at a time read video or image inputs; "
                           "retry once one has been answered")
        self._busy[account_id] = busy + 1
        try:
            yield
        finally:
            left = self._busy[account_id] - 1
            if left:
                self._busy[account_id] = left
            else:
                del self._busy[account_id]


@dataclass(frozen=True, slots=True)
class JobCaps:
    """Per-account caps on open jobs and on the bytes their files keep in the result store."""

    open_jobs: int = DEFAULT_OPEN_JOBS_PER_ACCOUNT
    stored_bytes: int = DEFAULT_STORED_MB_PER_ACCOUNT * 1024 * 1024

    def check_open(self, open_jobs: int) -> None:
        if open_jobs >= self.open_jobs:
            raise over_cap(f"This account has {open_jobs} jobs queued or running; at most "
                           f"{self.open_jobs} at a time: retrieve or wait for one to finish "
                           "before queueing another")

    def check_stored(self, stored: int, adding: int = 0) -> None:
        if stored + adding > self.stored_bytes or (not adding and stored >= self.stored_bytes):
            raise over_cap(f"This account's jobs keep {_mb(stored)} in the result store"
                           + (f" and this job's inputs would add {_mb(adding)}" if adding else "")
                           + f"; at most {_mb(self.stored_bytes)}: delete finished media "
                           "(`/video/complete`, `/audio/complete`) or wait for it to expire")


class PendingIntakes:
    """Per account, the jobs this replica has admitted and not yet written, and the input
    bytes they keep meanwhile; `lock(account)` serializes an account's check-and-reserve
    (admit, keep) and its reserve-to-row move (the write)."""

    def __init__(self) -> None:
        # a lock lives while someone holds or waits for it: idle accounts cost nothing
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = \
            weakref.WeakValueDictionary()
        self._jobs: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    def lock(self, account_id: str) -> asyncio.Lock:
        lock = self._locks.get(account_id)
        if lock is None:
            lock = self._locks[account_id] = asyncio.Lock()
        return lock

    def jobs(self, account_id: str) -> int:
        return self._jobs.get(account_id, 0)

    def bytes(self, account_id: str) -> int:
        return self._bytes.get(account_id, 0)

    def add(self, account_id: str, jobs: int = 0, kept: int = 0) -> None:
        """Reserve (positive) or give back (negative) jobs and kept bytes."""
        for counts, change in ((self._jobs, jobs), (self._bytes, kept)):
            left = counts.get(account_id, 0) + change
            if left > 0:
                counts[account_id] = left
            else:
                counts.pop(account_id, None)


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MB"
