"""One request into the gateway's ASGI app as a server would send it, and a client that goes
away part-way: what the flow tests of client-left settlements drive the app with (a test
client cannot leave in the middle of a body)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

from starlette.requests import ClientDisconnect


def post_scope(path: str, payload: bytes, headers: Mapping[str, str], *,
               spec: str = "2.4") -> dict[str, Any]:
    """The ASGI scope of a JSON POST to `path`, from a server of ASGI `spec` version."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(),
        "root_path": "", "query_string": b"", "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    *[(k.lower().encode(), v.encode()) for k, v in headers.items()]],
    }


class LeavingClient:
    """Sends `payload`, reads `leave_after` body messages and goes away (0: before the answer
    starts, the start's write fails; "start": once the start is written, before any body;
    None: it reads all). It leaves the two ways servers report it: a write that fails
    (ASGI 2.4), or `http.disconnect` while a write waits (before 2.4). `on_body` sees each
    body message it reads."""

    def __init__(self, payload: bytes, *, leave_after: int | Literal["start"] | None = None,
                 spec: str = "2.4", on_body: Callable[[bytes], None] | None = None) -> None:
        self.payload, self.leave_after = payload, leave_after
        self.fails_writes = tuple(map(int, spec.split("."))) >= (2, 4)
        self.on_body = on_body
        self.status = 0
        self.headers: dict[str, str] = {}
        self.pieces: list[bytes] = []
        self._asked = False
        self._gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": self.payload, "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode(): v.decode() for k, v in message.get("headers", [])}
            if self.leave_after == "start":
                self._gone.set()
                return
            if self.leave_after == 0:
                self._gone.set()
        if self._gone.is_set():
            if self.fails_writes:
                raise OSError("the client is gone")
            await asyncio.Event().wait()  # a write that never drains, until cancelled
        if message["type"] != "http.response.body" or not message.get("body"):
            return
        self.pieces.append(message["body"])
        if self.on_body is not None:
            self.on_body(message["body"])
        if isinstance(self.leave_after, int) and len(self.pieces) >= self.leave_after:
            self._gone.set()

    async def call(self, app: Any, scope: dict[str, Any]) -> None:
        """Run the request to its end, or until the client's leaving ends it."""
        with contextlib.suppress(OSError, ClientDisconnect):
            await app(scope, self.receive, self.send)
