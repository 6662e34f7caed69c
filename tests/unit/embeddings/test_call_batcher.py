"""CallBatcher: concurrent callers of one deployment method share handle calls."""

from __future__ import annotations

import asyncio
import random

import pytest

from serve_app.embeddings.batcher import CallBatcher


class FakeSend:
    """A `send` that records its calls and holds each one until the test releases it."""

    def __init__(self, *, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gates: list[asyncio.Event] = []
        self.in_flight = 0
        self.max_in_flight_seen = 0
        self.fail_on = fail_on  # a call containing this item raises

    async def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        gate = asyncio.Event()
        self.gates.append(gate)
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)
        try:
            await gate.wait()
        finally:
            self.in_flight -= 1
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError(f"call {items} failed")
        return [item * 10 for item in items]

    def release(self, call: int) -> None:
        self.gates[call].set()


async def settle(rounds: int = 10) -> None:
    """Let every ready task run (no timer involved)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def release_all(send: FakeSend, tasks: list[asyncio.Task]) -> None:
    """Release every call, including the ones that start meanwhile, until the tasks end."""
    for _ in range(100):
        if all(task.done() for task in tasks):
            return
        for gate in send.gates:
            gate.set()
        await settle()
    raise AssertionError("callers still waiting after every call was released")


def submit(batcher: CallBatcher, items: list[int]) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(batcher.submit(items))


async def test_a_lone_caller_is_sent_at_once_in_a_call_of_its_own():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=64)

    first = submit(batcher, [1, 2, 3])
    await settle()
    assert send.calls == [[1, 2, 3]]  # went out without waiting for company
    send.release(0)
    assert await first == [10, 20, 30]

    second = submit(batcher, [4])
    await settle()
    assert send.calls == [[1, 2, 3], [4]]
    send.release(1)
    assert await second == [40]


async def test_callers_arriving_while_calls_run_share_the_next_call_each_getting_its_own_results():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=64)

    a = submit(batcher, [1])
    await settle()
    b = submit(batcher, [2])
    await settle()
    assert send.calls == [[1], [2]]  # two calls may run: each went alone

    c = submit(batcher, [3, 4])
    d = submit(batcher, [5])
    e = submit(batcher, [6, 7, 8])
    await settle()
    assert len(send.calls) == 2  # the callers wait while max_in_flight calls run

    send.release(1)
    await settle()
    assert send.calls[2] == [3, 4, 5, 6, 7, 8]  # all waiting callers in one call, in order
    send.release(2)
    send.release(0)
    assert await a == [10]
    assert await b == [20]
    assert await c == [30, 40]
    assert await d == [50]
    assert await e == [60, 70, 80]
    assert len(send.calls) == 3


async def test_a_call_carries_at_most_max_items_unless_a_single_caller_brought_more():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=1, max_items=4)
    callers = {
        "a": [0],
        "b": [1, 2],
        "c": [3, 4],
        "d": [5],
        "e": [6, 7, 8, 9, 10, 11],  # more than max_items on its own
        "f": [12],
        "g": [13, 14, 15, 16, 17],  # also more, but comes last
    }
    tasks = {}
    for name, items in callers.items():
        tasks[name] = submit(batcher, items)
        await settle()
    await release_all(send, list(tasks.values()))
    results = {name: await task for name, task in tasks.items()}

    assert results == {name: [i * 10 for i in items] for name, items in callers.items()}
    for call in send.calls:
        assert len(call) <= 4 or call in callers.values(), call
    assert send.calls == [[0], [1, 2, 3, 4], [5], [6, 7, 8, 9, 10, 11], [12],
                          [13, 14, 15, 16, 17]]

    lone = submit(batcher, list(range(10)))  # a lone caller's items are never split
    await settle()
    assert send.calls[-1] == list(range(10))
    send.release(len(send.calls) - 1)
    assert await lone == [i * 10 for i in range(10)]


async def test_a_failure_of_send_reaches_every_caller_of_that_call_and_no_caller_of_another():
    send = FakeSend(fail_on=3)
    batcher = CallBatcher(send, max_in_flight=1, max_items=64)

    a = submit(batcher, [1])
    await settle()
    b, c = submit(batcher, [2]), submit(batcher, [3, 4])  # both wait for a's call
    await settle()
    send.release(0)
    await settle()
    assert send.calls == [[1], [2, 3, 4]]
    d = submit(batcher, [5])  # arrives while the failing call runs
    await settle()
    send.release(1)
    await settle()
    send.release(2)

    assert await a == [10]
    with pytest.raises(RuntimeError, match="failed") as b_error:
        await b
    with pytest.raises(RuntimeError, match="failed") as c_error:
        await c
    assert b_error.value is c_error.value
    assert await d == [50]
    assert send.calls == [[1], [2, 3, 4], [5]]


async def test_a_caller_cancelled_while_waiting_is_not_sent_and_does_not_disturb_the_others():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=1, max_items=64)

    a = submit(batcher, [1])
    await settle()
    b, c, d = submit(batcher, [2]), submit(batcher, [3]), submit(batcher, [4, 5])
    await settle()
    c.cancel()
    await settle()
    send.release(0)
    await settle()
    assert send.calls == [[1], [2, 4, 5]]
    send.release(1)

    assert await a == [10]
    assert await b == [20]
    assert await d == [40, 50]
    assert c.cancelled()
    assert send.in_flight == 0


async def test_a_cancelled_callers_items_do_not_count_against_max_items():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=1, max_items=4)

    a = submit(batcher, [0])
    await settle()
    b, big, d = submit(batcher, [1, 2]), submit(batcher, [3, 4, 5, 6, 7]), submit(batcher, [8])
    await settle()
    big.cancel()
    await settle()
    await release_all(send, [a, b, d])
    assert await a == [0]
    assert await b == [10, 20]
    assert await d == [80]
    assert send.calls == [[0], [1, 2, 8]]


async def test_a_caller_cancelled_during_its_call_leaves_the_results_of_the_others_intact():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=1, max_items=64)

    a = submit(batcher, [1])
    await settle()
    b, c = submit(batcher, [2]), submit(batcher, [3])
    await settle()
    send.release(0)
    await settle()
    assert send.calls == [[1], [2, 3]]
    b.cancel()
    await settle()
    send.release(1)

    assert await a == [10]
    assert await c == [30]
    assert b.cancelled()


async def test_calls_in_flight_never_exceed_max_in_flight():
    rng = random.Random(7)
    for limit in (1, 2, 3):
        send = FakeSend()
        batcher = CallBatcher(send, max_in_flight=limit, max_items=5)
        expected: dict[asyncio.Task, list[int]] = {}
        next_item = 0
        for _ in range(60):
            for _ in range(rng.randint(0, 3)):  # a few callers arrive
                items = list(range(next_item, next_item + rng.randint(1, 3)))
                next_item += len(items)
                expected[submit(batcher, items)] = [i * 10 for i in items]
            await settle()
            assert send.in_flight <= limit
            running = [i for i, gate in enumerate(send.gates) if not gate.is_set()]
            if running:  # some call finishes
                send.release(rng.choice(running))
            await settle()
            assert send.in_flight <= limit
        while any(not gate.is_set() for gate in send.gates):
            for gate in send.gates:
                gate.set()
            await settle()
            assert send.in_flight <= limit

        assert send.max_in_flight_seen == limit
        for task, result in expected.items():
            assert await task == result
        assert sorted(i for call in send.calls for i in call) == list(range(next_item))


async def test_a_call_beside_a_running_one_waits_until_it_carries_min_items_beside():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=64, min_items_beside=4)
    first = submit(batcher, [1])
    await settle()
    assert send.calls == [[1]]  # nothing runs: the first goes at once, alone
    waiting = [submit(batcher, [i]) for i in (2, 3, 4)]
    await settle()
    assert send.calls == [[1]]  # three items beside a running call: not worth a call yet
    waiting.append(submit(batcher, [5]))
    await settle()
    assert send.calls == [[1], [2, 3, 4, 5]]  # the fourth makes it worth one
    await release_all(send, [first, *waiting])
    assert [await t for t in waiting] == [[20], [30], [40], [50]]


async def test_a_short_call_goes_as_soon_as_the_running_calls_end():
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=64, min_items_beside=16)
    first = submit(batcher, [1])
    await settle()
    rest = [submit(batcher, [2]), submit(batcher, [3])]
    await settle()
    assert send.calls == [[1]]
    send.release(0)
    await settle()
    assert send.calls == [[1], [2, 3]]  # nothing runs any more: it goes, however short
    await release_all(send, [first, *rest])
    assert [await t for t in rest] == [[20], [30]]


async def test_under_load_calls_alternate_in_halves():
    """32 closed-loop callers, two calls in flight at most, a floor of 16 beside a running
    call: after the first lone call, every call carries 16."""
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=64, min_items_beside=16)
    tasks = [submit(batcher, [i]) for i in range(32)]
    await settle()
    for _ in range(6):  # each time the oldest running call ends, its callers come back
        oldest = next(i for i, gate in enumerate(send.gates) if not gate.is_set())
        send.release(oldest)
        await settle()
        returned = [t for t in tasks if t.done()]
        tasks = [t for t in tasks if not t.done()]
        tasks += [submit(batcher, [int((await t)[0] / 10)]) for t in returned]
        await settle()
    assert [len(call) for call in send.calls] == [1] + [16] * 7
    await release_all(send, tasks)


async def test_an_owner_with_nothing_in_flight_goes_out_at_once_beside_full_calls():
    """Room kept for others: while one account's large requests take every call, another
    account's first request leaves at once in a call of its own (one such call at a time),
    instead of waiting for the calls and the queue ahead of it."""
    send = FakeSend()
    batcher = CallBatcher(send, max_in_flight=2, max_items=4)
    heavy = [asyncio.get_running_loop().create_task(batcher.submit([i] * 4, "heavy"))
             for i in range(1, 5)]
    await settle()
    assert send.calls == [[1] * 4, [2] * 4]  # every call taken; two requests wait
    light = asyncio.get_running_loop().create_task(batcher.submit([7], "light"))
    third = asyncio.get_running_loop().create_task(batcher.submit([8], "third"))
    await settle()
    assert send.calls[2] == [7]  # at once, beside the full calls
    assert len(send.calls) == 3  # one call beside them at a time: the third account waits
    send.release(2)
    assert await light == [70]
    # The heavy account's waiting requests are not sent ahead: it has calls in flight.
    again = asyncio.get_running_loop().create_task(batcher.submit([5], "heavy"))
    await settle()
    assert len(send.calls) == 3
    await release_all(send, [*heavy, third, again])
    assert [t.result() for t in heavy] == [[i * 10] * 4 for i in range(1, 5)]
    assert third.result() == [80] and again.result() == [50]
