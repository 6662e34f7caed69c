"""The counting rules, in plain Python: the Ray actor runs them as they are, and the Redis
backend runs the same rules as Lua scripts (redis_backend.py); tests hold the two to the same
answers.

* A bucket (owner, class) counts requests and tokens in a one-minute window that starts with
  its first request: it refills in full when the window ends. A refused request takes nothing.
* An error budget counts events (failed or unsupported-feature requests) in the last 30 s; more
  than its threshold refuses the next requests until enough events age out.
* A lease moves a block of a bucket's requests (and tokens), at most a hundredth of each limit,
  to one replica, which admits from it without asking; it is granted only while half of each
  limit stays free after it, so near a limit every request is decided here, one by one
  (limits.backends.RayLimiter).

Times are integer milliseconds, passed in by the caller (its clock can be controlled).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

OK, OVER_REQUESTS, OVER_TOKENS = 0, -1, -2
MIN_LEASE = 4  # fewer requests are not worth a lease: limits under 400 a minute get none


@dataclass(frozen=True, slots=True)
class BudgetCheck:
    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """A decision. `budget` > 0: the budget at that (1-based) position of the request's budget
    checks is exhausted, with `limit`, `count` and `resets_ms`; otherwise `code` (OK, or which
    per-minute limit refused) with the bucket's `window_ms`, `requests` and `tokens`."""

    budget: int = 0
    code: int = OK
    window_ms: int = 0
    requests: int = 0
    tokens: int = 0
    limit: int = 0
    count: int = 0
    resets_ms: int = 0

    def to_wire(self) -> list[int]:
        """The five integers the Lua script returns for the same decision."""
        if self.budget:
            return [0, self.budget, self.limit, self.count, self.resets_ms]
        return [1, self.code, self.window_ms, self.requests, self.tokens]

    @classmethod
    def from_wire(cls, raw: list[int]) -> Outcome:
        kind, code, a, b, c = (int(x) for x in raw)
        if kind == 0:
            return cls(budget=code, limit=a, count=b, resets_ms=c)
        return cls(code=code, window_ms=a, requests=b, tokens=c)


class LimiterCore:
    def __init__(self) -> None:
        self._buckets: dict[str, list[int]] = {}  # key -> [window start, requests, tokens]
        self._events: dict[str, list[int]] = {}  # budget key -> sorted event times

    def _recent(self, key: str, now: int, window: int) -> list[int]:
        events = self._events.get(key, [])
        cut = bisect.bisect_right(events, now - window)
        if cut:
            del events[:cut]
        return events

    def decide(self, bucket: str, rpm: int, tpm: int, tokens: int, window: int,
               budget_window: int, budgets: list[tuple[str, int]], now: int) -> Outcome:
        for position, (key, limit) in enumerate(budgets, start=1):
            events = self._recent(key, now, budget_window)
            if len(events) > limit:
                oldest_that_matters = events[len(events) - limit - 1]
                return Outcome(budget=position, limit=limit, count=len(events),
                               resets_ms=oldest_that_matters + budget_window)
        state = self._buckets.get(bucket)
        if state is None or now >= state[0] + window:
            state = [now, 0, 0]
            self._buckets[bucket] = state
        start, requests, used = state
        if rpm > 0 and requests + 1 > rpm:
            return Outcome(code=OVER_REQUESTS, window_ms=start, requests=requests, tokens=used)
        if tpm > 0 and used > 0 and used + tokens > tpm:
            return Outcome(code=OVER_TOKENS, window_ms=start, requests=requests, tokens=used)
        state[1] += 1
        state[2] += tokens
        return Outcome(code=OK, window_ms=start, requests=state[1], tokens=state[2])

    def peek(self, buckets: list[str], now: int, window: int) -> list[int]:
        """The current count of each bucket, read without counting anything or creating a
        bucket: `[window start, requests, tokens]` per bucket, flattened; a bucket with no
        window running reads `[0, 0, 0]`."""
        out: list[int] = []
        for bucket in buckets:
            state = self._buckets.get(bucket)
            if state is None or now >= state[0] + window:
                out += (0, 0, 0)
            else:
                out += state
        return out

    def lease(self, bucket: str, slots: int, tokens: int, rpm: int, tpm: int, window: int,
              budgets: list[tuple[str, int]], now: int, budget_window: int) -> list[int]:
        """Count up to `slots` more requests and `tokens` more tokens for a replica to hand
        out, in the bucket's current window. A lease holds at most a hundredth of each limit
        and is granted only while half of each limit stays free after it and every error
        budget is less than half spent: what a lease may leave unused when the key suddenly
        reaches its limit elsewhere is small and brief. `[granted slots, window start,
        requests and tokens counted after the grant, granted tokens]`; `[0, ...]`: refused."""
        state = self._buckets.get(bucket)
        if state is None or now >= state[0] + window:
            return [0, 0, 0, 0, 0]
        start, requests, used = state
        refused = [0, start, requests, used, 0]
        if rpm > 0:
            slots = min(slots, rpm // 100)
        if tpm > 0:
            tokens = min(tokens, tpm // 100)
        if slots < MIN_LEASE:  # a small limit is decided one request at a time
            return refused
        if rpm > 0 and requests + slots > rpm // 2:
            return refused
        if tpm > 0 and used + tokens > tpm // 2:
            return refused
        for key, limit in budgets:
            if len(self._recent(key, now, budget_window)) * 2 >= limit:
                return refused
        state[1] += slots
        state[2] += tokens
        return [slots, start, state[1], state[2], tokens]

    def give_back(self, bucket: str, window_ms: int, slots: int, tokens: int) -> None:
        """Return what a lease did not use, within the same window."""
        state = self._buckets.get(bucket)
        if state is not None and state[0] == window_ms:
            state[1] = max(0, state[1] - slots)
            state[2] = max(0, state[2] - tokens)

    def adjust(self, bucket: str, window_ms: int, delta: int) -> None:
        """Correct a bucket's token count (measured minus estimated) within the same window."""
        state = self._buckets.get(bucket)
        if state is not None and state[0] == window_ms:
            state[2] = max(0, state[2] + delta)

    def record(self, key: str, now: int, budget_window: int) -> int:
        events = self._recent(key, now, budget_window)
        bisect.insort(events, now)
        self._events[key] = events
        return len(events)

    def expire(self, now: int, window: int, budget_window: int) -> None:
        """Forget buckets and budgets with nothing left in their windows (bounded memory)."""
        self._buckets = {k: v for k, v in self._buckets.items() if now < v[0] + window}
        self._events = {k: v for k, v in self._events.items()
                        if v and v[-1] > now - budget_window}
