"""One local Ray instance per test session, reached over HTTP, with two Serve applications:

* `inference`: the embedded default (SQLite, rate limits in the Ray actor) with the model
  deployments;
* `inference-pg`: a second gateway on PostgreSQL with rate limits in Redis (a redis-server of
  the session's own, so a test can restart it), using the first application's models. It runs
  when PostgreSQL and redis-server are available; its tests skip with the reason otherwise.

Serve runs as `make run` runs it: throughput-optimised, each Gateway replica on its own
direct-ingress port. Each application has two Gateway replicas, so tests can address each one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from deployments.registry import AUDIO_DEPLOYMENTS, IMAGE_DEPLOYMENTS, VIDEO_DEPLOYMENTS
from serve_app.process_tree import ray_processes, reap
from serve_app.request_id import SERVE_CALLBACK
from serve_app.wallets.x402 import dev_facilitator
from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema
from tests.integration.web_server import FakeWeb

ADMIN_KEY = "sk-integration-admin-key-000000000001"
REPO = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).resolve().parent / "catalog.yaml"
GATEWAY_REPLICAS = 2  # per application
PG_ROUTE = "/pg"  # the second application's route prefix: its API is under /pg/api/v1
PG_PREFIX = PG_ROUTE + "/api/v1"
SIWX_DOMAIN = "platform.test"
X402_PAY_TO = "0x00000000000000000000000000000000000A11CE"


def _free_port_run(count: int) -> int:
    """The first port of `count` consecutive free loopback ports."""
    for base in range(18000, 19000, 10):
        try:
            socks = []
            for port in range(base, base + count + 1):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            for s in socks:
                s.close()
            return base
        except OSError:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class RedisServer:
    """A redis-server of the test session (not the machine's), so a test may restart it."""

    def __init__(self) -> None:
        self.port = _free_port_run(1)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120  # a busy machine, Ray beside it
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@dataclass
class Platform:
    replica_urls: list[str]
    web: FakeWeb
    data_dir: Path
    pg_urls: list[str] = field(default_factory=list)
    pg_database_url: str | None = None
    pg_skip_reason: str | None = None
    redis: RedisServer | None = None
    admin_key: str = ADMIN_KEY
    clients: list[httpx.Client] = field(default_factory=list)
    metrics_url: str = ""  # Ray's metrics agent: every replica's metrics, for Prometheus

    @property
    def sqlite_url(self) -> str:
        return f"sqlite:///{self.data_dir / 'platform.db'}"

    def app_urls(self, app: str) -> list[str]:
        """The replica base URLs of `sqlite` (the default app) or `postgres`."""
        if app == "sqlite":
            return self.replica_urls
        if self.pg_skip_reason:
            pytest.skip(self.pg_skip_reason)
        return self.pg_urls

    def database_url(self, app: str) -> str:
        return self.sqlite_url if app == "sqlite" else str(self.pg_database_url)

    @property
    def base_url(self) -> str:
        return self.replica_urls[0]

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}


def _postgres_schema() -> tuple[str | None, str | None]:
    """(database URL of a fresh schema, None) or (None, why there is none)."""
    if _PG_REASON:
        return None, _PG_REASON
    if shutil.which("redis-server") is None:
        return None, "redis-server is not installed: the PostgreSQL/Redis application is off"
    return new_postgres_schema("it"), None


def _wait_running(serve, app: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = serve.status().applications[app].status
        if status == "RUNNING":
            return
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"application failed: {serve.status().applications[app]}")
        time.sleep(1)
    raise TimeoutError(f"{app} not running")


def _replicas_by_app(ports: range) -> tuple[list[str], list[str]]:
    """Which direct-ingress port serves which application (they differ in route prefix)."""
    default, pg = [], []
    for port in ports:
        for prefix, found in (("/api/v1", default), (PG_PREFIX, pg)):
            url = f"http://127.0.0.1:{port}{prefix}"
            try:
                if httpx.get(f"{url}/models", timeout=60).status_code == 200:
                    found.append(url)
            except httpx.HTTPError:
                pass
    return default, pg


@pytest.fixture(scope="session")
def platform(tmp_path_factory) -> Iterator[Platform]:
    pg_url, pg_reason = _postgres_schema()
    replicas = GATEWAY_REPLICAS * (1 if pg_reason else 2)
    # Gateway replicas' direct-ingress ports, Serve's proxy, then Ray's metrics agent.
    base = _free_port_run(replicas + 2)
    metrics_port = base + replicas + 1
    os.environ.update({
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(base),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(base + replicas),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        # As `make run` sets it (serve_app/launch.py): Serve drops an unusable X-Request-ID.
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": SERVE_CALLBACK,
    })
    import ray
    from ray import serve

    from serve_app.app import build_app

    data_dir = tmp_path_factory.mktemp("platform-data")
    # Built model folders outlive the session: the tiny model takes seconds, SmolLM2 ~40 s.
    os.environ.setdefault("TEST_MODEL_DIR", str(REPO / ".cache" / "models"))
    web = FakeWeb()
    # Wallet access: the development facilitator as its own HTTP server, and one domain that
    # sign-ins name whichever replica they reach.
    facilitator_url, stop_facilitator = dev_facilitator.start_in_thread()
    # Logical CPUs for placement only (the machine has 2 cores): two applications of two
    # Gateway replicas each (1), three text replicas (1.5), the embedding, image, audio and
    # video replicas (2) need 4.5.
    ray.init(num_cpus=5, include_dashboard=False, log_to_driver=False,
             _metrics_export_port=metrics_port)
    serve.start(http_options={"host": "127.0.0.1", "port": base + replicas})
    app = build_app({
        "settings": {"data_dir": str(data_dir), "admin_api_key": ADMIN_KEY,
                     "initial_credit_usd": 100, "model_catalog": str(CATALOG),
                     "web_search_url": f"{web.base}/search",
                     "web_fetch_allowed_hosts": f"127.0.0.1:{web.port}",
                     "siwx_domains": SIWX_DOMAIN, "x402_facilitator_url": facilitator_url,
                     "x402_pay_to_evm": X402_PAY_TO},
        "gateway_options": {"num_replicas": GATEWAY_REPLICAS},
        # text-m stays down: its model tests fallbacks and MODEL_OFFLINE. text-l: tiny-vl.
        "model_deployments": ["text-xs", "text-s", "text-l", "embedding", *IMAGE_DEPLOYMENTS,
                              *AUDIO_DEPLOYMENTS, *VIDEO_DEPLOYMENTS],
    })
    serve.run(app, name="inference", route_prefix="/", blocking=False)
    # Serve answers before the model replicas are up: wait until they are.
    _wait_running(serve, "inference")
    redis = None
    if pg_url:
        redis = RedisServer()
        pg_app = build_app({
            "settings": {"data_dir": str(tmp_path_factory.mktemp("pg-data")),
                         "database_url": pg_url, "admin_api_key": ADMIN_KEY,
                         "initial_credit_usd": 100, "model_catalog": str(CATALOG),
                         "redis_url": redis.url, "redis_prefix": f"it-{uuid.uuid4().hex[:6]}"},
            "gateway_options": {"num_replicas": GATEWAY_REPLICAS},
            "model_deployments": ["text-xs", "text-s", "text-l", "embedding",
                                  *IMAGE_DEPLOYMENTS, *AUDIO_DEPLOYMENTS, *VIDEO_DEPLOYMENTS],
            "model_app": "inference",
        })
        serve.run(pg_app, name="inference-pg", route_prefix=PG_ROUTE, blocking=False)
        _wait_running(serve, "inference-pg")
    urls, pg_urls = _replicas_by_app(range(base, base + replicas))
    assert len(urls) == GATEWAY_REPLICAS, urls
    assert len(pg_urls) == (GATEWAY_REPLICAS if pg_url else 0), pg_urls
    try:
        yield Platform(replica_urls=urls, web=web, data_dir=data_dir, pg_urls=pg_urls,
                       pg_database_url=pg_url, pg_skip_reason=pg_reason, redis=redis,
                       metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        web.close()
        stop_facilitator()
        if redis is not None:
            redis.stop()
        if pg_url:
            drop_postgres_schema(pg_url)
        # serve.shutdown() costs seconds and ray.shutdown() ends Serve with the cluster; the
        # engine processes vLLM spawned are reaped after it.
        tree = ray_processes()
        ray.shutdown()
        reap(tree)


@pytest.fixture(scope="session")
def inference_key(platform: Platform) -> str:
    resp = httpx.post(f"{platform.base_url}/api_keys", headers=platform.auth(),
                      json={"apiKeyType": "INFERENCE", "description": "integration tests"})
    resp.raise_for_status()
    return resp.json()["data"]["apiKey"]


@pytest.fixture(scope="session")
def client(platform: Platform, inference_key: str):
    """The `openai` SDK pointed at the platform, as a user would point it."""
    from openai import OpenAI

    return OpenAI(base_url=platform.base_url, api_key=inference_key, max_retries=0, timeout=120)
