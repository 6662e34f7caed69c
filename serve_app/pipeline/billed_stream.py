"""Where a streamed answer settles: its source yields `SETTLE` once, before its last events
(chat's `[DONE]`), and the response that sends it (serve_app/http/billed_stream.py) closes
the request's bill (pipeline/bill.py) there, or wherever else the stream ends (an error, a
client that left, a body never sent): one settlement per stream, from one place.

    return BilledStream(bill.stream(events), headers={...})
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class Settles(Protocol):
    """What a stream settles where it ends (pipeline/bill.py's `Bill`)."""

    async def close(self, failure: BaseException | None = None) -> None: ...


class Mark(Enum):
    SETTLE = "settle"


SETTLE = Mark.SETTLE  # yielded once by a stream's source: settle here, before its last events


@dataclass(eq=False)
class BilledEvents:
    """A stream's pieces (server-sent events, or audio bytes) and the billed call they
    deliver; the HTTP response (serve_app/http/billed_stream.py) sends them and closes the
    call."""

    billed: Settles
    events: AsyncIterator[str | Mark] | AsyncIterator[bytes | Mark]
    # Stops the model's work when the stream is cut short (None: the events are closed;
    # a generator closed before its first step runs none of its code, so a source that
    # holds a call open before then gives its own).
    stop: Callable[[], Awaitable[None]] | None = None
