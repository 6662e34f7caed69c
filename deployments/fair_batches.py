"""Fair share of a batching engine (embeddings): forward passes filled least-served tenant first.

A batching engine runs one forward pass at a time over up to `max_texts` inputs. Each call
brings texts of one or more tenants (a Gateway merges the requests that queued while its last
call ran); filled first come first served, a tenant sending batches of hundreds fills every
pass, and a single text of another tenant waits behind all of them. Here each pass is filled a
slice at a time from the tenant served least so far (texts divided by the tenant's weight, the
same virtual counters as deployments/fair_share.py, a newcomer lifted to the lowest active
one), so a big call is spread over several passes and a small one rides in the next. Texts
are counted by their cost, `measure`'s (the embedding deployment's: the tokens the model
reads of each, up to its `max_seq_length`): a pass costs about its tokens, so a tenant of
long texts counted one a text would take hundreds of times the share of one of short texts.

One pass runs at a time, but for room kept for others: a tenant with no text in the running
pass (nor waiting) has its texts encoded at once in a second pass beside it, as the text gate
keeps slots free (the engine does not preempt a pass for a newcomer, and on a CPU a few texts
beside a large pass take about as long as alone).

A call whose texts would wait longer than `max_wait_s` to be encoded (the cost ahead of it in
this order over the measured cost per second) is refused at once (`AtCapacity`).
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from deployments.fair_share import PLATFORM, AtCapacity
from deployments.protocol import Tenant

Out = TypeVar("Out")
# Encodes a pass's texts: one output per text, in order.
RunPass = Callable[[list[str]], Awaitable[Sequence[Out]]]
# The cost of each text of a call (its tokens), in order.
Measure = Callable[[list[str]], Awaitable[Sequence[float]]]
# How many recent passes the texts-per-second estimate averages.
_PASS_SAMPLES = 16


@dataclass
class _Job(Generic[Out]):
    """One tenant's texts of one call: `taken` of them are in a pass or done."""

    texts: list[str]
    results: list[Out | None]
    done: asyncio.Future[None]
    costs: Sequence[float]
    waiting_cost: float  # of the texts not taken yet
    taken: int = 0
    finished: int = 0


@dataclass
class _Owner:
    id: str
    weight: float
    served: float = 0.0
    in_pass: int = 0  # texts in the passes running now
    jobs: collections.deque[_Job] = field(default_factory=collections.deque)

    def pending(self) -> int:
        return sum(len(job.texts) - job.taken for job in self.jobs)

    def pending_cost(self) -> float:
        return sum(job.waiting_cost for job in self.jobs)


class FairBatches(Generic[Out]):
    """The passes of one model's engine (see the module's docstring)."""

    def __init__(self, run: RunPass[Out], *, max_texts: int = 64, max_wait_s: float = 30.0,
                 measure: Measure | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._run = run
        self._measure = measure  # None: every text costs 1
        self.max_texts = max_texts
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._owners: dict[str, _Owner] = {}
        self._running: set[asyncio.Task] = set()
        self._passes: collections.deque[tuple[int, float, float]] = collections.deque(
            maxlen=_PASS_SAMPLES)  # (texts, cost, seconds) of recent passes
        self.texts_served = 0

    async def encode(self, texts: list[str], owners: Sequence[tuple[Tenant, int]] = ()
                     ) -> list[Out]:
        """The outputs of `texts`, whose tenants are `owners` in runs ((tenant, how many of
        the texts in a row), covering them all; empty: one tenant, the platform's)."""
        runs = list(owners) or [(PLATFORM, len(texts))]
        if sum(count for _, count in runs) != len(texts):
            raise ValueError("the owners' runs must cover the texts")
        loop = asyncio.get_running_loop()
        costs = (list(await self._measure(texts)) if self._measure is not None
                 else [1.0] * len(texts))
        jobs: list[tuple[_Owner, _Job]] = []
        start = 0
        for tenant, count in runs:
            chunk = texts[start:start + count]
            chunk_costs = costs[start:start + count]
            start += count
            if not chunk:
                continue
            owner = self._arrive(tenant)
            job: _Job = _Job(chunk, [None] * len(chunk), loop.create_future(), chunk_costs,
                             sum(chunk_costs))
            owner.jobs.append(job)
            jobs.append((owner, job))
        try:
            self._refuse_if_too_long(jobs)
        except AtCapacity:
            for owner, job in jobs:
                owner.jobs.remove(job)
            self._forget_idle()
            raise
        self._wake()
        try:
            await asyncio.gather(*(job.done for _, job in jobs))
        except BaseException:
            for owner, job in jobs:  # a caller that left: its texts not yet taken stay out
                if job in owner.jobs and job.taken == 0:
                    owner.jobs.remove(job)
            self._forget_idle()
            raise
        return [result for _, job in jobs for result in job.results]  # type: ignore[misc]

    def stats(self) -> dict[str, float | int]:
        return {"waiting_texts": sum(o.pending() for o in self._owners.values()),
                "tenants": sum(1 for o in self._owners.values() if o.jobs),
                "texts_per_second": round(self._per_second(0), 1),
                "cost_per_second": round(self._per_second(1), 1),
                "texts_served": self.texts_served}

    # ---- the order -----------------------------------------------------------------------

    def _arrive(self, tenant: Tenant) -> _Owner:
        owner = self._owners.get(tenant.id)
        if owner is None:
            owner = self._owners[tenant.id] = _Owner(tenant.id, max(tenant.weight, 1e-6))
        owner.weight = max(tenant.weight, 1e-6)
        if not owner.jobs:
            active = [o.served for o in self._owners.values() if o.jobs]
            if active:
                owner.served = max(owner.served, min(active))
        return owner

    def _forget_idle(self) -> None:
        active = [o.served for o in self._owners.values() if o.jobs]
        if not active:
            self._owners.clear()
            return
        floor = min(active)
        for owner_id in [i for i, o in self._owners.items() if not o.jobs and o.served <= floor]:
            del self._owners[owner_id]

    def _next_pass(self, newcomers_only: bool) -> list[tuple[_Owner, _Job, int, int]]:
        """Slices (owner, job, start, end) of up to `max_texts` texts, least served first;
        `newcomers_only`: of tenants with no text in a running pass."""
        slices: list[tuple[_Owner, _Job, int, int]] = []
        room = self.max_texts
        newcomers = {o.id for o in self._owners.values() if o.in_pass == 0}
        while room:
            ready = [o for o in self._owners.values()
                     if o.pending() and (not newcomers_only or o.id in newcomers)]
            if not ready:
                break
            # A text at a time, so that tenants alternate within a pass by service.
            owner = min(ready, key=lambda o: o.served)
            job = next(j for j in owner.jobs if j.taken < len(j.texts))
            last = slices[-1] if slices else None
            if last is not None and last[1] is job and last[3] == job.taken:
                slices[-1] = (owner, job, last[2], job.taken + 1)
            else:
                slices.append((owner, job, job.taken, job.taken + 1))
            cost = job.costs[job.taken]
            job.taken += 1
            job.waiting_cost -= cost
            room -= 1
            owner.served += cost / owner.weight
            owner.in_pass += 1
        return slices

    def _wake(self) -> None:
        """Start a pass when none runs, and one beside it for newcomers' texts."""
        while len(self._running) < 2:
            slices = self._next_pass(newcomers_only=bool(self._running))
            if not slices:
                return
            task = asyncio.get_running_loop().create_task(self._pass(slices))
            self._running.add(task)
            task.add_done_callback(self._pass_ended)

    def _pass_ended(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake()

    async def _pass(self, slices: list[tuple[_Owner, _Job, int, int]]) -> None:
        texts = [text for _, job, a, b in slices for text in job.texts[a:b]]
        started = self._clock()
        try:
            outputs = await self._run(texts)
        except Exception as exc:  # every call with a text in the pass gets the failure
            for owner, job, a, b in slices:
                owner.in_pass -= b - a
                self._finish_job(owner, job, exc)
            return
        cost = sum(job.costs[i] for _, job, a, b in slices for i in range(a, b))
        self._passes.append((len(texts), cost, self._clock() - started))
        self.texts_served += len(texts)
        at = 0
        for owner, job, a, b in slices:
            owner.in_pass -= b - a
            job.results[a:b] = outputs[at:at + b - a]
            at += b - a
            job.finished += b - a
            if job.finished == len(job.texts):
                self._finish_job(owner, job, None)

    def _finish_job(self, owner: _Owner, job: _Job, failure: Exception | None) -> None:
        if job in owner.jobs:
            owner.jobs.remove(job)
        if not job.done.done():
            if failure is None:
                job.done.set_result(None)
            else:
                job.done.set_exception(failure)
        self._forget_idle()

    # ---- backpressure --------------------------------------------------------------------

    def _per_second(self, column: int) -> float:
        """Texts (column 0) or cost (1) encoded a second over the recent passes."""
        done = sum(sample[column] for sample in self._passes)
        seconds = sum(sample[2] for sample in self._passes)
        return done / seconds if seconds > 0 else 0.0

    def _refuse_if_too_long(self, jobs: list[tuple[_Owner, _Job]]) -> None:
        """AtCapacity when the last of these texts would wait longer than the bound: the
        cost ahead is its tenants' own and that of tenants served less."""
        rate = self._per_second(1)
        if rate == 0.0 or not jobs:
            return
        mine = {owner.id for owner, _ in jobs}
        lowest = min(owner.served for owner, _ in jobs)
        ahead = [o for o in self._owners.values() if o.id in mine or o.served < lowest]
        wait = sum(o.pending_cost() for o in ahead) / rate
        if wait > self.max_wait_s:
            raise AtCapacity(max(1.0, float(math.ceil(wait))), sum(o.pending() for o in ahead))
