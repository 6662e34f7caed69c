"""Leases of the Ray limiter: a busy key far from its limits is admitted in the replica from a
block the actor counted ahead; near a limit, or when quiet, every request is the actor's."""

from __future__ import annotations

import asyncio

from serve_app.limits.backends import RayLimiter, run_calls
from serve_app.limits.core import OK, OVER_REQUESTS, LimiterCore
from serve_app.limits.leases import HOT_PER_SECOND, LEASE_SECONDS, LeaseBook

T0 = 1_800_000_000_000
WINDOW = 60_000


class InProcessActor(RayLimiter):
    """The Ray limiter with the actor's own rules run in this process, counting its calls."""

    def __init__(self, core: LimiterCore | None = None) -> None:
        super().__init__()
        self.core = core or LimiterCore()
        self.actor_calls = 0

    async def _send_in_order(self, calls):
        self.actor_calls += 1
        await asyncio.sleep(0)
        return run_calls(self.core, calls)


def test_a_lease_holds_at_most_a_hundredth_of_the_limit_and_only_far_from_it():
    core = LimiterCore()
    core.decide("b", 10_000, 0, 0, WINDOW, 30_000, [], T0)
    assert core.lease("b", 500, 0, 10_000, 0, WINDOW, [], T0, 30_000) == [100, T0, 101, 0, 0]
    core.give_back("b", T0, 40, 0)
    assert core.decide("b", 10_000, 0, 0, WINDOW, 30_000, [], T0).requests == 62
    # Past half of the limit, no more leases: every request is decided one by one.
    for i in range(4940):
        core.decide("b", 10_000, 0, 0, WINDOW, 30_000, [], T0 + i)
    assert core.lease("b", 10, 0, 10_000, 0, WINDOW, [], T0, 30_000)[0] == 0


def test_a_limit_under_400_a_minute_is_never_leased():
    core = LimiterCore()
    core.decide("b", 100, 0, 0, WINDOW, 30_000, [], T0)
    assert core.lease("b", 10, 0, 100, 0, WINDOW, [], T0, 30_000)[0] == 0
    core.decide("x", 500, 0, 0, WINDOW, 30_000, [], T0)
    assert core.lease("x", 10, 0, 500, 0, WINDOW, [], T0, 30_000)[0] == 5


def test_no_lease_while_an_error_budget_is_half_spent():
    core = LimiterCore()
    core.decide("b", 1000, 0, 0, WINDOW, 30_000, [], T0)
    for i in range(25):
        core.record("failed", T0 + i, 30_000)
    assert core.lease("b", 10, 0, 1000, 0, WINDOW, [("failed", 50)], T0 + 30, 30_000)[0] == 0


def test_a_busy_key_is_admitted_from_its_lease_with_its_own_place_in_the_count():
    async def main():
        limiter = InProcessActor()
        outcomes = []
        for i in range(200):  # one replica, one key, 200 requests within a second
            outcomes.append(await limiter.decide("key|class:XS", 100_000, 0, 1, [], T0 + i))
        return limiter, outcomes

    limiter, outcomes = asyncio.run(main())
    assert all(o.code == OK for o in outcomes)
    assert [o.requests for o in outcomes] == list(range(1, 201))
    # Once busy, most requests never reached the actor.
    assert limiter.actor_calls < 200 - HOT_PER_SECOND
    # The actor counted every admitted request, plus what the last lease still holds.
    unused = limiter.leases.finish("key|class:XS")
    held = unused[1] if unused else 0
    counted = limiter.core.decide("key|class:XS", 100_000, 0, 0, WINDOW, 30_000, [], T0 + 300)
    assert counted.requests == 200 + held + 1


def test_near_its_limit_a_busy_key_is_counted_request_by_request_and_never_overshoots():
    async def main():
        core = LimiterCore()
        replicas = [InProcessActor(core), InProcessActor(core)]
        return await asyncio.gather(*[
            replicas[i % 2].decide("key|class:M", 100, 0, 0, [], T0 + i) for i in range(300)])

    outcomes = asyncio.run(main())
    admitted = [o for o in outcomes if o.code == OK]
    assert len(admitted) == 100
    assert sorted(o.requests for o in admitted) == list(range(1, 101))
    assert all(o.code == OVER_REQUESTS for o in outcomes if o.code != OK)


def test_a_quiet_key_asks_the_actor_every_time():
    async def main():
        limiter = InProcessActor()
        for i in range(HOT_PER_SECOND - 1):
            await limiter.decide("quiet|class:XS", 500, 0, 0, [], T0 + i)
        return limiter

    assert asyncio.run(main()).actor_calls == HOT_PER_SECOND - 1


def test_token_corrections_of_a_leased_bucket_stay_in_the_replica_and_keep_the_count_exact():
    async def main():
        limiter = InProcessActor()
        for i in range(100):  # busy: the replica holds a lease
            outcome = await limiter.decide("key|class:XS", 100_000, 1_000_000, 10, [], T0 + i)
            # each request was estimated at 10 tokens and measured at 7
            limiter.adjust_soon("key|class:XS", outcome.window_ms, -3)
        await asyncio.sleep(0)
        return limiter

    limiter = asyncio.run(main())
    calls = limiter.actor_calls
    assert calls < 100 - HOT_PER_SECOND  # the corrections travelled with no call of their own
    # Whatever the lease still holds goes back; the actor's count is then what was used.
    unused = limiter.leases.finish("key|class:XS")
    limiter.core.give_back("key|class:XS", *unused)
    counted = limiter.core.decide("key|class:XS", 100_000, 1_000_000, 0, WINDOW, 30_000, [],
                                  T0 + 300)
    assert (counted.requests, counted.tokens) == (101, 100 * 7)


def test_a_correction_larger_than_the_lease_holds_goes_to_the_actor():
    async def main():
        limiter = InProcessActor()
        for i in range(60):
            outcome = await limiter.decide("key|class:XS", 100_000, 1_000_000, 10, [], T0 + i)
        lease = limiter.leases._leases["key|class:XS"]
        before = limiter.actor_calls
        limiter.adjust_soon("key|class:XS", outcome.window_ms, lease.tokens_left + 1)
        await asyncio.sleep(0)
        return limiter.actor_calls - before

    assert asyncio.run(main()) == 1


def test_a_correction_after_the_lease_expired_goes_to_the_actor_at_once():
    now = [100.0]
    book = LeaseBook(clock=lambda: now[0])
    # slots, window, requests counted, tokens counted, tokens leased
    book.granted("key|class:XS", [10, T0, 20, 5_000, 1_000])
    assert book.absorb("key|class:XS", T0, -300)  # live: the lease carries it
    now[0] += LEASE_SECONDS
    # Expired: it gives back only at this replica's next decision for the key, which may
    # never come, so the correction must not wait in it.
    assert not book.absorb("key|class:XS", T0, -300)
    assert not book.absorb("key|class:XS", T0 + WINDOW, -300)  # another window's
