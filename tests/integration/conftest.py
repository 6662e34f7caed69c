"""One local Ray instance and one Serve application per test session, reached over HTTP.

Serve runs as `make run` runs it: throughput-optimised, each Gateway replica on its own
direct-ingress port. Two Gateway replicas get two ports, so tests can address each one.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from serve_app.process_tree import ray_processes, reap
from tests.integration.web_server import FakeWeb

ADMIN_KEY = "sk-integration-admin-key-000000000001"
REPO = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).resolve().parent / "catalog.yaml"
GATEWAY_REPLICAS = 2


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


@dataclass
class Platform:
    replica_urls: list[str]
    web: FakeWeb
    admin_key: str = ADMIN_KEY
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.replica_urls[0]

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}


def _wait_for(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready: {last}")


@pytest.fixture(scope="session")
def platform(tmp_path_factory) -> Iterator[Platform]:
    base = _free_port_run(GATEWAY_REPLICAS + 1)
    os.environ.update({
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(base),
        "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(base + GATEWAY_REPLICAS),
        "RAY_SERVE_PORT_QUARANTINE_S": "0",
        "RAY_SERVE_DEFAULT_HTTP_HOST": "127.0.0.1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    })
    import ray
    from ray import serve

    from serve_app.app import build_app

    data_dir = tmp_path_factory.mktemp("platform-data")
    # Built model folders outlive the session: the tiny model takes seconds, SmolLM2 ~40 s.
    os.environ.setdefault("TEST_MODEL_DIR", str(REPO / ".cache" / "models"))
    web = FakeWeb()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": base + GATEWAY_REPLICAS})
    app = build_app({
        "settings": {"data_dir": str(data_dir), "admin_api_key": ADMIN_KEY,
                     "initial_credit_usd": 100, "model_catalog": str(CATALOG),
                     "web_search_url": f"{web.base}/search",
                     "web_fetch_allowed_hosts": f"127.0.0.1:{web.port}"},
        "gateway_options": {"num_replicas": GATEWAY_REPLICAS},
        # text-m stays down: its model tests fallbacks and MODEL_OFFLINE.
        "model_deployments": ["text-xs", "text-s", "embedding"],
    })
    serve.run(app, name="inference", route_prefix="/api/v1", blocking=False)
    urls = [f"http://127.0.0.1:{base + i}/api/v1" for i in range(GATEWAY_REPLICAS)]
    for url in urls:
        _wait_for(f"{url}/models")
    # Serve answers before the model replicas are up: wait until they are.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = serve.status().applications["inference"].status
        if status == "RUNNING":
            break
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(f"application failed: {serve.status().applications['inference']}")
        time.sleep(1)
    try:
        yield Platform(replica_urls=urls, web=web)
    finally:
        web.close()
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
