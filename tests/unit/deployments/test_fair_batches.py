"""Forward passes of a batching engine filled fairly: a large call is spread over several passes,
another tenant's few texts ride beside the running pass at once, and a call that would wait
too long is refused."""

from __future__ import annotations

import asyncio

import pytest

from deployments.fair_batches import FairBatches
from deployments.fair_share import AtCapacity
from deployments.protocol import Tenant

HEAVY, LIGHT, THIRD = Tenant("heavy"), Tenant("light"), Tenant("third")


class Engine:
    """Encodes a pass when the test lets it (`release()`); remembers each pass's texts."""

    def __init__(self) -> None:
        self.passes: list[list[str]] = []
        self._go: list[asyncio.Event] = []

    async def run(self, texts: list[str]) -> list[str]:
        go = asyncio.Event()
        self.passes.append(texts)
        self._go.append(go)
        await go.wait()
        return [text.upper() for text in texts]

    def release(self, index: int) -> None:
        self._go[index].set()


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def drain(engine: Engine, *tasks: asyncio.Task) -> list:
    """Let every pass run until `tasks` are done; their results."""
    while not all(task.done() for task in tasks):
        for index in range(len(engine.passes)):
            engine.release(index)
        await settle()
    return [task.result() for task in tasks]


def test_each_text_gets_its_own_output_in_order_across_passes() -> None:
    async def scenario() -> None:
        engine = Engine()
        batches = FairBatches(engine.run, max_texts=3)
        call = asyncio.create_task(batches.encode(list("abcdefg"), [(HEAVY, 7)]))
        for index in range(3):
            await settle()
            engine.release(index)
        assert await call == list("ABCDEFG")
        assert engine.passes == [list("abc"), list("def"), list("g")]
        assert batches.stats()["texts_served"] == 7

    asyncio.run(scenario())


def test_a_newcomer_is_encoded_beside_the_running_pass_and_before_a_big_backlog() -> None:
    async def scenario() -> None:
        engine = Engine()
        batches = FairBatches(engine.run, max_texts=4)
        heavy = [asyncio.create_task(batches.encode([f"h{i}{j}" for j in range(8)],
                                                    [(HEAVY, 8)])) for i in range(3)]
        await settle()
        assert engine.passes == [["h00", "h01", "h02", "h03"]]  # one pass at a time
        light = asyncio.create_task(batches.encode(["l0"], [(LIGHT, 1)]))
        await settle()
        assert engine.passes[1] == ["l0"]  # at once, beside the running pass
        engine.release(1)
        assert await light == ["L0"]
        # A second light text, sent while the heavy tenant's pass still runs, rides too.
        again = asyncio.create_task(batches.encode(["l1"], [(LIGHT, 1)]))
        await settle()
        assert engine.passes[2] == ["l1"]
        engine.release(2)
        assert await again == ["L1"]
        assert [len(r) for r in await drain(engine, *heavy)] == [8, 8, 8]


def test_a_pass_is_filled_least_served_tenant_first() -> None:
    async def scenario() -> None:
        engine = Engine()
        batches = FairBatches(engine.run, max_texts=4)
        first = asyncio.create_task(batches.encode(["t0"], [(THIRD, 1)]))
        await settle()
        # While the third tenant's pass runs, the heavy tenant queues 8 texts and the light
        # one 2, in one call (as a Gateway merges them), heavy's first.
        merged = asyncio.create_task(batches.encode(
            [f"h{j}" for j in range(8)] + ["l0", "l1"], [(HEAVY, 8), (LIGHT, 2)]))
        await settle()
        engine.release(0)
        await first
        await settle()
        # Both were lifted to the third tenant's level: the pass alternates between them
        # by texts served, so the light tenant's two are in it, not behind eight.
        assert sorted(engine.passes[1]) == sorted(["h0", "h1", "l0", "l1"])
        for index in range(1, 4):
            engine.release(index)
            await settle()
        assert await merged == [f"H{j}" for j in range(8)] + ["L0", "L1"]

    asyncio.run(scenario())


def test_a_call_that_would_wait_too_long_is_refused_with_its_wait() -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    async def scenario() -> None:
        clock = Clock()
        engine = Engine()
        batches = FairBatches(engine.run, max_texts=10, max_wait_s=5.0, clock=clock)
        # One pass of 10 texts took 1 s: 10 texts a second.
        warm = asyncio.create_task(batches.encode(list("abcdefghij"), [(HEAVY, 10)]))
        await settle()
        clock.now = 1.0
        engine.release(0)
        await warm
        backlog = asyncio.create_task(batches.encode(["x"] * 40, [(HEAVY, 40)]))
        await settle()
        with pytest.raises(AtCapacity) as refused:
            await batches.encode(["y"] * 20, [(HEAVY, 20)])  # 30 + 20 texts ahead: 5 s
        assert refused.value.retry_after == 6.0
        assert batches.stats()["waiting_texts"] == 30  # the refused texts left no trace
        # Another tenant's few texts are not behind the backlog.
        light = asyncio.create_task(batches.encode(["l"], [(LIGHT, 1)]))
        await settle()
        assert engine.passes[-1] == ["l"]
        assert await drain(engine, light, backlog) == [["L"], ["X"] * 40]


def test_a_failed_pass_fails_the_calls_in_it_and_the_next_ones_run() -> None:
    async def scenario() -> None:
        calls = 0

        async def run(texts: list[str]) -> list[str]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("engine broke")
            return texts

        batches = FairBatches(run, max_texts=2)
        with pytest.raises(RuntimeError, match="engine broke"):
            await batches.encode(["a", "b"], [(HEAVY, 2)])
        assert await batches.encode(["c"], [(LIGHT, 1)]) == ["c"]
        with pytest.raises(ValueError):
            await batches.encode(["d", "e"], [(LIGHT, 1)])

    asyncio.run(scenario())


def test_a_pass_is_shared_by_tokens_not_by_texts() -> None:
    """One tenant's texts of 50 tokens and another's of one token, in one call (as the
    gateway merges them): counted by texts the long ones took every other place in a pass;
    counted by tokens one long text is worth fifty short ones."""
    async def tokens(texts: list[str]) -> list[float]:
        return [float(len(text)) for text in texts]

    async def scenario() -> None:
        engine = Engine()
        batches = FairBatches(engine.run, max_texts=4, measure=tokens)
        long = [f"h{i}".ljust(50, "x") for i in range(8)]
        short = [f"{i}" for i in range(8)]
        call = asyncio.create_task(batches.encode(long + short, [(HEAVY, 8), (LIGHT, 8)]))
        await settle()
        assert [text[:2] for text in engine.passes[0]] == ["h0", "0", "1", "2"]
        engine.release(0)
        await settle()
        assert engine.passes[1] == ["3", "4", "5", "6"]
        await drain(engine, call)

    asyncio.run(scenario())
