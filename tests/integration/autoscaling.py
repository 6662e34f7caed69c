"""Driver of the autoscaling test, run as its own process like multinode.py: deploys the
platform on the two-node cluster from a Serve config (the way configs/production.yaml is
deployed) with the Gateway and the embedding deployment autoscaling between 1 and
MAX_REPLICAS replicas and the matting deployment between 0 and 1, all on short metric windows
and delays. Clients send embeddings requests without pause until both have scaled up (or
LOAD_DEADLINE_S), then stop; the replicas are watched falling back to one. Then one
background removal goes to the matting deployment scaled to zero: it waits for the cold start
and is answered, and the deployment goes back to zero. Last, one upscale goes to the upscaling
deployment, scaled to zero and asking for a resource no node has: its replica cannot start,
and the request is answered 503 with Retry-After after COLD_START_WAIT_S, charged nothing.
Every answer is recorded and the ledger reconciled with them (loadtest/reconcile.py). Prints
one JSON object: the replica timeline, the phases' seconds, the answers by status and the
reconciliation.

    python -m tests.integration.autoscaling ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.integration.multinode import ADMIN_KEY, CATALOG, _wait_running

MODEL = "text-embedding-all-minilm-l6-v2"
CLIENTS = 8
MAX_REPLICAS = 2
WATCHED = ("Gateway", "embedding", "image-matting")
COLD_START_WAIT_S = 20.0  # the Gateway's bound on a cold start (production: 120 s)
LOAD_DEADLINE_S = 150.0  # load stops once both have scaled up, or after this long
SETTLE_DEADLINE_S = 180.0  # for each wait for a replica count after the load
# Short windows so that a scale decision follows the load within seconds: the handles push
# their counts every half second, the autoscaler averages the last 2 s and acts after the
# delays (production keeps Serve's defaults: 10 s pushes, 30 s window, 30 s up, 600 s down).
FAST = {"metrics_interval_s": 0.5, "look_back_period_s": 2.0, "upscale_delay_s": 1.0,
        "downscale_delay_s": 5.0, "downscale_to_zero_delay_s": 5.0}
WORDS = ["river", "stone", "lantern", "orchard", "harbor", "meadow", "copper", "violet"]


def serve_config(data_dir: str, database_url: str, redis_url: str) -> dict[str, Any]:
    """The application as a Serve config; its `deployments:` carry the autoscaling."""
    return {"applications": [{
        "name": "inference", "route_prefix": "/", "import_path": "serve_app.app:build_app",
        "args": {"settings": {"data_dir": data_dir, "database_url": database_url,
                              "redis_url": redis_url, "redis_prefix": "autoscaling",
                              "admin_api_key": ADMIN_KEY, "initial_credit_usd": 50,
                              "model_catalog": str(CATALOG),
                              # both nodes run on this machine: one directory is shared
                              "result_store_url": f"{data_dir}/results",
                              "cold_start_wait_s": COLD_START_WAIT_S},
                 "model_deployments": ["embedding", "image-matting", "image-upscale"]},
        "deployments": [
            # the HTTP requests a Gateway replica holds (counted by the proxy's handle)
            {"name": "Gateway", "autoscaling_config": {
                "min_replicas": 1, "max_replicas": MAX_REPLICAS,
                "target_ongoing_requests": 2, **FAST}},
            # the embedding calls in flight: each Gateway replica keeps one or two, each
            # carrying every request that queued meanwhile
            {"name": "embedding", "autoscaling_config": {
                "min_replicas": 1, "max_replicas": MAX_REPLICAS,
                "target_ongoing_requests": 0.5, **FAST}},
            {"name": "image-matting", "autoscaling_config": {
                "min_replicas": 0, "max_replicas": 1, "target_ongoing_requests": 1, **FAST}},
            # a replica that cannot be placed: a cold start that never ends
            {"name": "image-upscale", "ray_actor_options": {
                "num_cpus": 0.25, "resources": {"absent_node": 1}}, "autoscaling_config": {
                "min_replicas": 0, "max_replicas": 1, "target_ongoing_requests": 1, **FAST}},
        ]}]}


def deploy(address: str, port: int, config: dict[str, Any]) -> None:
    """Join the cluster, start Serve (the proxy on the head) and apply `config` as
    `serve deploy` does; wait until the application runs."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    ray.init(address=address, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config))
    _wait_running(serve)


def running_replicas() -> dict[str, int]:
    """Deployment -> its RUNNING replicas, as Serve reports them."""
    from ray import serve

    app = serve.status().applications["inference"]
    return {name: app.deployments[name].replica_states.get("RUNNING", 0)
            for name in WATCHED if name in app.deployments}


class Timeline:
    """Samples the replica counts every half second from a thread; keeps the changes."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.phase = "idle"
        self.changes: list[dict[str, Any]] = []
        self.now: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Timeline:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def mark(self, phase: str) -> float:
        self.phase = phase
        self.changes.append({"t": self.t(), "phase": phase, **self.now})
        return self.t()

    def t(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def wait_for(self, test, deadline_s: float) -> float:
        """Seconds from the call until `test(counts)` held; -1 past the deadline."""
        began = time.monotonic()
        while time.monotonic() - began < deadline_s:
            if self.now and test(self.now):
                return round(time.monotonic() - began, 1)
            time.sleep(0.25)
        return -1.0

    def _sample(self) -> None:
        counts = running_replicas()
        if counts != self.now:
            self.now = counts
            self.changes.append({"t": self.t(), "phase": self.phase, **counts})

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._sample()
            except Exception as exc:  # a slow controller: the next sample tries again
                print(f"[autoscaling] sample failed: {exc}", file=sys.stderr)


class Load:
    """CLIENTS threads sending embeddings requests back to back, each answer recorded in the
    format of loadtest/reconcile.py."""

    def __init__(self, base: str, key: str) -> None:
        self.base, self.auth = base, {"Authorization": f"Bearer {key}"}
        self.answers: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(CLIENTS)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def finish(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)

    def add(self, answer: dict[str, Any]) -> None:
        with self._lock:
            self.answers.append(answer)

    def _client(self, i: int) -> None:
        with httpx.Client(timeout=60) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                text = " ".join(WORDS[(i + n + k) % len(WORDS)] for k in range(3 + n % 20))
                self.add(send(client, f"{self.base}/embeddings", self.auth, "embeddings",
                              {"model": MODEL, "input": text}))


def send(client: httpx.Client, url: str, auth: dict[str, str], route: str,
         body: dict[str, Any]) -> dict[str, Any]:
    """One request; what its client saw (status 0: no answer, the connection failed)."""
    answer: dict[str, Any] = {"route": route, "cf_ray": None, "usage": {}, "sent": time.time()}
    try:
        resp = client.post(url, headers=auth, json=body)
        answer.update(status=resp.status_code, cf_ray=resp.headers.get("CF-RAY"))
        body = resp.json() if resp.headers.get("content-type", "").startswith(
            "application/json") else {}
        if resp.status_code == 200:
            answer["usage"] = body.get("usage") or {}
        else:
            answer.update(code=body.get("code"), retry_after=resp.headers.get("Retry-After"))
    except httpx.HTTPError as exc:
        answer.update(status=0, code=type(exc).__name__)
    answer["t"] = time.time()
    return answer


def logged(text: str) -> int:
    """Log lines of this cluster's processes (every node's, on this machine) with `text`."""
    import ray

    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    found = 0
    for path in logs.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".err", ".out"):
            with path.open(encoding="utf-8", errors="replace") as lines:
                found += sum(text in line for line in lines)
    return found


def _png(side: int = 256) -> str:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (side, side), (90, 110, 130))
    ImageDraw.Draw(image).ellipse((side // 4, side // 4, 3 * side // 4, 3 * side // 4),
                                  fill=(200, 30, 30))
    out = io.BytesIO()
    image.save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def _account(base: str, database_url: str, data_dir: str) -> tuple[str, str, int]:
    """An account on the benchmark tier (the catalog's 100 requests a minute would stop the
    load): its id, an inference key, its starting balance in nanos."""
    from serve_app.cli import run as cli
    from serve_app.settings import Settings

    settings = Settings(database_url=database_url, data_dir=Path(data_dir))
    made = cli(["create-account", "--usd", "1000"], settings=settings)
    cli(["set-tier", "benchmark", "--account", made["accountId"]], settings=settings)
    admin = {"Authorization": f"Bearer {made['apiKey']}"}
    resp = httpx.post(f"{base}/api_keys", headers=admin, timeout=30,
                      json={"apiKeyType": "INFERENCE", "description": "autoscaling"})
    resp.raise_for_status()
    balance = httpx.get(f"{base}/billing/balance", headers=admin, timeout=30).json()
    start = round((float(balance["balances"]["usd"])
                   + float(balance["balances"]["diem"] or 0)) * 1e9)
    return made["accountId"], resp.json()["data"]["apiKey"], start


def main(address: str, port: int, data_dir: str, database_url: str, redis_url: str) -> dict:
    deploy(address, port, serve_config(data_dir, database_url, redis_url))
    base = f"http://127.0.0.1:{port}/api/v1"
    account_id, key, start_nanos = _account(base, database_url, data_dir)
    timeline = Timeline().start()
    seconds: dict[str, float] = {}
    load = Load(base, key)
    try:
        load_began = timeline.mark("load")
        load.start()
        seconds["scaled_up"] = timeline.wait_for(
            lambda c: c["Gateway"] > 1 and c["embedding"] > 1, LOAD_DEADLINE_S)
        time.sleep(5)  # the new replicas serve a while before the load ends
        load.finish()
        seconds["load"] = round(timeline.mark("after") - load_began, 1)
        seconds["back_to_min"] = timeline.wait_for(
            lambda c: c["Gateway"] == 1 and c["embedding"] == 1, SETTLE_DEADLINE_S)
        seconds["matting_at_zero"] = timeline.wait_for(
            lambda c: c["image-matting"] == 0, SETTLE_DEADLINE_S)
        timeline.mark("cold start")
        began = time.monotonic()
        with httpx.Client(timeout=300) as client:
            load.add(send(client, f"{base}/image/background-remove",
                          {"Authorization": f"Bearer {key}"}, "background-remove",
                          {"image": _png()}))
        seconds["cold_start_answer"] = round(time.monotonic() - began, 1)
        # its replica stays downscale_to_zero_delay_s after the answer: seen running, then gone
        seconds["matting_seen_running"] = timeline.wait_for(
            lambda c: c["image-matting"] == 1, SETTLE_DEADLINE_S)
        seconds["matting_back_to_zero"] = timeline.wait_for(
            lambda c: c["image-matting"] == 0, SETTLE_DEADLINE_S)
        timeline.mark("cold start that never ends")
        began = time.monotonic()
        with httpx.Client(timeout=300) as client:
            load.add(send(client, f"{base}/image/upscale", {"Authorization": f"Bearer {key}"},
                          "upscale", {"image": _png(), "scale": 2}))
        seconds["cold_start_refused"] = round(time.monotonic() - began, 1)
        # the Gateway read the replica count before refusing (a failed read is logged)
        failed_reads = logged("reading the replicas of")
        refusals_logged = logged("withdrawn: no replica took it")
        timeline.mark("end")
    finally:
        timeline.stop()
        load.finish()

    record = Path(data_dir) / "record.jsonl"
    record.write_text("".join(json.dumps(a) + "\n" for a in load.answers))
    os.environ["DATABASE_URL"] = database_url
    from loadtest.reconcile import reconcile

    embeddings = [a for a in load.answers if a["route"] == "embeddings"]
    peak = {name: max(c.get(name, 0) for c in timeline.changes) for name in WATCHED}
    return {
        "clients": CLIENTS, "max_replicas": MAX_REPLICAS, "autoscaling": FAST,
        "timeline": timeline.changes, "seconds": seconds, "peak": peak,
        "final": timeline.now,
        "statuses": dict(Counter(f"{a['status']} {a.get('code') or ''}".strip()
                                 for a in embeddings)),
        "capacity_without_retry_after": sum(
            a["status"] == 503 and not a.get("retry_after") for a in embeddings),
        "prompt_tokens": sum(a["usage"].get("prompt_tokens", 0) for a in embeddings),
        "cold_start_wait_s": COLD_START_WAIT_S,
        "cold_start": next(a for a in load.answers if a["route"] == "background-remove"),
        "cold_start_refused": next(a for a in load.answers if a["route"] == "upscale"),
        "replica_count_read_failures": failed_reads, "refusals_logged": refusals_logged,
        "reconciliation": reconcile(account_id, str(record), start_nanos),
    }


if __name__ == "__main__":
    address, port, data_dir, database_url, redis_url = sys.argv[1:6]
    print(json.dumps(main(address, int(port), data_dir, database_url, redis_url)))
