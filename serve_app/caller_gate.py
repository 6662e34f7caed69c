"""Who is calling, checked from the headers before a byte of the body is read.

FastAPI reads and parses a JSON body before a route's dependencies run, so without this gate
an anonymous client could make the Gateway buffer and parse up to 35 MB (69 MB on
`/video/queue`) only to be told 401. Here, in the ASGI layer, before the route:

* the client's address is found by the operator's trusted-proxy rule (client_address.py);
* for a request with a body, a Bearer key is looked up (one cached hash lookup,
  `KeyStore.authenticate`) and kept on the request's context for the route's own dependency
  (`api/deps.py current_key`), so a request authenticates once; a SIGN-IN-WITH-X header is
  known once its message and signature check out (`WalletAuth.check`, the nonce left for the
  route to use), kept for the route likewise. A request without a body passes straight on;
* what the gate found is the request's `GateVerdict`, which the route's own guard
  (api/guarded_route.py, the route class of every API route) acts on before FastAPI reads
  the body: a route that needs a caller and has none answers without the body (a bad
  credential: its 401 here; a missing one: the route's own 401 or x402 402 from the headers),
  a body past the cap is a 413, a JSON route's body of another type a 415, and the rest is
  counted and parsed by json_bodies.py;
* a caller not known yet (public routes) may send at most `ANONYMOUS_BODY_BYTES`; known
  callers the route's cap (middleware.body_cap: the reference's 35 MB for JSON, more on the
  routes that take media files); 413 past either;
* a body must arrive within `body_timeout_s` of the request (408), and one client address
  (an IPv6 /64) may have at most `large_bodies_per_client` bodies over `LARGE_BODY_BYTES` on
  their way at once (429);
* a body is handed only to a route whose guard has run: anything else that tries to read
  one (a route FastAPI dispatched past the guard) is refused, and logged as the server's
  fault.

A refusal raised while the route reads its body wins over whatever answer the route then
makes of the error (FastAPI turns any exception of a body read into a 400).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.accounts.key_store import KeyStore
from serve_app.client_address import TrustedProxies, counted_address
from serve_app.errors import ApiError, authentication_failed, payload_too_large
from serve_app.http.render import error_response
from serve_app.limits.limit_headers import limit_headers
from serve_app.middleware import body_cap, body_too_large_message
from serve_app.pipeline.context import RequestContext
from serve_app.wallets.sign_in import WalletAuth
from serve_app.wallets.siwx import SignIn

logger = logging.getLogger("serve_app.caller_gate")

# What a caller not known yet may send (public routes: their bodies are small, or unread).
ANONYMOUS_BODY_BYTES = 1024 * 1024
# Bodies past this size count toward their client address's uploads in flight.
LARGE_BODY_BYTES = 1024 * 1024
# How soon a client refused for too many uploads at once may try again.
UPLOADS_RETRY_AFTER_S = 1

_SIWX_HEADERS = (b"sign-in-with-x", b"x-sign-in-with-x")
# Where a request's GateVerdict and the wallet sign-in the gate checked are kept
# (scope["state"]).
GATE_VERDICT = "caller_gate"
CHECKED_SIGN_IN = "checked_sign_in"


@dataclass(slots=True)
class GateVerdict:
    """What the gate found of a request with a body, for the route's guard to act on."""

    known: bool  # a key that authenticated, or a wallet header whose signature checks out
    refusal: ApiError | None  # the 401 (or 429) of a bad credential
    cap: int  # the largest body this caller may send to this route
    declared: int  # the Content-Length, -1 without one (chunked)
    route_guarded: bool = False  # set by the route's guard before anything reads the body
    answer_from_headers: bool = False  # the route answers without its body


def gate_verdict(scope: Scope) -> GateVerdict | None:
    """The gate's verdict on this request; None for a request without a body."""
    return scope.get("state", {}).get(GATE_VERDICT)


def checked_sign_in(scope: Scope, header: str) -> SignIn | None:
    """The sign-in the gate checked for this request, if it checked this very header."""
    checked = scope.get("state", {}).get(CHECKED_SIGN_IN)
    if checked is not None and checked[0] == header:
        return checked[1]
    return None


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


def route_not_guarded() -> ApiError:
    return ApiError(500, "An unknown error occurred", code="UNKNOWN_ERROR")


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

    def __init__(self, app: ASGIApp, *, keys: KeyStore, wallets: WalletAuth,
                 body_timeout_s: float, large_bodies_per_client: int,
                 trusted_proxies: TrustedProxies | None = None,
                 anonymous_body_bytes: int = ANONYMOUS_BODY_BYTES) -> None:
        self.app = app
        self.keys = keys
        self.wallets = wallets
        self.trusted_proxies = trusted_proxies or TrustedProxies()
        self.body_timeout_s = body_timeout_s
        self.large_bodies_per_client = large_bodies_per_client
        self.anonymous_body_bytes = anonymous_body_bytes
        self._uploads: dict[str, int] = {}  # client address (/64) -> large bodies on their way

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = self.trusted_proxies.remember(scope)
        authorization = siwx = host = None
        declared = -1  # no Content-Length
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = authorization or value
            elif name in _SIWX_HEADERS:
                siwx = siwx or value
            elif name == b"host":
                host = host or value
            elif name == b"content-length":
                declared = int(value) if value.isdigit() else 0
            elif name == b"transfer-encoding":
                chunked = True
        if declared <= 0 and not chunked:  # no body: the route checks its caller as ever
            await self.app(scope, receive, send)
            return
        known, refusal = await self._caller(scope, client, authorization, siwx, host)
        cap = body_cap(scope.get("path", ""))
        if not known:
            cap = min(cap, self.anonymous_body_bytes)
        elif declared > cap:  # a known caller's cap depends on the path alone
            await error_response(payload_too_large(
                body_too_large_message(cap)))(scope, _no_body, send)
            return
        verdict = GateVerdict(known, refusal, cap, declared)
        scope.setdefault("state", {})[GATE_VERDICT] = verdict
        await self._guarded(scope, receive, send, verdict, counted_address(client))

    async def _caller(self, scope: Scope, client: str, authorization: bytes | None,
                      siwx: bytes | None, host: bytes | None
                      ) -> tuple[bool, ApiError | None]:
        """(whether the caller is known, the refusal of a bad credential). A wallet header
        decides over a key, as in `key_or_wallet`."""
        try:
            if siwx is not None:
                header = siwx.decode("latin-1")
                sign_in = self.wallets.check(header, (host or b"").decode("latin-1"),
                                             client=client)
                scope.setdefault("state", {})[CHECKED_SIGN_IN] = (header, sign_in)
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

    async def _guarded(self, scope: Scope, receive: Receive, send: Send,
                       verdict: GateVerdict, client: str) -> None:
        """The route, reading its body under the cap, the deadline and the uploads bound,
        once its guard has run."""
        cap, declared = verdict.cap, verdict.declared
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
            if verdict.answer_from_headers:
                return await _no_body()
            if not verdict.route_guarded:
                logger.error("%s %s read its body past the route guard (api/guarded_route.py)",
                             scope.get("method"), scope.get("path"))
                raise refuse(route_not_guarded())
            if declared > LARGE_BODY_BYTES and not large:
                take_upload_slot()
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
