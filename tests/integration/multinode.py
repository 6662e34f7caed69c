"""Driver of the multi-node test, run as its own process (a process joins one Ray cluster, and
the test session's process is in the session's): deploys the platform on a two-node cluster
with PostgreSQL and Redis, checks where the replicas run and that requests through both nodes
are counted and charged in the shared stores, then kills the second node and measures how long
until every request succeeds again. Prints one JSON object.

    python -m tests.integration.multinode ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

CATALOG = Path(__file__).resolve().parent / "catalog.yaml"
ADMIN_KEY = "multinode-admin-key-0123456789"
REQUESTS = 12


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


def main(address: str, port: int, data_dir: str, database_url: str, redis_url: str) -> dict:
    import ray
    from ray import serve

    from serve_app.app import build_app

    ray.init(address=address, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    app = build_app({
        "settings": {"data_dir": data_dir, "database_url": database_url,
                     "redis_url": redis_url, "redis_prefix": "multinode",
                     "admin_api_key": ADMIN_KEY, "initial_credit_usd": 50,
                     "model_catalog": str(CATALOG)},
        "gateway_options": {"num_replicas": 2},
        "model_deployments": ["embedding", "speech"],
    })
    serve.run(app, name="inference", route_prefix="/", blocking=False)
    _wait_running(serve)
    placed = _replica_roles()

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


def _kill_second_node_and_wait(base: str, auth: dict[str, str]) -> dict[str, float]:
    """Kill the second node's raylet (and with it its replicas). Seconds until five requests
    in a row succeed again (`answering`), and until Serve has replaced every replica it lost
    (`replaced`); -1 when that did not happen within five minutes."""
    import psutil
    from ray import serve

    expected = {name: len(nodes) for name, nodes in _replica_nodes().items()}
    lost_node = next(n for n, role in _node_roles().items() if role == "worker")
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "raylet" and "second_node" in cmdline:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
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
