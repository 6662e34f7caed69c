"""A streamed answer that owns its bill (pipeline/bill.py): the events of `BilledEvents` go
out until their source yields `SETTLE` (or ends), and the bill is closed there, so what the
stream delivered is durable before the stream says it is done; whatever ends the stream before
(an error, a client that left, a body never sent) stops the source (speech: the synthesis
stops) and then closes the bill, at the same place. Chat and `/responses` stream server-sent
events; speech streams audio bytes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import cast

import anyio
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from serve_app.pipeline.bill import SETTLE, BilledEvents, Mark


class BilledStream(StreamingResponse):
    """The pieces of `BilledEvents` (server-sent events by default), settled once however it
    ends."""

    def __init__(self, stream: BilledEvents, *, headers: Mapping[str, str] | None = None,
                 media_type: str = "text/event-stream") -> None:
        super().__init__(cast(AsyncIterator[str], stream.events), media_type=media_type,
                         headers=headers)
        self.source, self.events, self.billed = stream, stream.events, stream.billed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Starlette's, with the stream run in this task: it then starts however soon the
        client leaves (a stream started beside the watch for the client's leaving can be
        cancelled before its first step, and would never settle)."""
        spec = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        if spec >= (2, 4):  # the server tells a client that left by failing a write
            try:
                await self.stream_response(send)
            except OSError:
                raise ClientDisconnect() from None
            return
        failed: Exception | None = None
        async with anyio.create_task_group() as watch:  # older servers, by a message
            watch.start_soon(self._cancel_when_gone, receive, watch.cancel_scope)
            try:
                await self.stream_response(send)
            except Exception as exc:  # raised below as itself, not in an exception group
                failed = exc
            watch.cancel_scope.cancel()
        if failed is not None:
            raise failed

    async def _cancel_when_gone(self, receive: Receive, stream: anyio.CancelScope) -> None:
        await self.listen_for_disconnect(receive)
        stream.cancel()

    async def stream_response(self, send: Send) -> None:
        failure: BaseException | None = None
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for event in self.events:
                if event is SETTLE:
                    break
                await self._send(send, event)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            with anyio.CancelScope(shield=True):  # a stream cancelled still settles
                try:
                    if failure is not None:  # cut short: the model's work stops first
                        await self.source.halt()
                finally:
                    await self.billed.close(failure)
        async for event in self.events:  # the last ones (none when it ended unmarked)
            await self._send(send, event)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send(self, send: Send, event: str | bytes | Mark) -> None:
        assert not isinstance(event, Mark), "one SETTLE per stream"
        body = event.encode(self.charset) if isinstance(event, str) else event
        await send({"type": "http.response.body", "body": body, "more_body": True})

