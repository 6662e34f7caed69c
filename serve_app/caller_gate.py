"""Who is calling, checked from the headers before a byte of the body is read.

FastAPI reads and parses a JSON body before a route's dependencies run, so without this gate
an anonymous client could make the Gateway buffer and parse up to 35 MB (69 MB on
`/video/queue`) only to be told 401. Here, in the ASGI layer, before the route:

* for a request with a body, a Bearer key is looked up (one cached hash lookup,
  `KeyStore.authenticate`) and kept on the request's context for the route's own dependency
  (`api/deps.py current_key`), so a request authenticates once; a SIGN-IN-WITH-X header must
  at least decode (its signature and nonce are checked by the route,
  `WalletAuth.authenticate`). A request without a body passes straight to its route;
* a route that needs a caller and has none is answered without its body: a bad credential
  here (401), a missing one by the route itself from the headers alone (401, or the x402
  402) while it sees an empty body;
* a caller not known yet (public routes) may send at most `ANONYMOUS_BODY_BYTES`; known
  callers the route's cap (middleware.body_cap: the reference's 35 MB for JSON, more on the
  routes that take media files); 413 past either;
* a body must arrive within `body_timeout_s` of the request (408), and one client address
  may have at most `large_bodies_per_client` bodies over `LARGE_BODY_BYTES` on their way at
  once (429).

A refusal raised while the route reads its body wins over whatever answer the route then
makes of the error (FastAPI turns any exception of a body read into a 400).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.accounts.key_store import KeyStore
from serve_app.errors import ApiError, authentication_failed, payload_too_large
from serve_app.http.render import error_response
from serve_app.limits.limit_headers import limit_headers
from serve_app.middleware import body_cap, body_too_large_message
from serve_app.pipeline.context import RequestContext
from serve_app.wallets.siwx import decode_header

# What a caller not known yet may send (public routes: their bodies are small, or unread).
ANONYMOUS_BODY_BYTES = 1024 * 1024
# Bodies past this size count toward their client address's uploads in flight.
LARGE_BODY_BYTES = 1024 * 1024
# How soon a client refused for too many uploads at once may try again.
UPLOADS_RETRY_AFTER_S = 1

_SIWX_HEADERS = (b"sign-in-with-x", b"x-sign-in-with-x")

# (method, path as the app sees it) -> whether the route needs a caller.
NeedsCaller = Callable[[Scope], bool]


def bearer_secret_of(header: str | None) -> str:
    """The secret of an `Authorization: Bearer <key>` header; 401 for anything else."""
    if not header:
        raise authentication_failed(
            "Authentication failed: send your API key as 'Authorization: Bearer <key>'")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise authentication_failed(
            "Authentication failed: the Authorization header must be 'Bearer <key>'")
    return secret.strip()


def body_timed_out(seconds: float) -> ApiError:
    return ApiError(408, f"The request body did not arrive within {seconds:g} s",
                    code="REQUEST_TIMEOUT")


def too_many_uploads(limit: int) -> ApiError:
    return ApiError(429, f"Too many large uploads at once: at most {limit} request bodies over "
                         f"{LARGE_BODY_BYTES} bytes may be on their way from one client "
                         "address; retry when one has finished", code="RATE_LIMIT_EXCEEDED",
                    headers=limit_headers(retry_after_s=UPLOADS_RETRY_AFTER_S))


class _BodyRefused(Exception):
    """Raised from `receive` to stop the route reading a body the gate refuses."""


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _context_of(scope: Scope) -> RequestContext:
    state = scope.setdefault("state", {})
    ctx = state.get("context")
    if ctx is None:  # an app run without the service headers middleware
        ctx = state["context"] = RequestContext(state.get("request_id", "-"))
    return ctx


class CallerGate:
    """Pure ASGI, inside the API app (its answers are counted like any other)."""

    def __init__(self, app: ASGIApp, *, keys: KeyStore, needs_caller: NeedsCaller,
                 body_timeout_s: float, large_bodies_per_client: int,
                 anonymous_body_bytes: int = ANONYMOUS_BODY_BYTES) -> None:
        self.app = app
        self.keys = keys
        self.needs_caller = needs_caller
        self.body_timeout_s = body_timeout_s
        self.large_bodies_per_client = large_bodies_per_client
        self.anonymous_body_bytes = anonymous_body_bytes
        self._uploads: dict[str, int] = {}  # client address -> large bodies on their way

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        authorization = siwx = None
        declared = -1  # no Content-Length
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = authorization or value
            elif name in _SIWX_HEADERS:
                siwx = siwx or value
            elif name == b"content-length":
                declared = int(value) if value.isdigit() else 0
            elif name == b"transfer-encoding":
                chunked = True
        if declared <= 0 and not chunked:  # no body: the route checks its caller as ever
            await self.app(scope, receive, send)
            return
        known, refusal = await self._caller(scope, authorization, siwx)
        if not known and self.needs_caller(scope):
            if refusal is not None:
                await error_response(refusal)(scope, _no_body, send)
            else:  # the route answers from the headers (401, x402's 402)
                await self.app(scope, _no_body, send)
            return
        cap = body_cap(scope.get("path", ""))
        if not known:
            cap = min(cap, self.anonymous_body_bytes)
        if declared > cap:
            await error_response(payload_too_large(
                body_too_large_message(cap)))(scope, _no_body, send)
            return
        await self._guarded(scope, receive, send, cap, declared)

    async def _caller(self, scope: Scope, authorization: bytes | None,
                      siwx: bytes | None) -> tuple[bool, ApiError | None]:
        """(whether the caller is known, the 401 of a bad credential). A wallet header decides
        over a key, as in `key_or_wallet`."""
        try:
            if siwx is not None:
                decode_header(siwx.decode("latin-1"))
                return True, None
            if authorization is None:
                return False, None
            _context_of(scope).authenticated_key = await self.keys.authenticate(
                bearer_secret_of(authorization.decode("latin-1")))
            return True, None
        except ApiError as exc:
            return False, exc
        except Exception:  # e.g. the database out of reach: the route's own check answers
            return False, None

    async def _guarded(self, scope: Scope, receive: Receive, send: Send, cap: int,
                       declared: int) -> None:
        """The route, reading its body under the cap, the deadline and the uploads bound."""
        client = (scope.get("client") or ("-",))[0]
        received = 0
        finished = large = answered = timed_out = False
        refusal: ApiError | None = None
        reader: asyncio.Task | None = None  # the task waiting for the body, if one is

        def expire() -> None:
            # One timer for the whole body (a timeout around each read cost 4 us a read).
            nonlocal timed_out
            timed_out = True
            if reader is not None:
                reader.cancel()

        deadline = asyncio.get_running_loop().call_later(self.body_timeout_s, expire)

        def refuse(error: ApiError) -> _BodyRefused:
            nonlocal refusal
            refusal = refusal or error
            return _BodyRefused()

        def take_upload_slot() -> None:
            nonlocal large
            if self._uploads.get(client, 0) >= self.large_bodies_per_client:
                raise refuse(too_many_uploads(self.large_bodies_per_client))
            self._uploads[client] = self._uploads.get(client, 0) + 1
            large = True

        async def guarded_receive() -> Message:
            nonlocal received, finished, reader
            if finished or refusal is not None:
                return await receive()
            if timed_out:
                raise refuse(body_timed_out(self.body_timeout_s))
            reader = asyncio.current_task()
            try:
                message = await receive()
            except asyncio.CancelledError:
                if not timed_out or reader is None or reader.uncancel():
                    raise  # cancelled by someone else (the client left, the server stops)
                raise refuse(body_timed_out(self.body_timeout_s)) from None
            finally:
                reader = None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise refuse(payload_too_large(body_too_large_message(cap)))
                if received > LARGE_BODY_BYTES and not large:
                    take_upload_slot()
                finished = not message.get("more_body", False)
            else:
                finished = True  # the client left
            if finished:
                deadline.cancel()
            return message

        async def send_unless_refused(message: Message) -> None:
            nonlocal answered
            if refusal is None:
                answered = answered or message["type"] == "http.response.start"
                await send(message)

        try:
            if declared > LARGE_BODY_BYTES:
                take_upload_slot()
            await self.app(scope, guarded_receive, send_unless_refused)
        except _BodyRefused:
            pass
        finally:
            deadline.cancel()
            if large:
                left = self._uploads[client] - 1
                if left:
                    self._uploads[client] = left
                else:
                    del self._uploads[client]
        if refusal is not None and not answered:
            ctx = _context_of(scope)
            # A known caller's failed upload counts toward its error budget like any failure.
            ctx.caller = ctx.caller or ctx.authenticated_key
            await error_response(refusal)(scope, _no_body, send)


def route_needs_caller(routes: list[Any], authenticating: set[Callable[..., Any]]
                       ) -> NeedsCaller:
    """Whether a request goes to a route whose dependencies include one of `authenticating`
    (FastAPI `APIRoute`s; routes that match no such route need no caller)."""

    def calls(dependant: Any) -> set[Callable[..., Any]]:
        found = set()
        for sub in dependant.dependencies:
            found.add(sub.call)
            found |= calls(sub)
        return found

    guarded = [route for route in routes
               if hasattr(route, "dependant") and calls(route.dependant) & authenticating]

    def needs_caller(scope: Scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in guarded)

    return needs_caller
