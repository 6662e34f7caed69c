"""Driver of the multi-node test, run as its own process (a process joins one Ray cluster, and
the test session's process is in the session's): deploys the platform on a two-node cluster
with PostgreSQL and Redis, checks where the replicas run and that requests through both nodes
are counted and charged in the shared stores, then kills the second node and measures how long
until every request succeeds again. Prints one JSON object. Its cluster helpers also serve
loadtest/faults.py.

    python -m tests.integration.multinode ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).resolve().parent / "catalog.yaml"
ADMIN_KEY = "multinode-admin-key-0123456789"
REQUESTS = 12


def cluster_env() -> dict[str, str]:
    """The environment of a plain Ray cluster: none of the test session's Serve settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_SERVE_", "RAY_ADDRESS"))}
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                # a dead node is noticed after 3 missed one-second health checks (Ray's
                # default: 5 of 3 s); cluster.yaml sets the same
                "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
                "PYTHONPATH": str(REPO), "TEST_MODEL_DIR": str(REPO / ".cache" / "models")})
    return env


def _ray_start(*args: str, env: dict[str, str]) -> None:
    subprocess.run([str(Path(sys.executable).parent / "ray"), "start", *args,
                    "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                   env=env, check=True, capture_output=True, timeout=120)


def start_two_nodes(base: int, temp_dir: str, env: dict[str, str]) -> str:
    """A head (`ray start --head`, GCS on `base`) and a second node that joins it, two CPUs,
    a resource and a role label each, ports from `base` to `base + 299`. Its address."""
    _ray_start("--head", f"--port={base}", "--num-cpus=2", '--resources={"head_node": 1}',
               "--labels=platform/role=head", "--include-dashboard=false",
               f"--temp-dir={temp_dir}", f"--ray-client-server-port={base + 1}",
               f"--dashboard-agent-listen-port={base + 2}",
               f"--min-worker-port={base + 100}", f"--max-worker-port={base + 199}", env=env)
    _ray_start(f"--address=127.0.0.1:{base}", "--num-cpus=2",
               '--resources={"second_node": 1}', "--labels=platform/role=worker",
               f"--dashboard-agent-listen-port={base + 3}",
               f"--min-worker-port={base + 200}", f"--max-worker-port={base + 299}", env=env)
    return f"127.0.0.1:{base}"


def kill_cluster(temp_dir: str) -> None:
    """Every process of this cluster (its command lines name its temp dir), and their
    children; any other Ray on the machine is left alone."""
    import psutil

    doomed = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(temp_dir in arg for arg in proc.info["cmdline"] or []):
                doomed += [proc, *proc.children(recursive=True)]
    for proc in doomed:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(doomed, timeout=10)


def _wait_running(serve, deadline_s: float = 600) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        status = serve.status().applications["inference"].status
        if status == "RUNNING":
            return
        if status in ("DEPLOY_FAILED", "UNHEALTHY"):
            raise RuntimeError(str(serve.status().applications["inference"]))
        time.sleep(1)
    raise TimeoutError("the application did not start")


def _node_roles() -> dict[str, str]:
    import ray

    return {n["NodeID"]: n.get("Labels", {}).get("platform/role", "?") for n in ray.nodes()}


def _replica_nodes() -> dict[str, list[str]]:
    """Deployment -> the node id of each of its live replicas."""
    from ray._private.state import actors  # the GCS actor table (the state API needs the
                                           # dashboard, which this cluster does not run)

    found: dict[str, list[str]] = {}
    for actor in actors(actor_state_name="ALIVE").values():
        name = actor.get("ActorClassName") or ""
        if name.startswith("ServeReplica:inference:"):
            node = actor.get("Address", {}).get("NodeID", "?")
            found.setdefault(name.rsplit(":", 1)[1], []).append(node)
    return found


def _replica_roles() -> dict[str, list[str]]:
    """Deployment -> the role label of the node of each of its live replicas."""
    roles = _node_roles()
    return {name: sorted(roles.get(n, "?") for n in nodes)
            for name, nodes in _replica_nodes().items()}


def deploy(address: str, port: int, data_dir: str, database_url: str, redis_url: str,
           deployments: tuple[str, ...] = ("embedding", "speech"),
           settings: dict | None = None) -> dict[str, list[str]]:
    """Join the cluster, deploy the platform (two Gateway replicas, the proxy on the head)
    and wait until it runs; where its replicas are (deployment -> node roles). `settings`:
    more of the platform's settings."""
    import ray
    from ray import serve

    from serve_app.app import build_app

    ray.init(address=address, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    app = build_app({
        "settings": {"data_dir": data_dir, "database_url": database_url,
                     "redis_url": redis_url, "redis_prefix": "multinode",
                     "admin_api_key": ADMIN_KEY, "initial_credit_usd": 50,
                     "model_catalog": str(CATALOG),
                     # both nodes run on this machine: one directory is their shared store
                     "result_store_url": f"{data_dir}/results", **(settings or {})},
        "gateway_options": {"num_replicas": 2},
        "model_deployments": list(deployments),
    })
    serve.run(app, name="inference", route_prefix="/", blocking=False)
    _wait_running(serve)
    return _replica_roles()


def main(address: str, port: int, data_dir: str, database_url: str, redis_url: str) -> dict:
    placed = deploy(address, port, data_dir, database_url, redis_url)

    base = f"http://127.0.0.1:{port}/api/v1"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    key = httpx.post(f"{base}/api_keys", headers=admin, timeout=30,
                     json={"apiKeyType": "INFERENCE", "description": "multinode"}
                     ).json()["data"]["apiKey"]
    auth = {"Authorization": f"Bearer {key}"}
    statuses = []
    for i in range(REQUESTS):
        resp = httpx.post(f"{base}/embeddings", headers=auth, timeout=60,
                          json={"model": "text-embedding-all-minilm-l6-v2",
                                "input": f"request {i}"})
        statuses.append(resp.status_code)
    limits = httpx.get(f"{base}/api_keys/rate_limits", headers=auth, timeout=30).json()
    history = httpx.get(f"{base}/billing/usage-history", headers=admin, timeout=30,
                        params={"pageSize": 100}).json()["data"]
    return {"placed": placed, "statuses": statuses, "ledger_rows": len(history),
            "limits": limits, "recovery_s": _kill_second_node_and_wait(base, auth)}


def kill_second_node() -> str:
    """Kill the second node's raylet and everything under it; the id of the node lost."""
    import psutil

    lost_node = next(n for n, role in _node_roles().items() if role == "worker")
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "raylet" and "second_node" in cmdline:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
    return lost_node


def _kill_second_node_and_wait(base: str, auth: dict[str, str]) -> dict[str, float]:
    """Kill the second node's raylet (and with it its replicas). Seconds until five requests
    in a row succeed again (`answering`), and until Serve has replaced every replica it lost
    (`replaced`); -1 when that did not happen within five minutes."""
    from ray import serve

    expected = {name: len(nodes) for name, nodes in _replica_nodes().items()}
    lost_node = kill_second_node()
    killed = time.monotonic()
    times = {"answering": -1.0, "replaced": -1.0}
    in_a_row = 0
    while time.monotonic() - killed < 300 and min(times.values()) < 0:
        try:
            resp = httpx.post(f"{base}/embeddings", headers=auth, timeout=10,
                              json={"model": "text-embedding-all-minilm-l6-v2",
                                    "input": "after the node died"})
            ok = resp.status_code == 200
        except httpx.HTTPError:
            ok = False
        in_a_row = in_a_row + 1 if ok else 0
        now = round(time.monotonic() - killed, 1)
        if in_a_row >= 5 and times["answering"] < 0:
            times["answering"] = now
        alive = {name: sum(n != lost_node for n in nodes)
                 for name, nodes in _replica_nodes().items()}
        if times["replaced"] < 0 and all(alive.get(name, 0) >= count
                                          for name, count in expected.items()) \
                and serve.status().applications["inference"].status == "RUNNING":
            times["replaced"] = now
        time.sleep(0.25)
    return times


if __name__ == "__main__":
    address, port, data_dir, database_url, redis_url = sys.argv[1:6]
    print(json.dumps(main(address, int(port), data_dir, database_url, redis_url)))
