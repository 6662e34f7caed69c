"""Token streams in fewer pieces: `merge` of chunk lists and `coalesce` of a chunk source."""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from deployments.protocol import Chunk, EngineError, TextEvent, Usage
from deployments.streaming import coalesce, merge


def text(index: int, piece: str, *, tokens: int = 1, finish: str | None = None,
         logprobs: list | None = None, prompt_tokens: int | None = None) -> Chunk:
    return Chunk(index=index, text=piece, tokens=tokens, finish_reason=finish,
                 logprobs=logprobs, prompt_tokens=prompt_tokens)


def texts_in_order(lists: list[list[TextEvent]]) -> str:
    return "".join(c.text for chunks in lists for c in chunks if isinstance(c, Chunk))


# merge


def test_merge_joins_consecutive_text_chunks_of_one_choice():
    chunks = [
        text(0, "Hel", tokens=1, logprobs=[{"t": "Hel"}], prompt_tokens=7),
        text(0, "lo", tokens=2, logprobs=[{"t": "l"}, {"t": "o"}]),
        text(0, " world", tokens=1, finish="stop", logprobs=[{"t": " world"}],
             prompt_tokens=99),
    ]
    assert merge(chunks) == [Chunk(
        index=0, text="Hello world", tokens=4, finish_reason="stop",
        logprobs=[{"t": "Hel"}, {"t": "l"}, {"t": "o"}, {"t": " world"}],
        prompt_tokens=7,
    )]


def test_merge_keeps_the_last_finish_reason_and_no_logprobs_when_none_were_asked():
    merged = merge([text(0, "a"), text(0, "b"), text(0, "c", finish="length")])
    assert merged == [text(0, "abc", tokens=3, finish="length")]
    assert merged[0].logprobs is None


def test_merge_keeps_usage_error_and_other_choices_chunks_as_they_are_in_order():
    usage = Usage(prompt_tokens=5, completion_tokens=4)
    chunks = [
        text(0, "A", prompt_tokens=5),
        text(1, "x"),
        text(0, "B"),
        text(1, "y", finish="stop"),
        text(0, "C", finish="stop"),
        usage,
    ]
    merged = merge(chunks)
    assert merged == [
        text(0, "ABC", tokens=3, finish="stop", prompt_tokens=5),
        text(1, "xy", tokens=2, finish="stop"),
        usage,
    ]
    assert merged[2] is usage

    error = EngineError(400, "bad")
    assert merge([error]) == [error]
    assert merge([error])[0] is error


def test_merge_starts_a_new_chunk_after_a_finished_one_of_the_same_index():
    chunks = [text(0, "a"), text(0, "b", finish="stop"), text(0, "c"), text(0, "d")]
    assert merge(chunks) == [text(0, "ab", tokens=2, finish="stop"), text(0, "cd", tokens=2)]


def test_merge_leaves_the_chunks_it_was_given_unchanged():
    chunks = [text(0, "a", logprobs=[1], prompt_tokens=3), text(0, "b", logprobs=[2]),
              Usage(prompt_tokens=3, completion_tokens=2)]
    before = copy.deepcopy(chunks)
    merge(chunks)
    assert chunks == before


# coalesce


async def test_coalesce_yields_the_first_chunk_at_once_and_alone():
    produced: list[int] = []
    go_on = asyncio.Event()

    async def slow_source() -> AsyncIterator[TextEvent]:
        for i in range(3):
            if i:
                await go_on.wait()  # the engine takes its time for the next token
                await asyncio.sleep(0.05)
            produced.append(i)
            yield text(0, str(i))

    # An hour's interval must not matter: the first list does not wait for it (the bound
    # tells "at once" from "an hour later" on any machine).
    gen = coalesce(slow_source(), min_interval_s=3600.0)
    first = await asyncio.wait_for(anext(gen), timeout=120)
    assert first == [text(0, "0")]
    assert produced == [0]  # it arrived before the source produced its second chunk
    await gen.aclose()


async def test_coalesce_sends_the_end_of_a_stream_without_waiting_for_the_interval():
    """A 1-token answer: its token, then its finish and usage. With an hour's interval the
    end still comes at once (the bound tells "at once" from "an hour later")."""
    first_out = asyncio.Event()
    usage = Usage(prompt_tokens=3, completion_tokens=1)

    async def short_source() -> AsyncIterator[TextEvent]:
        yield text(0, "Hi", prompt_tokens=3)
        await first_out.wait()
        yield text(0, "", tokens=0, finish="length")
        yield usage

    gen = coalesce(short_source(), min_interval_s=3600.0)
    received = [await asyncio.wait_for(anext(gen), timeout=120)]
    first_out.set()
    received += [chunks async for chunks in gen]

    assert received[0] == [text(0, "Hi", prompt_tokens=3)]
    assert [c for chunks in received[1:] for c in chunks] == [
        text(0, "", tokens=0, finish="length"), usage]


async def test_coalesce_sends_an_error_without_waiting_for_the_interval():
    first_out = asyncio.Event()

    async def failing_source() -> AsyncIterator[TextEvent]:
        yield text(0, "a")
        await first_out.wait()
        raise ValueError("engine died")

    gen = coalesce(failing_source(), min_interval_s=3600.0)
    assert await asyncio.wait_for(anext(gen), timeout=120) == [text(0, "a")]
    first_out.set()
    with pytest.raises(ValueError, match="engine died"):
        await asyncio.wait_for(anext(gen), timeout=120)


async def test_coalesce_merges_chunks_produced_quickly_into_fewer_lists_keeping_all_text():
    """After the first chunk, the rest come faster than the interval (at once, once the
    first list is out: how many lists chunks produced over time make depends on the
    machine's speed, what a burst makes does not)."""
    count = 60
    first_out = asyncio.Event()

    async def fast_source() -> AsyncIterator[TextEvent]:
        for i in range(count):
            if i == 1:
                await first_out.wait()
            yield text(0, f"{i},", tokens=2, prompt_tokens=11 if i == 0 else None)
        yield Usage(prompt_tokens=11, completion_tokens=2 * count)

    received: list[list[TextEvent]] = []
    async for chunks in coalesce(fast_source(), 0.02):
        received.append(chunks)
        first_out.set()

    assert received[0] == [text(0, "0,", tokens=2, prompt_tokens=11)]
    assert len(received) < count / 2
    assert texts_in_order(received) == "".join(f"{i}," for i in range(count))
    all_chunks = [c for chunks in received for c in chunks]
    assert sum(c.tokens for c in all_chunks if isinstance(c, Chunk)) == 2 * count
    assert all_chunks[-1] == Usage(prompt_tokens=11, completion_tokens=2 * count)
    assert sum(isinstance(c, Chunk) and c.prompt_tokens is not None for c in all_chunks) == 1
    for chunks in received:  # within one list, one merged chunk per choice
        assert len([c for c in chunks if isinstance(c, Chunk)]) <= 1


async def test_coalesce_yields_at_most_one_list_per_min_interval_after_the_first():
    """Three bursts of 50 chunks, each produced as soon as the list before it is received:
    each list still waits for the interval after the one before."""
    interval = 0.02
    lists_out = 0
    received_one = asyncio.Condition()

    async def fast_source() -> AsyncIterator[TextEvent]:
        for i in range(150):
            if i and i % 50 == 0:
                async with received_one:
                    await received_one.wait_for(lambda i=i: lists_out >= i // 50)
            yield text(0, str(i % 10))

    received: list[tuple[float, list[TextEvent]]] = []
    async for chunks in coalesce(fast_source(), interval):
        received.append((time.monotonic(), chunks))
        async with received_one:
            lists_out += 1
            received_one.notify_all()

    assert len(received) >= 3
    times = [at for at, _ in received]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= interval - 0.001, gaps
    assert texts_in_order([chunks for _, chunks in received]) == "".join(
        str(i % 10) for i in range(150))


async def test_coalesce_raises_the_source_error_after_the_chunks_before_it():
    async def failing_source() -> AsyncIterator[TextEvent]:
        yield text(0, "a")
        await asyncio.sleep(0.005)
        yield text(0, "b")
        await asyncio.sleep(0.1)  # the failure comes in an interval of its own
        raise ValueError("engine died")

    received: list[list[TextEvent]] = []
    with pytest.raises(ValueError, match="engine died"):
        async for chunks in coalesce(failing_source(), 0.02):
            received.append(chunks)
    assert texts_in_order(received) == "ab"


async def test_coalesce_yields_the_chunks_produced_just_before_a_source_error_before_raising_it():
    async def failing_source() -> AsyncIterator[TextEvent]:
        yield text(0, "a")
        await asyncio.sleep(0.005)
        yield text(0, "b")
        yield text(0, "c")  # produced within the same interval as the failure
        raise ValueError("engine died")

    received: list[list[TextEvent]] = []
    with pytest.raises(ValueError, match="engine died"):
        async for chunks in coalesce(failing_source(), 0.02):
            received.append(chunks)
    assert texts_in_order(received) == "abc"


async def test_closing_coalesce_early_cancels_the_source_and_leaves_no_task_running():
    seen: list[str] = []
    tasks_before = asyncio.all_tasks()

    async def endless_source() -> AsyncIterator[TextEvent]:
        try:
            i = 0
            while True:
                yield text(0, str(i))
                i += 1
                await asyncio.sleep(0.001)
        except (asyncio.CancelledError, GeneratorExit) as exc:
            seen.append(type(exc).__name__)
            raise
        finally:
            seen.append("closed")

    gen = coalesce(endless_source(), 0.02)
    await anext(gen)
    await anext(gen)
    await gen.aclose()  # the client left

    assert seen in (["CancelledError", "closed"], ["GeneratorExit", "closed"])
    assert asyncio.all_tasks() - tasks_before == set()
