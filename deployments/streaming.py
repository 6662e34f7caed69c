"""Token streams sent in fewer, larger pieces when tokens are cheap.

Every piece a deployment yields crosses to the gateway as its own message and becomes its own
SSE event: a fixed cost per piece that a tiny model producing a token every millisecond pays
far more often than a large one. `coalesce` yields the first piece at once (time to first
token is untouched) and afterwards at most one piece per `min_interval_s`: what the engine
produced in between travels together, merged per choice. The stream's end (a choice's last
chunk, the usage, an error) does not wait for the interval: nothing more is coming to merge
with it, and a short answer (a 1-token chat) would otherwise end a whole interval late.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

from deployments.protocol import Chunk, EngineError, TextEvent, Usage

# One piece per 20 ms per stream at most (50 updates a second): below what a reader
# notices, and below the time a real model takes per token on a busy batch (SmolLM2 on two
# cores: 30-140 ms), so only fast models are merged. At 4 ms a tiny model's 7 ms steps still
# went out one token per piece, and the pieces' fixed cost took half the machine.
MIN_INTERVAL_S = 0.02


def merge(events: list[TextEvent]) -> list[TextEvent]:
    """Consecutive chunks of one choice become one (texts and token counts added, logprobs
    joined, the first prompt count kept); a usage or an error is kept as it is."""
    out: list[TextEvent] = []
    open_by_index: dict[int, int] = {}  # choice -> position in `out` of its open chunk
    for event in events:
        if not isinstance(event, Chunk):
            out.append(event)
            continue
        position = open_by_index.get(event.index)
        current = out[position] if position is not None else None
        if position is None or not isinstance(current, Chunk) or current.finish_reason:
            open_by_index[event.index] = len(out)
            out.append(event)
            continue
        logprobs = current.logprobs
        if logprobs is not None or event.logprobs is not None:
            logprobs = (logprobs or []) + (event.logprobs or [])
        out[position] = dataclasses.replace(
            current, text=current.text + event.text, tokens=current.tokens + event.tokens,
            finish_reason=event.finish_reason, logprobs=logprobs,
            prompt_tokens=current.prompt_tokens if current.prompt_tokens is not None
            else event.prompt_tokens)
    return out


async def coalesce(source: AsyncIterator[TextEvent], min_interval_s: float = MIN_INTERVAL_S
                   ) -> AsyncIterator[list[TextEvent]]:
    """Lists of merged events of `source`, at most one list per `min_interval_s` after the
    first. Closing this generator (a client that left) cancels the source."""
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump() -> None:
        try:
            async for chunk in source:
                queue.put_nowait(chunk)
        except Exception as exc:  # handed to the reader, which raises it in order
            queue.put_nowait(_Failure(exc))
        finally:
            queue.put_nowait(end)

    task = asyncio.get_running_loop().create_task(pump())
    try:
        sent_at = None
        while True:
            pending = [await queue.get()]
            if sent_at is not None:
                wait = min_interval_s - (time.monotonic() - sent_at)
                if wait > 0 and not _ends(pending[-1], end):
                    await asyncio.sleep(wait)
            while not queue.empty():
                pending.append(queue.get_nowait())
            finished = pending[-1] is end
            items = [p for p in pending if p is not end]
            failure = next((item for item in items if isinstance(item, _Failure)), None)
            if failure is not None:  # what came before the failure still goes out first
                items = items[:items.index(failure)]
            if items:
                yield merge(items)
                sent_at = time.monotonic()
            if failure is not None:
                raise failure.error
            if finished:
                return
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _ends(item: object, end: object) -> bool:
    """Whether `item` is the end of the stream or of one of its choices."""
    return (item is end or isinstance(item, Usage | EngineError | _Failure)
            or (isinstance(item, Chunk) and item.finish_reason is not None))


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error
