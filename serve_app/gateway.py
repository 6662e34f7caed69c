"""The FastAPI application of the gateway, built without Serve so tests can call it directly.

`create_app` serves the API at `/` and expects the `/api/v1` prefix to arrive as the ASGI
root path; `create_prefixed_app` is the whole site (API under `/api/v1`, web console under
`/console`) that Serve runs with route prefix `/`, as do plain uvicorn and in-process tests.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Receive, Scope, Send

from serve_app.access_log import AccessLog, write_access_lines_bare
from serve_app.api import (
    api_keys,
    audio,
    billing,
    characters,
    chat,
    crypto,
    embeddings,
    images,
    models,
    responses,
    video,
    webhooks,
    x402,
)
from serve_app.api.deps import release_wallet_slot
from serve_app.api.guarded_route import check_routes_guarded
from serve_app.api.health import HEALTH_PATH, READY_PATH, HealthRoutes, Readiness
from serve_app.billing.ledger import InsufficientBalance
from serve_app.caller_gate import CallerGate, bearer_secret_of
from serve_app.console import CONSOLE_PREFIX, ConsoleFiles
from serve_app.error_handlers import install_error_handlers
from serve_app.errors import ApiError
from serve_app.http.render import error_response
from serve_app.metrics import flush_metrics, record_request, route_of
from serve_app.middleware import (
    RequestIdLogFilter,
    RequestOutcomeMiddleware,
    ServiceHeadersMiddleware,
)
from serve_app.pipeline import respond
from serve_app.pipeline.context import RequestContext
from serve_app.services import GatewayServices
from serve_app.version import service_version
from serve_app.wallets import payment_required

API_PREFIX = "/api/v1"
# The API's routers, in the order the app includes them (each of GuardedRoutes).
API_ROUTERS = (models.router, api_keys.router, embeddings.router, chat.router, images.router,
               audio.router, video.router, responses.router, billing.router,
               characters.router, x402.router, crypto.router, webhooks.router)
PROBE_PATHS = frozenset({HEALTH_PATH, READY_PATH})

_DESCRIPTION = """Self-hostable inference API: chat, embeddings, images, video and audio,
with API keys, rate limits, billing and wallet access. Clients of the usual chat-completion
convention work against this base URL. Authenticate with `Authorization: Bearer <API key>`."""


def configure_logging() -> None:
    """Records of `serve_app.*` carry the request id. Under Serve they propagate to the
    replica's log file; with no handler anywhere (plain uvicorn), they go to stderr."""
    logger = logging.getLogger("serve_app")
    logger.setLevel(logging.INFO)
    for target in (logger, *logger.handlers):
        if not any(isinstance(f, RequestIdLogFilter) for f in target.filters):
            target.addFilter(RequestIdLogFilter())
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [request %(request_id)s] %(message)s"))
        handler.addFilter(RequestIdLogFilter())
        logger.addHandler(handler)
        write_access_lines_bare()


def create_app(services: GatewayServices) -> FastAPI:
    configure_logging()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await services.start()
        try:
            yield
        finally:
            await services.stop()
            flush_metrics()  # the counts of the last half second, before Serve ends the worker

    app = FastAPI(
        title="Inference Platform API",
        description=_DESCRIPTION,
        version=service_version(),
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
        servers=[{"url": API_PREFIX}],
    )
    app.state.gateway = services
    install_error_handlers(app)
    app.add_exception_handler(InsufficientBalance, _wallet_aware_402)
    for router in API_ROUTERS:
        app.include_router(router)

    def finished(scope: Scope, status: int, seconds: float) -> None:
        release_wallet_slot(scope)
        ctx: RequestContext | None = scope.get("state", {}).get("context")
        if ctx is None:
            record_request(scope, status, seconds, model="", auth="none")
            return
        ctx.route = route_of(scope)  # for the access log, which sees only the site's scope
        key = ctx.caller
        record_request(scope, status, seconds,
                       model=ctx.limit_model or str(ctx.headers.get("x-service-model-id", "")),
                       auth="none" if key is None else "wallet" if key.wallet_address else "key")
        services.limits.request_finished(key, ctx.limit_model, status, ctx.request_id,
                                         unsupported_feature=ctx.unsupported_feature,
                                         caller_failure=ctx.caller_failure)

    check_routes_guarded(app, API_ROUTERS)  # refuses to build an app that would skip a guard
    # Inside the outcome middleware, so that its answers are counted like any other.
    app.add_middleware(CallerGate, keys=services.keys, wallets=services.wallets,
                       trusted_proxies=services.settings.trusted_proxy_rule,
                       body_timeout_s=services.settings.body_timeout_s,
                       large_bodies_per_client=services.settings.large_bodies_per_client)
    app.add_middleware(RequestOutcomeMiddleware, on_finished=finished)
    return app  # the site (create_prefixed_app) adds the service headers around it


async def _wallet_aware_402(request: Request, exc: InsufficientBalance) -> JSONResponse:
    """A wallet short of credit gets the x402 answer with top-up instructions; a key's
    account keeps the standard `INSUFFICIENT_BALANCE` error."""
    ctx: RequestContext | None = request.scope.get("state", {}).get("context")
    key = ctx.caller if ctx is not None else None
    if key is None or key.wallet_address is None:
        return error_response(exc)
    services: GatewayServices = request.app.state.gateway
    return error_response(payment_required.insufficient_credit(
        request, services.payments, services.wallets.domain_for(request.headers.get("host", "")),
        balance_nanos=exc.available_nanos, needed_nanos=exc.needed_nanos))


class Site:
    """The whole site of one Gateway, as pure ASGI: `/api/v1` -> the API, `/console` -> the web
    console's files, a 404 in the standard error shape elsewhere. Like a Starlette `Mount`,
    a prefix moves into `root_path`; lifespan events go to the API."""

    def __init__(self, api: ASGIApp, console: ASGIApp, probes: ASGIApp | None = None) -> None:
        self.routes = ((API_PREFIX, api), (CONSOLE_PREFIX, console))
        self.api = api
        self.probes = probes  # /health and /ready (serve_app/api/health.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.api(scope, receive, send)
            return
        root = scope.get("root_path", "")
        path = scope["path"]
        route = path[len(root):] if root and path.startswith(root) else path
        if self.probes is not None and route in PROBE_PATHS and scope["type"] == "http":
            await self.probes(scope, receive, send)
            return
        for prefix, app in self.routes:
            if route == prefix or route.startswith(prefix + "/"):
                await app({**scope, "root_path": root + prefix}, receive, send)
                return
        if scope["type"] == "http":
            await error_response(ApiError(404, "Not found"))(scope, receive, send)


def _bearer_secret(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            try:
                return bearer_secret_of(value.decode("latin-1"))
            except ApiError:
                return None
    return None


def create_prefixed_app(services: GatewayServices, *, under_serve: bool = False) -> ASGIApp:
    """The Gateway's site: the API under `/api/v1` and the console under `/console`. Serve
    runs it with route prefix `/` (`under_serve`: Serve's own middleware sends the answer's
    `X-Request-ID`, serve_app/request_id.py); tests and plain uvicorn run it as it is."""
    console = ConsoleFiles(services.settings.console_dir)

    async def key_windows(scope: Scope, ctx: RequestContext, answer: MutableHeaders) -> None:
        """The key's rate-limit windows on an answer that tells none: a route that checked
        the key, or a public one (/models) the client sent a valid key to."""
        if respond.tells_its_limits(ctx, answer):
            return
        key = ctx.caller or ctx.authenticated_key
        if key is None:
            secret = _bearer_secret(scope)
            if secret is None:
                return
            try:
                key = await services.keys.authenticate(secret)
            except ApiError:
                return  # a public route answers a bad key as if none was sent
        await respond.key_rate_limit_headers(ctx, key, services.limits, services.catalog.models)

    probes = HealthRoutes(Readiness(services.engine, services.settings.redis_url,
                                    services.catalog, services.router))
    return ServiceHeadersMiddleware(Site(create_app(services), console, probes),
                                    on_start=key_windows, on_end=AccessLog(),
                                    echo_request_id=not under_serve)


def create_uvicorn_app() -> ASGIApp:
    """Factory for plain uvicorn, without Ray (development and benchmarks):
    `uvicorn --factory serve_app.gateway:create_uvicorn_app`."""
    from serve_app.settings import Settings

    return create_prefixed_app(GatewayServices.build(Settings()))
