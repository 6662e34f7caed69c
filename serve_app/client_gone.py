"""Waiting for a model while watching the client: a request whose client left while it waited
(a stream whose first token never came in time) is abandoned and its hold released, rather
than run to the end and charged for an answer nobody receives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

# nginx's name for it: the client closed the connection before the answer.
CLIENT_CLOSED_REQUEST = 499
POLL_S = 0.25


class ClientGone(Exception):
    """The client disconnected while its request waited."""


async def unless_client_leaves(request: Request, work: Awaitable[T], *,
                               poll_s: float = POLL_S) -> T:
    """`await work`, cancelling it (and raising ClientGone) should the client disconnect
    first. Call it once the body has been read: a disconnect is then the only message left."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise ClientGone
    except asyncio.CancelledError:
        task.cancel()
        raise
