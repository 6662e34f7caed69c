"""Fair share of one engine among the tenants of its replica.

An engine runs at most `slots` requests (sequences) at once. Without an order of its own, the
first tenant to send many requests takes every slot and every place in the queue behind them,
and everyone else's first token waits for all of it. This gate sits in the replica that owns the
engine (so it holds across Gateway replicas and nodes) and decides who runs next:

- **Order: least service first** (a virtual token counter, as in VTC, Sheng et al. 2024). Each
  tenant's counter grows by the tokens (or other units) it was served, divided by its weight; a
  free slot goes to the waiting request whose tenant's counter is lowest, first come first
  served within a tenant. A tenant that arrives with nothing running or waiting has its counter
  lifted to the lowest counter of the tenants that do, so time spent away banks no credit.
- **Room kept for others**: one tenant holds at most `slots - reserved` slots, so a tenant with
  nothing running finds a slot free at once instead of waiting for a long stream to end (the
  engines this serves do not preempt a running request for a newcomer). A vLLM engine admits
  the reserved sequences on top of its batch (deployments/spec.py `room_for_others`), so a
  tenant alone still fills the whole batch.
- **Honest backpressure**: a request that would wait longer than `max_wait_s` for its turn is
  refused at once with the wait it would have had (`AtCapacity.retry_after`), estimated from the
  requests that start before it (its tenant's earlier ones, and the turns the other waiting
  tenants take meanwhile) and the measured time a request holds a slot.

The weights come from the tenant's rate-limit tier (configs/rate_limit_tiers.yaml). Everything
here runs on the replica's event loop: no locks. Each gate reports its queue through Ray's
metrics (deployments/metrics.py): requests waiting and their wait by model and tier, requests
running, refusals for capacity and engine seconds by model.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from deployments.metrics import gate_metrics
from deployments.protocol import PLATFORM_TENANT, Tenant
from deployments.spec import DEFAULT_MAX_QUEUE_WAIT_S, ModelSpec, max_queue_wait_of

# A request without a tenant (a call made by the platform itself) shares one.
PLATFORM = PLATFORM_TENANT
# The slots of an engine whose catalog entry turns its gate off: more than ever wait.
UNGATED_SLOTS = 1_000_000
# How many recent slot holding times the wait estimate averages.
_HELD_SAMPLES = 64


class AtCapacity(Exception):
    """The request would wait longer than the gate allows: try again after `retry_after`
    seconds (the wait estimated for it now)."""

    def __init__(self, retry_after: float, ahead: int) -> None:
        super().__init__(f"{ahead} requests are ahead; about {retry_after:.0f} s to wait")
        self.retry_after = retry_after
        self.ahead = ahead


@dataclass
class _Waiter:
    seqs: int
    arrival: int  # the order requests came in: equal counters go first come, first served
    admitted: asyncio.Future[None]


@dataclass
class _TenantState:
    id: str
    weight: float
    served: float = 0.0  # virtual counter: units served / weight
    running: int = 0  # slots held
    waiting: collections.deque[_Waiter] = field(default_factory=collections.deque)

    @property
    def active(self) -> bool:
        return self.running > 0 or bool(self.waiting)


class Turn:
    """A request's slots, held while its engine runs: `served(units)` adds what the engine
    produced for it (tokens, pictures, seconds) to its tenant's counter."""

    def __init__(self, gate: FairShare, tenant: _TenantState) -> None:
        self._gate = gate
        self._tenant = tenant

    def served(self, units: float) -> None:
        if units > 0:
            self._tenant.served += units / self._tenant.weight
            self._gate.units_served += units


class FairShare:
    """The gate in front of one engine (see the module's docstring)."""

    def __init__(self, slots: int, *, reserved: int | None = None,
                 max_wait_s: float = DEFAULT_MAX_QUEUE_WAIT_S,
                 max_waiting: int = 1024,
                 clock: Callable[[], float] = time.monotonic, name: str = "") -> None:
        if slots < 1:
            raise ValueError("an engine needs at least one slot")
        self.slots = slots
        reserved = max(1, slots // 8) if reserved is None else reserved
        # One tenant alone may still use every slot of a one-slot engine.
        self.per_tenant = max(1, slots - reserved)
        self.max_wait_s = max_wait_s
        self.max_waiting = max_waiting
        self._clock = clock
        self._tenants: dict[str, _TenantState] = {}
        self._running = 0
        self._waiting = 0
        self._arrivals = itertools.count()
        self.units_served = 0.0  # since start, every tenant's: the engine's output
        # Seconds each recent request held its slots, for the wait estimate.
        self._held: collections.deque[float] = collections.deque(maxlen=_HELD_SAMPLES)
        self.name = name  # the metrics' `model` label when a turn names none
        self._waiting_by_label: dict[tuple[str, str], int] = {}
        self._metrics = gate_metrics()

    # ---- a request's way through the gate ------------------------------------------------

    @contextlib.asynccontextmanager
    async def turn(self, tenant: Tenant | None, seqs: int = 1, *, model: str = ""
                   ) -> AsyncIterator[Turn]:
        """Wait for this request's turn (AtCapacity when the wait would be too long), hold
        `seqs` slots while the body runs, then hand them to whoever is next. `model`: the
        metrics' label (the gate's name when empty)."""
        tenant = tenant or PLATFORM
        seqs = max(1, min(seqs, self.slots))
        label = (model or self.name, tenant.tier)
        state = self._arrive(tenant)
        waiter = _Waiter(seqs, next(self._arrivals), asyncio.get_running_loop().create_future())
        state.waiting.append(waiter)
        self._waiting += 1
        arrived = self._clock()
        self._count_waiting(label, 1)
        try:
            self._dispatch()
            if not waiter.admitted.done():
                try:
                    self._refuse_if_too_long(state, waiter)
                except AtCapacity:
                    self._metrics.refused.inc(tags={"model": label[0]})
                    raise
            try:
                await waiter.admitted
            except BaseException:
                # Left while waiting (a client that hung up), or admitted just as it left.
                if waiter.admitted.done() and not waiter.admitted.cancelled():
                    self._release(state, seqs, held=None)
                elif waiter in state.waiting:  # (a dispatcher may have dropped it already)
                    self._withdraw(state, waiter)
                    self._dispatch()
                raise
        finally:
            self._count_waiting(label, -1)
        started = self._clock()
        self._metrics.wait_seconds.observe(started - arrived,
                                           tags={"model": label[0], "tier": label[1]})
        self._metrics.running.set(self._running, tags={"model": label[0]})
        try:
            yield Turn(self, state)
        finally:
            self._release(state, seqs, held=self._clock() - started)
            self._metrics.running.set(self._running, tags={"model": label[0]})

    def _count_waiting(self, label: tuple[str, str], change: int) -> None:
        count = self._waiting_by_label[label] = self._waiting_by_label.get(label, 0) + change
        self._metrics.waiting.set(count, tags={"model": label[0], "tier": label[1]})

    def stats(self) -> dict[str, float | int]:
        return {"slots": self.slots, "running": self._running, "waiting": self._waiting,
                "tenants": sum(1 for t in self._tenants.values() if t.active),
                "slot_seconds": round(self._slot_seconds(), 3),
                "units_served": round(self.units_served)}

    # ---- the order -----------------------------------------------------------------------

    def _arrive(self, tenant: Tenant) -> _TenantState:
        state = self._tenants.get(tenant.id)
        if state is None:
            state = self._tenants[tenant.id] = _TenantState(tenant.id, max(tenant.weight, 1e-6))
        state.weight = max(tenant.weight, 1e-6)  # a tier changed since: the newest counts
        if not state.active:
            floor = self._lowest_active_counter()
            if floor is not None:
                state.served = max(state.served, floor)
        return state

    def _lowest_active_counter(self) -> float | None:
        counters = [t.served for t in self._tenants.values() if t.active]
        return min(counters) if counters else None

    def _fits(self, state: _TenantState, seqs: int) -> bool:
        return (self._running + seqs <= self.slots
                and (state.running + seqs <= self.per_tenant or state.running == 0))

    def _dispatch(self) -> None:
        """Give free slots to waiting requests, least-served tenant first."""
        while self._waiting:
            ready = [t for t in self._tenants.values()
                     if t.waiting and self._fits(t, t.waiting[0].seqs)]
            if not ready:
                return
            # Equal counters (a newcomer is lifted to the lowest): the tenant running less,
            # then the request that came first.
            state = min(ready, key=lambda t: (t.served, t.running, t.waiting[0].arrival))
            waiter = state.waiting.popleft()
            self._waiting -= 1
            if waiter.admitted.done():  # its request was cancelled and has yet to see it
                self._forget_if_idle(state)
                continue
            state.running += waiter.seqs
            self._running += waiter.seqs
            waiter.admitted.set_result(None)

    def _release(self, state: _TenantState, seqs: int, *, held: float | None) -> None:
        state.running -= seqs
        self._running -= seqs
        if held is not None:
            self._held.append(held)
        self._forget_if_idle(state)
        self._dispatch()

    def _withdraw(self, state: _TenantState, waiter: _Waiter) -> None:
        state.waiting.remove(waiter)
        self._waiting -= 1
        self._forget_if_idle(state)

    def _forget_if_idle(self, state: _TenantState) -> None:
        """A tenant with nothing running or waiting is remembered only while its counter is
        above the lowest active one (it would be lifted to that anyway); when nothing is
        active at all, every counter starts again from zero."""
        if state.active:
            return
        floor = self._lowest_active_counter()
        if floor is None:
            self._tenants.clear()
        elif state.served <= floor:
            self._tenants.pop(state.id, None)

    # ---- backpressure --------------------------------------------------------------------

    def _slot_seconds(self) -> float:
        """The mean time a request held its slots, recently (0 before any finished)."""
        return sum(self._held) / len(self._held) if self._held else 0.0

    def expected_wait(self, state: _TenantState) -> tuple[float, int]:
        """Seconds until the newest waiting request of `state`'s tenant would start, and how
        many requests start before it: its own tenant's earlier ones, and of every other
        waiting tenant the turns its weight gives it while those run (the order takes turns
        among tenants whose counters are level, so a tenant as backlogged as this one starts
        about as many requests meanwhile; one served less, one turn more first)."""
        own = len(state.waiting) - 1
        ahead = own
        for other in self._tenants.values():
            if other is state or not other.waiting:
                continue
            turns = math.ceil((own + 1) * other.weight / state.weight)
            ahead += min(len(other.waiting), turns + (other.served < state.served))
        held = self._slot_seconds()
        # Slots free up at about `slots / held` a second; the requests ahead take theirs first.
        return (ahead + 1) * held / self.slots, ahead

    def _refuse_if_too_long(self, state: _TenantState, waiter: _Waiter) -> None:
        wait, ahead = self.expected_wait(state)
        if wait > self.max_wait_s or self._waiting > self.max_waiting:
            self._withdraw(state, waiter)
            raise AtCapacity(max(1.0, float(math.ceil(wait))), ahead)


class FairShareGates:
    """The gates of one replica, one per model, each made on its model's first request: as
    many slots as its engine runs sequences at once (`max_num_seqs`), of them the engine's
    `reserved_slots` (else the catalog's, default an eighth, at least one) kept for tenants
    other than the one using the most, and the spec's `max_queue_wait_s` bounding a wait;
    `engine_options.fair_share: false` opens the gate wide."""

    def __init__(self, models: list[ModelSpec]) -> None:
        self._specs = {spec["id"]: spec for spec in models}
        self._gates: dict[str, FairShare] = {}

    def of(self, model_id: str, engine: object) -> FairShare:
        gate = self._gates.get(model_id)
        if gate is None:
            spec = self._specs.get(model_id)
            options = spec["engine_options"] if spec else {}
            # `fair_share: false`: every request goes straight to the engine, first come first
            # served in its own queue (to measure what the gate costs and buys).
            fair = options.get("fair_share", True)
            # A vLLM engine admits its batch and the room kept beside it (`reserved_slots`,
            # deployments/spec.py room_for_others); an engine that does not say keeps the
            # catalog's `reserved_slots` (default an eighth) out of its slots.
            reserved = getattr(engine, "reserved_slots", options.get("reserved_slots"))
            gate = self._gates[model_id] = FairShare(
                int(getattr(engine, "max_num_seqs", 1)) if fair else UNGATED_SLOTS,
                reserved=reserved if fair else 0,
                max_wait_s=max_queue_wait_of(spec), name=model_id)
        return gate


def one_at_a_time(models: list[ModelSpec]) -> FairShare:
    """The gate of a replica whose engines run one request at a time (images, speech,
    transcription): one slot, none kept (there is nothing to keep beside one), the tenant
    served least (in seconds of engine time) first, and the shortest `max_queue_wait_s` of
    its models bounding a wait."""
    waits = [spec["max_queue_wait_s"] for spec in models if "max_queue_wait_s" in spec]
    return FairShare(1, reserved=0, max_wait_s=min(waits, default=DEFAULT_MAX_QUEUE_WAIT_S),
                     name="+".join(spec["id"] for spec in models))


@contextlib.asynccontextmanager
async def timed_turn(gate: FairShare, tenant: Tenant | None, model: str = ""
                     ) -> AsyncIterator[Turn]:
    """A turn at `gate` whose tenant is charged the seconds it held the slot, which are also
    the model's engine seconds in the metrics (`model`: its label, the gate's name if empty)."""
    async with gate.turn(tenant, model=model) as turn:
        started = time.monotonic()
        try:
            yield turn
        finally:
            held = time.monotonic() - started
            turn.served(held)
            gate_metrics().engine_seconds.observe(held, tags={"model": model or gate.name})
