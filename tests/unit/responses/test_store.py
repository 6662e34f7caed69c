"""The table of background responses on each database kind: the per-account bound taken in
one conditional write, leases that run out, ended responses past their keeping time."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from serve_app.db.engine import make_engine
from serve_app.db.tables import StoredResponse, utcnow
from serve_app.responses.store import ResponseStore

LEASE = timedelta(seconds=30)


def _row(response_id: str, account: str = "acct-1", *, size: int = 10,
         status: str = "queued", owner: str | None = "me") -> StoredResponse:
    now = utcnow()
    return StoredResponse(id=response_id, account_id=account, request_id=f"req-{response_id}",
                          status=status, response=json.dumps({"id": response_id}),
                          stored_bytes=size, lease_owner=owner,
                          lease_expires_at=now + LEASE if owner else None,
                          expires_at=now + timedelta(hours=1))


def test_an_account_keeps_at_most_its_bound(database_url):
    store = ResponseStore(make_engine(database_url), lease=LEASE)

    async def main() -> list[bool]:
        return [await store.add_within(_row("resp_1"), 2, 1000),
                await store.add_within(_row("resp_2", "acct-2"), 2, 1000),  # another's
                await store.add_within(_row("resp_3"), 2, 1000),
                await store.add_within(_row("resp_4"), 2, 1000),  # a third: refused
                await store.add_within(_row("resp_5", "acct-2", size=991), 2, 1000)]

    assert asyncio.run(main()) == [True, True, True, False, False]  # count, then bytes
    assert asyncio.run(store.usage("acct-1")) == (2, 20)


def test_a_lease_that_ran_out_makes_an_orphan_and_only_its_owner_writes(database_url):
    now = utcnow()
    later = ResponseStore(make_engine(database_url), lease=LEASE,
                          clock=lambda: now + 2 * LEASE)
    store = ResponseStore(make_engine(database_url), lease=LEASE, clock=lambda: now)

    async def main() -> None:
        await store.add_within(_row("resp_1"), 10, 10_000)
        assert not await store.write("resp_1", "someone-else", status="in_progress")
        assert await store.write("resp_1", "me", status="in_progress")
        assert await store.orphaned() == []
        orphans = await later.orphaned()
        assert [view.id for view in orphans] == ["resp_1"]
        assert await later.fail_orphan(orphans[0], {"status": "failed"}, timedelta(hours=1))
        assert not await later.fail_orphan(orphans[0], {"status": "failed"},
                                           timedelta(hours=1))  # once
        assert not await store.write("resp_1", "me", status="completed")  # it lost its lease
        view = await store.get("resp_1")
        assert view is not None and view.status == "failed" and view.lease_owner is None

    asyncio.run(main())


def test_ended_responses_expire_and_running_ones_do_not(database_url):
    now = utcnow()
    store = ResponseStore(make_engine(database_url), lease=LEASE, clock=lambda: now)
    past = ResponseStore(make_engine(database_url), lease=LEASE,
                         clock=lambda: now + timedelta(hours=2))

    async def main() -> None:
        await store.add_within(_row("resp_run"), 10, 10_000)
        await store.add_within(_row("resp_done"), 10, 10_000)
        await store.write("resp_done", "me", status="completed", ended=True,
                          kept_for=timedelta(hours=1))
        assert await store.expired() == []
        assert await past.expired() == ["resp_done"]

    asyncio.run(main())


def test_of_replicas_claiming_an_orphan_at_once_one_takes_it(database_url):
    now = utcnow()
    store = ResponseStore(make_engine(database_url), lease=LEASE, clock=lambda: now)
    later = [ResponseStore(make_engine(database_url), lease=LEASE,
                           clock=lambda: now + 2 * LEASE) for _ in range(4)]

    async def main() -> None:
        await store.add_within(_row("resp_1"), 10, 10_000)
        (orphan,) = await later[0].orphaned()
        won = await asyncio.gather(*(s.claim(orphan, f"replica-{i}")
                                     for i, s in enumerate(later)))
        assert sorted(won) == [False, False, False, True]
        winner = f"replica-{won.index(True)}"
        view = await store.get("resp_1")
        assert view is not None and view.lease_owner == winner and not view.ended
        assert await later[0].orphaned() == []  # its lease runs again
        assert not await store.write("resp_1", "me", status="in_progress")  # the former's
        assert await later[0].write("resp_1", winner, status="in_progress")

    asyncio.run(main())


def test_a_continuation_is_kept_until_the_response_ends(database_url):
    store = ResponseStore(make_engine(database_url), lease=LEASE)
    row = _row("resp_1")
    row.continuation = '{"kept": 1}'

    async def main() -> None:
        await store.add_within(row, 10, 10_000)
        assert await store.write("resp_1", "me", continuation='{"kept": 2}')
        assert (await store.get("resp_1")).continuation == '{"kept": 2}'
        await store.write("resp_1", "me", status="completed", ended=True,
                          kept_for=timedelta(hours=1))
        assert (await store.get("resp_1")).continuation is None  # not needed: not kept

    asyncio.run(main())
