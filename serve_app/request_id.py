"""The request's id: a client's own `X-Request-ID` when it is one we can log and echo, else one
the platform makes; and the Serve hook that keeps Serve's echo of it equal to ours.

Ray Serve wraps every HTTP app in its own `RequestIdMiddleware`, outside anything of ours: it
takes the request's `X-Request-ID` (or makes one and adds it to the request's headers) and
appends it to the answer. Under Serve, the Gateway therefore adopts that header as the request
id and leaves the answer's `X-Request-ID` to Serve (one header, the same value as `CF-RAY`);
without Serve (uvicorn, the unit tier) the Gateway sends it itself. A client's id that is not
`CLIENT_ID` (too long, spaces, non-ASCII) is ignored: `serve_http_middlewares`, which Serve
places outside its own middleware (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`), drops it
before Serve reads it, so Serve makes its own id instead of echoing the client's.

This module imports nothing heavy: Serve's proxy actor imports it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

REQUEST_ID_HEADER = b"x-request-id"
# Printable ASCII without spaces, 1 to 128 characters: a UUID, a trace id, a ULID all fit; the
# access log and the answer's header carry it as it came.
CLIENT_ID = re.compile(rb"[\x21-\x7e]{1,128}")
# What Serve's proxy callback setting names (the launcher and the Kubernetes manifests set it).
SERVE_CALLBACK = "serve_app.request_id:serve_http_middlewares"


def client_request_id(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first `X-Request-ID` the client sent, if usable as the request id."""
    for name, value in headers:
        if name == REQUEST_ID_HEADER:
            return value.decode("ascii") if CLIENT_ID.fullmatch(value) else None
    return None


def new_request_id() -> str:
    """32 hex digits, as uuid4().hex, cheaper."""
    return os.urandom(16).hex()


class DropUnusableRequestId:
    """Pure ASGI, outside Serve's own request-id middleware: a request whose `X-Request-ID`
    is not usable (`CLIENT_ID`) loses it, so Serve gives it an id of its own."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = scope.get("headers") or ()
            sent = [value for name, value in headers if name == REQUEST_ID_HEADER]
            if sent and not CLIENT_ID.fullmatch(sent[0]):
                scope = {**scope, "headers": [(name, value) for name, value in headers
                                              if name != REQUEST_ID_HEADER]}
        await self.app(scope, receive, send)


def serve_http_middlewares() -> list[Any]:
    """Serve's HTTP proxy callback: the middlewares it wraps around its own."""
    from starlette.middleware import Middleware

    return [Middleware(DropUnusableRequestId)]
