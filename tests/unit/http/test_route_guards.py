"""Every API route is reached through its guard (serve_app/api/guarded_route.py), whatever
FastAPI does with included routers, and an app that would skip one refuses to start."""

from __future__ import annotations

import fastapi
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute

from serve_app.api.guarded_route import GuardedRoute, RoutesNotGuarded, check_routes_guarded
from serve_app.gateway import API_ROUTERS, create_app
from tests.unit.conftest import Gateway

# The newest FastAPI that Ray Serve 2.60 accepts (its requirement: fastapi>=0.133) when this
# was written, and what pyproject allows up to: the guards must hold on it.
NEWEST_CHECKED = (0, 165)


def test_every_api_route_is_a_guarded_route():
    routes = [route for router in API_ROUTERS for route in router.routes]
    assert routes and all(isinstance(route, GuardedRoute) for route in routes)


def test_the_gateway_builds_on_the_installed_fastapi(gateway: Gateway):
    """The probe of every route passes on this FastAPI (the suite runs on the newest one
    pyproject allows)."""
    installed = tuple(int(part) for part in fastapi.__version__.split(".")[:2])
    assert installed >= (0, 136)
    create_app(gateway.services)  # raises RoutesNotGuarded otherwise


def test_a_route_reached_past_its_guard_refuses_the_app():
    """A route FastAPI would dispatch to something else first (here a plain route of the same
    path registered before the API's routers) is found by the probe."""
    app = FastAPI()

    @app.post("/chat/completions")
    async def unguarded() -> dict:
        return {}

    for router in API_ROUTERS:
        app.include_router(router)
    with pytest.raises(RoutesNotGuarded, match="POST /chat/completions"):
        check_routes_guarded(app, API_ROUTERS)


def test_a_router_of_plain_routes_refuses_the_app():
    plain = APIRouter()

    @plain.post("/things")
    async def things(body: dict) -> dict:
        return body

    assert isinstance(plain.routes[0], APIRoute)
    app = FastAPI()
    app.include_router(plain)
    with pytest.raises(RoutesNotGuarded, match="/things is a APIRoute"):
        check_routes_guarded(app, [plain])
