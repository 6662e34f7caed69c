"""The probes at the site's root: `GET /health` (this process answers) and `GET /ready` (it can
serve: the database and Redis reachable, each type's default model running).

Kubernetes' liveness and readiness probes and the image's health check call them. `/ready` names
the part that fails in its 503 body, so an operator reads the cause from the probe's output.
Neither touches a key, a limit or the ledger; `/health` does no I/O at all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from sqlalchemy import text
from sqlalchemy.engine import Engine
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from serve_app.errors import ApiError
from serve_app.http.render import error_response
from serve_app.metrics import metrics
from serve_app.models.catalog import Catalog
from serve_app.models.router import ModelRouter

logger = logging.getLogger("serve_app.api.health")

HEALTH_PATH = "/health"
READY_PATH = "/ready"
# A probe's own timeout is a few seconds (Kubernetes: 1 s by default, ours 5 s): each check
# gives up before it, so the answer names the part that hangs instead of timing out whole.
CHECK_TIMEOUT_S = 2.0
# The state of a part that passes, and of a default model this application does not run (a
# config that leaves a modality out, or one whose deployment serves no model): not a failure.
OK = "ok"
NOT_RUN = "not run by this application"
# A deployment that autoscaling took to zero replicas on purpose (the media classes when idle):
# its first request starts one and waits for it, so the platform can serve it. Not a failure.
SCALED_TO_ZERO = "scaled to zero: a replica starts on the first request"
PASSING = (OK, NOT_RUN, SCALED_TO_ZERO)
# A model on a server the operator runs (`engine: openai`) whose server does not answer: named,
# and a failure when it is a type's default model; another such model is the operator's to see
# (the platform serves everything else, so a pod is not taken out of its Service for it).
DEGRADED = "degraded: "


def upstream_offline(state: dict[str, Any]) -> str:
    return (f"its server does not answer ({state.get('failures_in_a_row', 0)} failures in a "
            "row); its replica probes it until it does")


def passing(state: str) -> bool:
    return state in PASSING or state.startswith(DEGRADED)


class Replicas(NamedTuple):
    """A deployment's replicas as Serve's controller reports them."""

    running: int
    # No replica running and none wanted: Serve reports such a deployment healthy (or
    # upscaling, once a request asks for one).
    scaled_to_zero: bool = False


# (application, deployment) -> its replicas, from Serve's controller; None outside Serve.
ReplicaCounts = Callable[[], Awaitable[dict[tuple[str, str], Replicas] | None]]


async def serve_replica_counts() -> dict[tuple[str, str], Replicas] | None:
    """The replicas of every deployment Serve knows, or None when this process runs without
    Serve (uvicorn, the unit tier): then a deployment with a handle counts as running."""
    import ray

    if not ray.is_initialized():
        return None
    from ray import serve

    status = await asyncio.to_thread(serve.status)
    counts: dict[tuple[str, str], Replicas] = {}
    for app_name, app in status.applications.items():
        for name, overview in app.deployments.items():
            running = int(overview.replica_states.get("RUNNING", 0))
            at_target = str(getattr(overview.status, "value", overview.status)) in (
                "HEALTHY", "UPSCALING")
            counts[(app_name, name)] = Replicas(running, running == 0 and at_target)
    return counts


class Readiness:
    """The checks of `/ready`, each bounded by CHECK_TIMEOUT_S."""

    def __init__(self, database: Engine, redis_url: str | None, catalog: Catalog,
                 router: ModelRouter, replica_counts: ReplicaCounts = serve_replica_counts
                 ) -> None:
        self.database = database
        self.redis_url = redis_url
        self.catalog = catalog
        self.router = router
        self.replica_counts = replica_counts

    async def checks(self) -> dict[str, str]:
        """Each part's state, `ok` or why not; the parts: database, redis (when configured),
        `model:<id>` for each type's default model, and for each model on a server the
        operator runs (`engine: openai`)."""
        database, redis, models = await asyncio.gather(
            self._bounded(self._database()), self._bounded(self._redis_ping()),
            self._bounded(self._models()))
        result = {"database": database}
        if self.redis_url:
            result["redis"] = redis
        if isinstance(models, dict):
            result.update(models)
        else:
            result["models"] = models
        gauge = metrics().dependency_up
        for part, state in result.items():
            if state != NOT_RUN:
                gauge.set(1 if state in PASSING else 0, tags={"part": part})
        return result

    @staticmethod
    async def _bounded(check: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(check, CHECK_TIMEOUT_S)
        except TimeoutError:
            return f"no answer within {CHECK_TIMEOUT_S:g} s"
        except Exception as exc:  # the probe reports the failure; it must not fail itself
            return f"unreachable: {type(exc).__name__}: {exc}"[:300]

    async def _database(self) -> str:
        def select_one() -> None:
            with self.database.connect() as connection:
                connection.execute(text("SELECT 1"))

        await asyncio.to_thread(select_one)
        return OK

    async def _redis_ping(self) -> str:
        if not self.redis_url:
            return "not configured"
        import redis.asyncio as aioredis

        # A connection per probe: what is checked is that a new client reaches Redis now.
        client = aioredis.Redis.from_url(self.redis_url, socket_connect_timeout=CHECK_TIMEOUT_S,
                                         socket_timeout=CHECK_TIMEOUT_S)
        try:
            await client.ping()
        finally:
            await client.aclose()
        return OK

    async def _models(self) -> dict[str, str]:
        counts, upstreams = await asyncio.gather(self.replica_counts(), self._upstreams())
        states: dict[str, str] = {}
        defaults = set()
        for model_type in sorted({m.type for m in self.catalog.models}):
            model = self.catalog.default_model(model_type)
            if model is None:
                continue
            defaults.add(model.id)
            states[f"model:{model.id}"] = self._model_state(self.router.deployments_of(model),
                                                            counts)
        for model in self.router.upstreams.models:
            part, state = f"model:{model.id}", upstreams.get(model.id)
            if state is None:  # its deployment is not run here, or did not say
                continue
            if state.get("online") is not False:
                states.setdefault(part, OK)
            elif states.get(part, OK) in PASSING:
                offline = upstream_offline(state)
                states[part] = offline if model.id in defaults else DEGRADED + offline
        return states

    async def _upstreams(self) -> dict[str, dict[str, Any]]:
        """The servers' states (serve_app/models/upstream_states.py), asked now; what was
        last heard when the asking takes too long (a busy replica must not make the whole
        models check time out)."""
        try:
            return await asyncio.wait_for(self.router.upstreams.current(), CHECK_TIMEOUT_S / 2)
        except TimeoutError:
            return self.router.upstreams.held()

    def _model_state(self, deployments: list[str],
                     counts: dict[tuple[str, str], Replicas] | None) -> str:
        handles = {d: self.router.deployment_handle(d) for d in deployments}
        if all(handle is None for handle in handles.values()):
            return NOT_RUN
        state = OK
        for deployment, handle in handles.items():
            if handle is None:
                return f"deployment {deployment!r} not run by this application"
            if counts is None:
                continue
            key = (getattr(handle, "app_name", ""), getattr(handle, "deployment_name",
                                                             deployment))
            replicas = counts.get(key, Replicas(0))
            if replicas.running >= 1:
                continue
            if not replicas.scaled_to_zero:
                return f"deployment {deployment!r} has no running replica"
            state = SCALED_TO_ZERO
        return state


class HealthRoutes:
    """`/health` and `/ready` as pure ASGI: no router, no dependency resolution per probe."""

    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"][len(scope.get("root_path", "")):] or scope["path"]
        if scope["method"] not in ("GET", "HEAD"):
            await error_response(ApiError(405, f"{path} answers GET only",
                                          code="INVALID_REQUEST",
                                          headers={"allow": "GET, HEAD"}))(scope, receive, send)
            return
        if path == HEALTH_PATH:
            await JSONResponse({"status": "ok"})(scope, receive, send)
            return
        checks = await self.readiness.checks()
        failing = [part for part, state in checks.items() if not passing(state)]
        if not failing:
            await JSONResponse({"status": "ready", "checks": checks})(scope, receive, send)
            return
        logger.warning("not ready: %s", {part: checks[part] for part in failing})
        await error_response(ApiError(
            503, "Not ready: " + "; ".join(f"{part}: {checks[part]}" for part in failing),
            code="NOT_READY", extra={"checks": checks}))(scope, receive, send)
