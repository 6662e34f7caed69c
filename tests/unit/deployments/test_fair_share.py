"""The fair-share gate in front of an engine: who runs next, the room kept for a newcomer,
and the 503 a request gets instead of a long wait."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from deployments.fair_share import AtCapacity, FairShare
from deployments.protocol import Tenant

HEAVY, LIGHT = Tenant("heavy"), Tenant("light")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Requests:
    """Requests through a gate, each held open until `finish(name)`; `started` lists the
    names in the order the gate let them run."""

    def __init__(self, gate: FairShare, served_each: float = 100.0) -> None:
        self.gate = gate
        self.served_each = served_each
        self.started: list[str] = []
        self._done: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def send(self, name: str, tenant: Tenant, seqs: int = 1) -> asyncio.Task:
        done = self._done[name] = asyncio.Event()

        async def run() -> None:
            async with self.gate.turn(tenant, seqs) as turn:
                self.started.append(name)
                turn.served(self.served_each)
                await done.wait()

        task = self.tasks[name] = asyncio.create_task(run())
        return task

    async def finish(self, name: str) -> None:
        self._done[name].set()
        await self.tasks[name]
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_newcomer_finds_a_slot_while_one_tenant_queues_many() -> None:
    async def scenario() -> None:
        gate = FairShare(4, reserved=1)
        r = Requests(gate)
        for i in range(10):
            r.send(f"a{i}", HEAVY)
        await settle()
        assert r.started == ["a0", "a1", "a2"]  # one slot kept for someone else
        r.send("b0", LIGHT)
        await settle()
        assert r.started[-1] == "b0"  # at once, not after the heavy tenant's seven
        assert gate.stats()["waiting"] == 7
        for name in list(r.tasks):
            r._done[name].set()
        await asyncio.gather(*r.tasks.values())

    asyncio.run(scenario())


def test_a_free_slot_goes_to_the_tenant_served_least() -> None:
    async def scenario() -> None:
        gate = FairShare(2, reserved=0)
        r = Requests(gate)
        r.send("a0", HEAVY)
        r.send("a1", HEAVY)
        await settle()
        for i in range(2, 6):
            r.send(f"a{i}", HEAVY)
        await settle()
        r.send("b0", LIGHT)  # behind four of the heavy tenant's
        await settle()
        assert r.started == ["a0", "a1"]
        await r.finish("a0")
        assert r.started == ["a0", "a1", "b0"]  # the light tenant's first: served least
        await r.finish("a1")
        assert r.started[-1] == "a2"  # then the heavy tenant's, in the order it sent them
        for name in ("b0", "a2", "a3", "a4", "a5"):
            await r.finish(name)
        assert r.started == ["a0", "a1", "b0", "a2", "a3", "a4", "a5"]

    asyncio.run(scenario())


def test_a_heavier_weight_gets_more_turns() -> None:
    async def scenario() -> None:
        gate = FairShare(1, reserved=0)
        r = Requests(gate)
        gold, plain = Tenant("gold", weight=2.0), Tenant("plain", weight=1.0)
        r.send("first", Tenant("someone"))
        await settle()
        for i in range(6):
            r.send(f"g{i}", gold)
            r.send(f"p{i}", plain)
        await settle()
        await r.finish("first")
        for _ in range(9):
            await r.finish(r.started[-1])
        turns = r.started[1:10]
        # Each turn adds 100 tokens: 50 to the gold tenant's counter, 100 to the plain one's.
        assert sum(t.startswith("g") for t in turns) == 6
        assert sum(t.startswith("p") for t in turns) == 3
        for name in r.tasks:
            r._done[name].set()
        await asyncio.gather(*r.tasks.values())

    asyncio.run(scenario())


def test_a_wait_longer_than_the_bound_is_refused_with_the_wait_it_would_have_had() -> None:
    async def scenario() -> None:
        clock = Clock()
        gate = FairShare(2, reserved=0, max_wait_s=30.0, clock=clock)
        r = Requests(gate)
        # Two requests that held their slot 20 s each: slots free up every 10 s.
        r.send("x0", HEAVY)
        r.send("x1", HEAVY)
        await settle()
        clock.now = 20.0
        await r.finish("x0")
        await r.finish("x1")
        for i in range(2):
            r.send(f"a{i}", HEAVY)
        await settle()
        r.send("w0", HEAVY)  # one ahead of none: (0 + 1) * 20 / 2 = 10 s
        r.send("w1", HEAVY)
        r.send("w2", HEAVY)  # two ahead: 30 s, not more than the bound
        await settle()
        with pytest.raises(AtCapacity) as refused:
            async with gate.turn(HEAVY):
                pass
        assert refused.value.retry_after == 40.0  # three ahead, a slot each 10 s
        assert refused.value.ahead == 3
        assert gate.stats()["waiting"] == 3  # the refused one left no place behind
        # Another tenant is not behind the heavy tenant's queue: its wait is its own.
        r.send("b0", LIGHT)
        await settle()
        await r.finish("a0")
        assert r.started[-1] == "b0"
        for name in r.tasks:
            r._done[name].set()
        await asyncio.gather(*r.tasks.values(), return_exceptions=True)

    asyncio.run(scenario())


def test_a_request_behind_its_own_queue_counts_the_turns_another_backlogged_tenant_takes() -> None:
    """Two tenants with long queues take turns: the newest request of one starts only after
    its own earlier ones and about as many of the other's, and its wait is told so."""

    async def scenario() -> None:
        clock = Clock()
        gate = FairShare(2, reserved=0, max_wait_s=30.0, clock=clock)
        r = Requests(gate, served_each=0.0)  # the counters stay level
        r.send("x0", HEAVY)
        r.send("x1", LIGHT)
        await settle()
        clock.now = 10.0  # each held its slot 10 s: a slot frees up every 5 s
        await r.finish("x0")
        await r.finish("x1")
        r.send("h0", HEAVY)
        r.send("l0", LIGHT)  # both slots taken
        for i in range(4):
            r.send(f"hw{i}", HEAVY)
        for i in range(3):
            r.send(f"lw{i}", LIGHT)
        await settle()
        # LIGHT's fourth: its three earlier ones, and as many of HEAVY's four meanwhile (their
        # counters are level: turns alternate); seven start first, a slot frees every 5 s.
        # Counting LIGHT's own queue alone, it would have been told 20 s and waited 40.
        with pytest.raises(AtCapacity) as refused:
            async with gate.turn(LIGHT):
                pass
        assert refused.value.ahead == 7
        assert refused.value.retry_after == 40.0
        # The order it would have waited in: turns alternate between the two tenants.
        for name in ("h0", "l0", "hw0", "lw0"):
            await r.finish(name)
        assert r.started[-4:] == ["hw0", "lw0", "hw1", "lw1"]
        for name in r.tasks:
            r._done[name].set()
        await asyncio.gather(*r.tasks.values(), return_exceptions=True)

    asyncio.run(scenario())


def test_a_request_that_leaves_while_waiting_gives_its_place_back() -> None:
    async def scenario() -> None:
        gate = FairShare(1, reserved=0)
        r = Requests(gate)
        r.send("a0", HEAVY)
        leaving = r.send("b0", LIGHT)
        r.send("c0", Tenant("third"))
        await settle()
        leaving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await leaving
        assert gate.stats()["waiting"] == 1
        await r.finish("a0")
        assert r.started == ["a0", "c0"]
        await r.finish("c0")
        assert gate.stats() | {"slot_seconds": 0} == {
            "slots": 1, "running": 0, "waiting": 0, "tenants": 0, "slot_seconds": 0,
            "units_served": 200}  # a0's and c0's

    asyncio.run(scenario())


def test_a_newcomer_is_lifted_to_the_others_level_and_takes_turns_with_them() -> None:
    """A tenant that arrives after another was served a long time starts at that tenant's
    counter: the two alternate, instead of the newcomer taking every turn until it caught up
    (and time away banks no credit the same way)."""

    async def scenario() -> None:
        gate = FairShare(1, reserved=0)
        r = Requests(gate)
        for i in range(10):
            r.send(f"h{i}", HEAVY)
        await settle()
        for i in range(4):
            await r.finish(f"h{i}")
        for i in range(3):
            r.send(f"l{i}", LIGHT)
        await settle()
        for name in ("h4", "h5", "l0", "h6", "l1", "h7"):
            await r.finish(name)
        assert r.started == [f"h{i}" for i in range(6)] + ["l0", "h6", "l1", "h7", "l2"]
        for name in r.tasks:
            r._done[name].set()
        await asyncio.gather(*r.tasks.values())

    asyncio.run(scenario())


def test_a_text_deployment_answers_a_request_it_cannot_start_soon_with_at_capacity() -> None:
    """The text deployment's gate: with every slot taken and a wait longer than the bound
    (here 0 s), a stream and a unary request get the 503 value with its Retry-After."""
    from deployments.fair_share import FairShareGates
    from deployments.protocol import (
        Chunk,
        EngineError,
        Sampling,
        TextRequest,
        Usage,
        at_capacity,
    )
    from deployments.text import TextDeployment

    class OneSlotEngine:
        max_num_seqs = 1

        def __init__(self) -> None:
            self.hold = asyncio.Event()
            self.hold.set()

        async def generate(self, request: TextRequest):
            await self.hold.wait()
            yield Chunk(index=0, text="hi", tokens=1, prompt_tokens=3, finish_reason="stop")
            yield Usage(prompt_tokens=3, completion_tokens=1)

        def stats(self) -> dict:
            return {}

    async def scenario() -> None:
        deployment = TextDeployment.func_or_class([])
        engine = deployment.engines["m1"] = OneSlotEngine()
        deployment.gates = FairShareGates([{"id": "m1", "engine": "stub", "weights": None,
                                            "engine_options": {}, "max_queue_wait_s": 0.0}])
        request = TextRequest("r1", [{"role": "user", "content": "hi"}], Sampling(),
                              tenant=HEAVY)
        served = await deployment.complete("m1", request)  # a turn measured
        assert isinstance(served[-1], Usage)
        engine.hold.clear()
        running = asyncio.create_task(deployment.complete("m1", request))
        await settle()
        [refused] = await deployment.complete("m1", request)
        assert isinstance(refused, EngineError)
        assert refused == at_capacity("m1", 1.0)
        assert [piece async for piece in deployment.generate("m1", request)] == [
            at_capacity("m1", 1.0)]
        stats = (await deployment.stats())["m1"]["fair_share"]
        assert (stats["running"], stats["waiting"]) == (1, 0)
        engine.hold.set()
        assert isinstance((await running)[-1], Usage)

    asyncio.run(scenario())


def test_a_transcription_replica_serves_one_at_a_time_and_refuses_a_long_wait() -> None:
    """One-at-a-time replicas (transcription here; speech and images alike) take the
    waiting requests in the gate's order and answer 503 when the wait would be too long."""
    import threading

    from deployments.audio import TranscriptionDeployment
    from deployments.fair_share import FairShare
    from deployments.protocol import EngineError, Transcription, TranscriptionRequest

    class Whisper:
        def __init__(self) -> None:
            self.heard: list[bytes] = []
            self.go = threading.Event()

        def transcribe(self, audio: bytes, language, timestamps, stop=None) -> dict:
            self.go.wait(timeout=120)
            self.heard.append(audio)
            return {"text": audio.decode(), "duration": 1.0, "segments": []}

    async def scenario() -> None:
        deployment = TranscriptionDeployment.func_or_class([])
        engine = deployment.engines["w"] = Whisper()
        calls = [asyncio.create_task(deployment.transcribe(
            "w", TranscriptionRequest(name.encode(), None, False, tenant)))
            for name, tenant in (("a0", HEAVY), ("a1", HEAVY), ("a2", HEAVY))]
        await settle()
        light = asyncio.create_task(deployment.transcribe(
            "w", TranscriptionRequest(b"b0", None, False, LIGHT)))
        await settle()
        engine.go.set()
        results = await asyncio.gather(*calls, light)
        assert all(isinstance(r, Transcription) for r in results)
        # a0 was running; the light tenant's b0 went before the heavy tenant's next two
        assert engine.heard == [b"a0", b"b0", b"a1", b"a2"]

        deployment.gate = FairShare(1, reserved=0, max_wait_s=0.0)
        assert isinstance(await deployment.transcribe(
            "w", TranscriptionRequest(b"x", None, False, HEAVY)), Transcription)
        engine.go.clear()
        running = asyncio.create_task(deployment.transcribe(
            "w", TranscriptionRequest(b"y", None, False, HEAVY)))
        await settle()
        refused = await deployment.transcribe("w", TranscriptionRequest(b"z", None, False,
                                                                         LIGHT))
        assert isinstance(refused, EngineError)
        assert (refused.status, refused.code, refused.retry_after) == (
            503, "MODEL_AT_CAPACITY", 1.0)
        engine.go.set()
        assert isinstance(await running, Transcription)

    asyncio.run(scenario())


def test_the_room_for_others_is_on_top_of_the_batch_of_a_vllm_engine() -> None:
    """A tenant alone fills the engine's whole batch (`max_num_seqs`, as with the order off);
    the room kept for others is admitted beside it, so a newcomer still starts at once."""
    from deployments.fair_share import FairShareGates
    from deployments.spec import room_for_others

    assert room_for_others({"max_num_seqs": 10}, 10) == 1
    assert room_for_others({"max_num_seqs": 32}, 32) == 4
    assert room_for_others({"reserved_slots": 3}, 10) == 3
    assert room_for_others({"fair_share": False}, 10) == 0

    class Engine:  # what VLLMEngine says of itself for a batch of 10
        reserved_slots = room_for_others({}, 10)
        max_num_seqs = 10 + reserved_slots

    async def scenario() -> None:
        gates = FairShareGates([{"id": "m1", "engine": "vllm", "weights": None,
                                 "engine_options": {"max_num_seqs": 10}}])
        r = Requests(gates.of("m1", Engine()))
        for i in range(24):
            r.send(f"a{i}", HEAVY)
        await settle()
        assert len(r.started) == 10  # the whole batch, as without the gate
        r.send("b0", LIGHT)
        await settle()
        assert r.started[-1] == "b0"
        assert r.gate.stats()["running"] == 11
        for name in list(r.tasks):
            r._done[name].set()
        await asyncio.gather(*r.tasks.values())

    asyncio.run(scenario())
