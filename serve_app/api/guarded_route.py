"""The route class of every API route: the caller gate's verdict acted on by the route itself,
before FastAPI reads the body, and the check that every route is guarded before the app runs.

The guard lives in `APIRoute.get_route_handler`, the hook FastAPI documents for custom
request handling, which every FastAPI version calls for each route it serves, directly or
through an included router (0.137 and later keep included routers as nodes of their own, so
a walk over `app.router.routes` no longer finds the routes). Before FastAPI's handler:

* a route that needs a caller (one of `AUTHENTICATING` among its dependencies) and has none
  known (caller_gate.py) answers without its body: the gate's refusal (a forged key or
  wallet header: 401), or the route's own answer from the headers;
* a body past the caller's cap is a 413;
* a route that takes a JSON body refuses a body of any other type, or of none, with a 415
  (whatever FastAPI would have done with it: older versions parsed a body without a type as
  JSON on the event loop), and parses the rest with `json_bodies.parse_json` (counted first,
  off the loop when large).

`check_routes_guarded` runs a probe request through the app's own routing to every route
that needs a caller or takes a body and refuses to build the app when one is not reached
through its guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from fastapi import FastAPI, params
from fastapi.routing import APIRoute, APIRouter
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Scope

from serve_app.api.deps import caller_key, inference_caller, key_or_wallet
from serve_app.caller_gate import gate_verdict
from serve_app.errors import ApiError, payload_too_large
from serve_app.json_bodies import COUNTED_FROM_BYTES, parse_json
from serve_app.middleware import body_too_large_message

# The dependencies that make a route need a caller.
AUTHENTICATING: frozenset[Callable[..., Any]] = frozenset(
    {caller_key, inference_caller, key_or_wallet})
# A probe of `check_routes_guarded` carries this in its state; the guard answers it at once.
_PROBE = "guard_probe"


class RoutesNotGuarded(RuntimeError):
    """The app would serve a route that needs a caller or takes a body past its guard."""


def _calls(dependant: Any) -> set[Callable[..., Any]]:
    found = set()
    for sub in dependant.dependencies:
        found.add(sub.call)
        found |= _calls(sub)
    return found


def needs_caller(route: APIRoute) -> bool:
    return bool(_calls(route.dependant) & AUTHENTICATING)


def takes_json(route: APIRoute) -> bool:
    """Whether FastAPI reads `route`'s body as JSON (a body parameter that is not a form)."""
    return route.body_field is not None and not isinstance(route.body_field.field_info,
                                                           params.Form)


def is_json_type(content_type: str | None) -> bool:
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


def not_json(content_type: str | None) -> ApiError:
    return ApiError(415, f"Invalid content type {content_type or '(none)'!r}: "
                         "send application/json", code="INVALID_CONTENT_TYPE")


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class GuardedRoute(APIRoute):
    """An APIRoute whose handler acts on the caller gate's verdict before its body is read."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        route_needs_caller = needs_caller(self)
        route_takes_json = takes_json(self)
        path = self.path

        async def guarded(request: Request) -> Response:
            state = request.scope.setdefault("state", {})
            probe = state.get(_PROBE)
            if probe is not None:
                probe.append(path)
                return Response(status_code=204)
            verdict = gate_verdict(request.scope)
            if verdict is None:  # no body (or an app built without the gate)
                return await handler(request)
            verdict.route_guarded = True
            if route_needs_caller and not verdict.known:
                if verdict.refusal is not None:
                    raise verdict.refusal
                verdict.answer_from_headers = True  # its 401 or 402 needs no body
                return await handler(request)
            if verdict.declared > verdict.cap:
                raise payload_too_large(body_too_large_message(verdict.cap))
            if route_takes_json:
                content_type = request.headers.get("content-type")
                if not is_json_type(content_type):
                    raise not_json(content_type)
                body = await request.body()
                if len(body) >= COUNTED_FROM_BYTES:
                    # Starlette's own cache of `request.json()`, which FastAPI then reads.
                    request._json = await parse_json(body)  # type: ignore[attr-defined]
            return await handler(request)

        return guarded


def guarded_router(**options: Any) -> APIRouter:
    """An APIRouter whose routes are `GuardedRoute`s (what every router of `serve_app.api`
    is)."""
    return APIRouter(route_class=GuardedRoute, **options)


def _probe_path(route: APIRoute) -> str:
    """A path `route` matches: each parameter given a value its convertor takes."""
    values = {name: "1" for name in route.param_convertors}
    return route.path_format.format(**values)


async def _probe(app: FastAPI, method: str, path: str) -> list[str]:
    reached: list[str] = []
    scope: Scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": [(b"host", b"probe")], "client": ("127.0.0.1", 1),
        "server": ("probe", 80), "app": app, "state": {_PROBE: reached}}

    async def receive() -> Message:
        raise RoutesNotGuarded(f"{method} {path} read its body past its guard")

    async def send(message: Message) -> None:
        pass

    with contextlib.suppress(Exception):  # whatever answered in the guard's place failed
        await app.router(scope, receive, send)
    return reached


def check_routes_guarded(app: FastAPI, routers: Iterable[APIRouter]) -> None:
    """Refuse (RoutesNotGuarded) an app that would serve, past its guard, a route of
    `routers` that needs a caller or takes a body: each is requested through the app's own
    routing, as a request would be, and must reach its guard."""
    must: list[tuple[str, str, str]] = []
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            methods = route.methods or set()  # typed Optional from FastAPI 0.137
            if not (needs_caller(route) or route.body_field is not None
                    or methods & {"POST", "PUT", "PATCH"}):
                continue
            if not isinstance(route, GuardedRoute):
                raise RoutesNotGuarded(f"{route.path} is a {type(route).__name__}, not a "
                                       "GuardedRoute: make its router with guarded_router()")
            for method in sorted(methods):
                must.append((method, _probe_path(route), route.path))

    async def probe_all() -> list[str]:
        missed = []
        for method, path, template in must:
            if template not in await _probe(app, method, path):
                missed.append(f"{method} {template}")
        return missed

    missed: list[str] = []
    failure: list[BaseException] = []

    def run() -> None:  # a loop of its own, whether or not the caller runs one
        try:
            missed.extend(asyncio.run(probe_all()))
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=run, name="route-guard-probe")
    worker.start()
    worker.join()
    if failure:
        raise RoutesNotGuarded(f"probing the routes failed: {failure[0]!r}") from failure[0]
    if missed:
        raise RoutesNotGuarded("FastAPI dispatches these routes past their body guard: "
                               + ", ".join(missed))
