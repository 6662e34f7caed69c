"""Step 1 of every request: identify it, and stamp the service headers on whatever answers.

One pure-ASGI middleware, outermost in the app, so that every response, errors and 404s
included, carries the request id as `CF-RAY` and `X-Request-ID` (a client's own usable
`X-Request-ID`, else a new one: serve_app/request_id.py), `x-service-version`,
`x-service-timestamp`, `x-service-host-name` and `Server-Timing` (serve_app/timing.py),
`x-service-request-timestamp-ms` when the client
sent one, plus the headers that later steps put in the request's context
(serve_app/pipeline/context.py: model, balance, rate limits...), completed when the answer
starts by `on_start` (the gateway's: the key's rate-limit windows).
Once the answer is out it tells `on_end` how the request ended (the access log).
It also turns an unexpected exception into a 500 standard error logged with the request id,
and refuses a body that declares more than its route's cap (`body_cap`) before anything reads
it; bodies sent without a length are counted as they arrive by the API's caller gate
(serve_app/caller_gate.py), which also knows the caller.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.client_gone import CLIENT_CLOSED_REQUEST
from serve_app.error_handlers import unexpected_error
from serve_app.errors import payload_too_large
from serve_app.http.render import error_response
from serve_app.pipeline.context import RequestContext
from serve_app.request_id import REQUEST_ID_HEADER, client_request_id, new_request_id
from serve_app.tracing import RequestTrace
from serve_app.version import service_version

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

# Largest request body a known caller may send to any route but those that take media files:
# the reference's 35 MB JSON cap (a caller not known yet: caller_gate.ANONYMOUS_BODY_BYTES).
MAX_BODY_BYTES = 35 * 1024 * 1024
# One file of just under 25 MB, base64 in JSON (4/3 the size), and the other fields; each
# file is then checked against the spec's 25 MB on its own.
ONE_IMAGE_BODY_BYTES = 25 * 1024 * 1024 * 4 // 3 + 1024 * 1024
# Routes that take media files in the body: how many each may carry whole (multi-edit: up to
# four layers; a video job: a source clip and an image; more come as URLs).
MEDIA_ROUTES = {"/image/upscale": 1, "/image/background-remove": 1, "/image/edit": 1,
                "/image/multi-edit": 4, "/video/quote": 1, "/video/queue": 2}
# The client's own timestamp of its request (milliseconds), echoed under the same name; a
# value that is not a number of milliseconds is not echoed.
REQUEST_TIMESTAMP = b"x-service-request-timestamp-ms"
_MILLISECONDS = re.compile(rb"\d{1,16}(\.\d{1,6})?")



def body_too_large_message(cap: int) -> str:
    """The 413's message: the reference's sentence, with the cap in bytes."""
    return f"Request body exceeds the maximum allowed size ({cap} bytes)."


def body_cap(path: str, default: int = MAX_BODY_BYTES) -> int:
    """The largest body the route at `path` takes: more on the routes of MEDIA_ROUTES."""
    path = path.rstrip("/")
    for route, images in MEDIA_ROUTES.items():
        if path.endswith(route):
            return max(images * ONE_IMAGE_BODY_BYTES, default)
    return default


# Completes the context's headers when the answer starts: (the request's scope, its context,
# the answer's headers).
OnStart = Callable[[Scope, RequestContext, MutableHeaders], Awaitable[None]]
# Told how the request ended, once its answer is out (the access log): (the request's scope,
# its context, the answer's status, the start of an error answer's body, up to ERROR_BODY_BYTES).
OnEnd = Callable[[Scope, RequestContext, int, bytes], None]
ERROR_BODY_BYTES = 4096


class RequestIdLogFilter(logging.Filter):
    """Adds the request id (the answer's `CF-RAY`) to every log record, as `request_id` for the
    text format and as `cf_ray`, which Serve's JSON log encoding (`logging_config.encoding:
    JSON` in the configs) writes as its own field beside Serve's own `request_id`."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = record.cf_ray = request_id_var.get()
        return True


class ServiceHeadersMiddleware:
    """`echo_request_id`: send the request id as `X-Request-ID` too; False under Serve, whose
    own middleware sends it (serve_app/request_id.py)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_BODY_BYTES, *,
                 on_start: OnStart | None = None, on_end: OnEnd | None = None,
                 echo_request_id: bool = True, host_name: str | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.version = service_version().encode()
        self.on_start = on_start
        self.on_end = on_end
        self.echo_request_id = echo_request_id
        self.host_name = host_name or socket.gethostname()
        self.host_name_bytes = self.host_name.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.setdefault("state", {})
        if scope["type"] != "http" or "request_id" in state:
            # Not HTTP, or an outer app (the `/api/v1` mount) already identified the request.
            await self.app(scope, receive, send)
            return

        accept_encoding = ""
        client_timestamp = None
        client_id: str | None = None
        for name, value in scope.get("headers", ()):
            # the first of each, as Starlette's headers read it
            if name == b"accept-encoding" and not accept_encoding:
                accept_encoding = value.decode("latin-1")
            elif name == REQUEST_TIMESTAMP and client_timestamp is None:
                client_timestamp = value.strip()
            elif name == REQUEST_ID_HEADER and client_id is None:
                client_id = client_request_id(((name, value),)) or ""
        request_id = client_id or new_request_id()
        token = request_id_var.set(request_id)
        ctx = RequestContext(request_id, accept_encoding)
        ctx.trace = RequestTrace.start(scope.get("method", ""), scope.get("path", ""),
                                       request_id)
        state["request_id"] = request_id
        state["context"] = ctx
        started = False
        status = 500
        error_body = b""

        async def send_with_headers(message: Message) -> None:
            nonlocal started, status, error_body
            if message["type"] == "http.response.body":
                if status >= 400 and len(error_body) < ERROR_BODY_BYTES:
                    error_body += message.get("body", b"")[:ERROR_BODY_BYTES]
            elif message["type"] == "http.response.start":
                started = True
                status = message["status"]
                if self.on_start is not None:
                    try:
                        await self.on_start(scope, ctx, MutableHeaders(scope=message))
                    except Exception:  # a header left out must not break the answer
                        logging.getLogger("serve_app.middleware").exception(
                            "completing the answer's headers failed")
                message["headers"] = self._stamped(message.get("headers", ()), request_id,
                                                   client_timestamp, ctx)
            await send(message)

        try:
            cap = body_cap(scope.get("path", ""), self.max_body_bytes)
            if self._declared_length(scope) > cap:
                await error_response(payload_too_large(body_too_large_message(cap)))(
                    scope, receive, send_with_headers)
                return
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            # Starlette has usually answered already (the app's exception handler) and
            # re-raised; otherwise answer here.
            error = unexpected_error(exc, scope)
            if not started:
                await error_response(error)(scope, receive, send_with_headers)
        finally:
            if ctx.trace is not None:
                ctx.trace.end(status if started else CLIENT_CLOSED_REQUEST, ctx.route)
            if self.on_end is not None:
                try:
                    self.on_end(scope, ctx, status if started else CLIENT_CLOSED_REQUEST,
                                error_body)
                except Exception:  # the answer is out; its log line must not break anything
                    logging.getLogger("serve_app.middleware").exception(
                        "the request's end hook failed")
            request_id_var.reset(token)

    def _stamped(self, raw: Iterable[tuple[bytes, bytes]], request_id: str,
                 client_timestamp: bytes | None, ctx: RequestContext
                 ) -> list[tuple[bytes, bytes]]:
        """The answer's raw headers with the service headers and the context's: each replaces
        a header of its name the answer has (one pass over the list, not one per header)."""
        ours = {b"cf-ray": request_id.encode(), b"x-service-version": self.version,
                b"x-service-timestamp": datetime.now(UTC).isoformat(
                    timespec="milliseconds").replace("+00:00", "Z").encode(),
                b"x-service-host-name": self.host_name_bytes}
        if self.echo_request_id:
            ours[REQUEST_ID_HEADER] = ours[b"cf-ray"]
        if client_timestamp and _MILLISECONDS.fullmatch(client_timestamp):
            ours[REQUEST_TIMESTAMP] = client_timestamp
        for name, value in ctx.header_items():
            ours[name.lower().encode("latin-1")] = value.encode("latin-1")
        ours[b"server-timing"] = ctx.times.header().encode()
        stamped = [(name, value) for name, value in raw if name not in ours]
        stamped.extend(ours.items())
        return stamped

    @staticmethod
    def _declared_length(scope: Scope) -> int:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return 0
        return 0


class RequestOutcomeMiddleware:
    """Tells `on_finished(scope, status, seconds)` how each HTTP request ended and how long its
    answer took, streams included (the error budgets count failed requests of any endpoint;
    the metrics count and time every request)."""

    def __init__(self, app: ASGIApp,
                 on_finished: Callable[[Scope, int, float], None]) -> None:
        self.app = app
        self.on_finished = on_finished

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        answered = False

        async def send_watching(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status, answered = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, send_watching)
        except asyncio.CancelledError:
            # The server cancels a request whose client hung up (Serve does): before an answer
            # began, that is the client's leaving, not our failure, and must not count
            # toward the key's error budget as a 500 would.
            if not answered:
                status = CLIENT_CLOSED_REQUEST
            raise
        finally:
            try:
                self.on_finished(scope, status, time.perf_counter() - started)
            except Exception:  # the answer is out; counting must not break it
                logging.getLogger("serve_app.middleware").exception("outcome hook failed")
