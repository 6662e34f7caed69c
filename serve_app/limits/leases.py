"""Blocks of a bucket's requests that one replica holds (`LimiterCore.lease`), so that a busy
key's requests are admitted in the replica, without a round trip to the counting actor.

A bucket is leased only while it is busy here (`HOT_PER_SECOND` decisions a second or more),
and the actor grants at most a hundredth of each limit, only while half of each limit stays
free after it: a key near its limits, a key with a small limit, or one that sends a request
now and then, is decided by the actor one request at a time, exactly as without leases. A
lease lasts `LEASE_SECONDS` at most; what it did not use goes back to the bucket. The
requests a lease admits carry their own place in the count, so the rate-limit headers stay
exact for requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from serve_app.limits.core import MIN_LEASE, OK, Outcome
from serve_app.limits.policy import WINDOW_MS

LEASE_SECONDS = 0.5
HOT_PER_SECOND = 20
MAX_SLOTS = 256


@dataclass(slots=True)
class Lease:
    window_ms: int
    next_request: int  # the bucket's count once the next request of the lease is admitted
    last_request: int
    tokens_left: int
    tokens_counted: int  # the bucket's token count just after the grant
    expires: float  # monotonic seconds

    def usable(self, tokens: int, now_ms: int, now_s: float) -> bool:
        return (self.next_request <= self.last_request and tokens <= self.tokens_left
                and now_s < self.expires and now_ms < self.window_ms + WINDOW_MS)


@dataclass(slots=True)
class _Demand:
    second: int = 0
    count: int = 0
    last_second_count: int = 0
    largest_tokens: int = 0


class LeaseBook:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._demand: dict[str, _Demand] = {}
        self._asking: set[str] = set()

    def take(self, bucket: str, tokens: int, now_ms: int) -> Outcome | None:
        """Admit one request of `tokens` from this replica's lease; None: ask the actor."""
        self._count_demand(bucket, tokens)
        lease = self._leases.get(bucket)
        if lease is None or not lease.usable(tokens, now_ms, self._clock()):
            return None
        requests = lease.next_request
        lease.next_request += 1
        lease.tokens_left -= tokens
        return Outcome(code=OK, window_ms=lease.window_ms, requests=requests,
                       tokens=max(0, lease.tokens_counted - lease.tokens_left))

    def finish(self, bucket: str) -> tuple[int, int, int] | None:
        """Drop the bucket's lease if it can no longer serve; `(window, slots, tokens)` it did
        not use, to give back."""
        lease = self._leases.get(bucket)
        if lease is None:
            return None
        del self._leases[bucket]
        slots = lease.last_request - lease.next_request + 1
        if slots <= 0 and lease.tokens_left <= 0:
            return None
        return lease.window_ms, max(0, slots), max(0, lease.tokens_left)

    def absorb(self, bucket: str, window_ms: int, delta: int) -> bool:
        """Fold a correction of the bucket's token count in `window_ms` (measured minus
        estimated) into this replica's lease of that window, instead of sending it to the
        actor: the actor counted the lease's tokens whole, so the lease admitting `delta`
        fewer tokens (or giving them back at its end) corrects the count the same way. False:
        no live lease of that window (an expired one gives back only at this replica's next
        decision for the bucket, which may never come), or too little left in it for a
        positive `delta`."""
        lease = self._leases.get(bucket)
        if (lease is None or lease.window_ms != window_ms or delta > lease.tokens_left
                or self._clock() >= lease.expires):
            return False
        lease.tokens_left -= delta
        return True

    def wanted(self, bucket: str) -> tuple[int, int] | None:
        """(slots, tokens) to ask for along with this decision; None: the bucket is not busy
        enough here, or a request for it is on its way."""
        demand = self._demand.get(bucket)
        if demand is None or bucket in self._asking:
            return None
        rate = max(demand.count, demand.last_second_count)
        if rate < HOT_PER_SECOND:
            return None
        slots = min(MAX_SLOTS, max(MIN_LEASE, int(rate * LEASE_SECONDS)))
        self._asking.add(bucket)
        return slots, slots * max(1, demand.largest_tokens)

    def granted(self, bucket: str, reply: list[int] | None) -> None:
        """The actor's answer to a request for a lease (`LimiterCore.lease`)."""
        self._asking.discard(bucket)
        if not reply or int(reply[0]) <= 0:
            return
        slots, window_ms, requests, counted, tokens = (int(x) for x in reply)
        self._leases[bucket] = Lease(
            window_ms=window_ms, next_request=requests - slots + 1, last_request=requests,
            tokens_left=tokens, tokens_counted=counted, expires=self._clock() + LEASE_SECONDS)

    def _count_demand(self, bucket: str, tokens: int) -> None:
        second = int(self._clock())
        demand = self._demand.get(bucket)
        if demand is None:
            if len(self._demand) > 100_000:
                self._demand.clear()
            demand = self._demand[bucket] = _Demand(second)
        if demand.second != second:
            demand.last_second_count = demand.count if demand.second == second - 1 else 0
            demand.second, demand.count, demand.largest_tokens = second, 0, 0
        demand.count += 1
        demand.largest_tokens = max(demand.largest_tokens, tokens)
