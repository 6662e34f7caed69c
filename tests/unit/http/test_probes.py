"""`GET /health` and `GET /ready` at the site's root: the probes of Kubernetes and the image."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.api.health import NOT_RUN, SCALED_TO_ZERO, Readiness, Replicas
from serve_app.settings import Settings
from tests.fakes import DeploymentHandle
from tests.unit.conftest import Gateway, make_gateway

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis_unavailable() -> str | None:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
        return None
    except Exception as exc:  # any failure means: skip with the reason
        return f"Redis not reachable at {REDIS_URL}: {exc}"


def _gateway_with_redis(tmp_path: Path, gateway_catalog: Path,
                        fakes: dict[str, DeploymentHandle], redis_url: str
                        ) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, model_catalog=gateway_catalog,
                                     redis_url=redis_url, rate_limit_backend="local"),
                            handles=fakes)


def test_health_answers_without_a_key(gateway):
    resp = gateway.client.get("/health")
    assert resp.status_code == 200
    assert resp.json() == {"status": "ok"}
    assert resp.headers["cf-ray"]


def test_ready_when_the_database_answers_and_the_default_models_run(fake_gateway):
    resp = fake_gateway.client.get("/ready")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["model:smollm2-135m-instruct"] == "ok"
    assert "redis" not in body["checks"]  # none configured


def test_a_default_model_this_application_does_not_run_is_not_a_failure(gateway):
    resp = gateway.client.get("/ready")  # this gateway runs no model deployment
    assert resp.status_code == 200, resp.text
    assert resp.json()["checks"]["model:smollm2-135m-instruct"] == NOT_RUN


async def test_not_ready_names_a_default_model_with_no_running_replica(fake_gateway):
    """Under Serve the controller tells each deployment's running replicas; here it reports
    none for the chat model's deployment, as while its replica starts or after it died."""
    services = fake_gateway.services
    chat = services.catalog.by_id["smollm2-135m-instruct"]

    async def no_chat_replica() -> dict[tuple[str, str], Replicas]:
        return _replicas(services, {chat.deployment: Replicas(0)})

    checks = await Readiness(services.engine, None, services.catalog, services.router,
                             replica_counts=no_chat_replica).checks()
    assert checks["database"] == "ok"
    assert checks["model:smollm2-135m-instruct"] == (
        f"deployment {chat.deployment!r} has no running replica")
    assert checks["model:text-embedding-all-minilm-l6-v2"] == "ok"


async def test_a_default_model_scaled_to_zero_on_purpose_is_ready(fake_gateway):
    """The media classes scale to zero when idle (production.yaml): Serve reports such a
    deployment at its target with no replica, and its first request starts one, so a cluster
    at rest stays in its Service instead of leaving it after every idle period."""
    services = fake_gateway.services
    chat = services.catalog.by_id["smollm2-135m-instruct"]

    async def chat_scaled_to_zero() -> dict[tuple[str, str], Replicas]:
        return _replicas(services, {chat.deployment: Replicas(0, scaled_to_zero=True)})

    readiness = Readiness(services.engine, None, services.catalog, services.router,
                          replica_counts=chat_scaled_to_zero)
    checks = await readiness.checks()
    assert checks["model:smollm2-135m-instruct"] == SCALED_TO_ZERO
    assert all(state in ("ok", NOT_RUN, SCALED_TO_ZERO) for state in checks.values()), checks


def _replicas(services, overrides: dict[str, Replicas]) -> dict[tuple[str, str], Replicas]:
    """One running replica for every deployment of the catalog, but those overridden."""
    names = {m.deployment for m in services.catalog.models}
    return {(getattr(handle, "app_name", ""), getattr(handle, "deployment_name", name)):
            overrides.get(name, Replicas(1))
            for name in names
            if (handle := services.router.deployment_handle(name)) is not None}


def test_not_ready_names_redis_when_it_is_down(tmp_path, gateway_catalog, fakes):
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    for gw in _gateway_with_redis(tmp_path, gateway_catalog, fakes, url):
        resp = gw.client.get("/ready")
        assert resp.status_code == 503
        body = resp.json()
        assert body["code"] == "NOT_READY"
        assert body["error"].startswith("Not ready: redis: ")
        assert body["checks"]["database"] == "ok"
        assert body["checks"]["redis"] != "ok"
        assert body["checks"]["model:smollm2-135m-instruct"] == "ok"


def test_ready_with_redis_reachable(tmp_path, gateway_catalog, fakes):
    reason = _redis_unavailable()
    if reason:
        pytest.skip(reason)
    for gw in _gateway_with_redis(tmp_path, gateway_catalog, fakes, REDIS_URL):
        resp = gw.client.get("/ready")
        assert resp.status_code == 200, resp.text
        assert resp.json()["checks"]["redis"] == "ok"


def test_probes_answer_get_only(gateway):
    resp = gateway.client.post("/health")
    assert resp.status_code == 405
    assert resp.json()["code"] == "INVALID_REQUEST"
    assert resp.headers["allow"] == "GET, HEAD"


def test_the_api_keeps_its_prefix(gateway):
    """The probes live at the root only; the API's own paths stay under /api/v1."""
    assert gateway.client.get("/api/v1/health").status_code == 404
    assert gateway.client.get("/healthz").status_code == 404
