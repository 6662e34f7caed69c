"""A request waiting on a model is abandoned when its client disconnects, and answered when
the model comes first."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from serve_app.client_gone import ClientGone, unless_client_leaves


def _request(gone: asyncio.Event) -> Request:
    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_a_client_that_leaves_stops_the_wait_and_the_work():
    async def main() -> bool:
        gone, cancelled = asyncio.Event(), asyncio.Event()

        async def queued_model() -> str:
            try:
                await asyncio.Event().wait()  # a stream still queued for its first token
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "token"

        asyncio.get_running_loop().call_later(0.3, gone.set)
        with pytest.raises(ClientGone):  # the model never answers: only the client's leaving
            await unless_client_leaves(_request(gone), queued_model(), poll_s=0.05)
        return cancelled.is_set()

    assert asyncio.run(main())  # the model's work was cancelled


def test_the_answer_when_the_model_comes_first():
    async def main() -> str:
        async def model() -> str:
            await asyncio.sleep(0.2)
            return "first token"

        return await unless_client_leaves(_request(asyncio.Event()), model(), poll_s=0.05)

    assert asyncio.run(main()) == "first token"
