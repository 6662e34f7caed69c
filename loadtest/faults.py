"""Faults under load, scripted and repeatable: the platform on two Ray nodes with PostgreSQL
and Redis, clients sending charged requests without pause, and one fault after another:

1. restart Redis (its process killed, started again on the same port after `--down-s`);
2. restart PostgreSQL (the machine's cluster, `pg_ctlcluster ... stop -m fast`, then start);
3. kill a model replica (the embedding deployment's only one);
4. kill a Gateway replica (of two);
5. kill the second Ray node (its raylet and everything under it).

For each fault: how long the component was down, how long until requests succeeded again
(from the fault, and from the component's return), and the answers by status while it lasted.
At the end the ledger is reconciled with what the clients saw (reconcile.py): no entry lost
or doubled, no hold left open, no key past its consumption limit.

    .venv/bin/python loadtest/faults.py [--clients 6] [--quiet-s 40] [--down-s 5]

It needs the machine's PostgreSQL (it restarts it: don't run it beside the test suite) and
redis-server; it starts its own Ray cluster on free ports and leaves none of it behind.
Results: `loadtest/results/faults-<time>/` (record.jsonl, summary.json, summary.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from loadtest.reconcile import audit_books, reconcile  # noqa: E402
from serve_app.billing.service import (  # noqa: E402
    HEARTBEAT_S,
    HOLDER_TIMEOUT,
    SWEEP_INTERVAL_S,
)
from serve_app.cli import run as cli  # noqa: E402
from serve_app.limits.redis_backend import RETRY_AFTER_S as REDIS_RETRY_S  # noqa: E402
from serve_app.settings import Settings  # noqa: E402
from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema  # noqa: E402
from tests.integration.conftest import RedisServer, _free_port_run  # noqa: E402
from tests.integration.multinode import (  # noqa: E402
    cluster_env,
    deploy,
    kill_cluster,
    kill_second_node,
    start_two_nodes,
)

MODEL = "text-embedding-all-minilm-l6-v2"
WORDS = ["river", "stone", "lantern", "orchard", "harbor", "meadow", "copper", "violet"]
RATE_LIMIT = 100  # the embedding model's requests a minute per key (tests/integration/catalog)
RECOVERED_AFTER = 5  # successes in a row (across clients) that count as "answering again"


class Load:
    """Client threads sending embeddings requests back to back; every answer is recorded
    (one JSON line, the format reconcile.py reads)."""

    def __init__(self, base: str, keys: list[str], record: Path) -> None:
        self.base, self.keys = base, keys
        self.stop = threading.Event()
        self.answers: list[dict] = []
        self._lock = threading.Lock()
        self._record = record.open("a", encoding="utf-8")
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(len(keys))]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        self._record.close()

    def _client(self, i: int) -> None:
        auth = {"Authorization": f"Bearer {self.keys[i]}"}
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                sent = time.time()
                text = " ".join(random.choices(WORDS, k=random.randint(3, 30)))
                answer = {"route": "embeddings", "client": i, "sent": sent, "cf_ray": None,
                          "usage": {}}
                try:
                    resp = client.post(f"{self.base}/embeddings", headers=auth,
                                       json={"model": MODEL, "input": text})
                    answer.update(status=resp.status_code, cf_ray=resp.headers.get("CF-RAY"),
                                  window=resp.headers.get("x-ratelimit-reset-requests"))
                    body = resp.json() if resp.headers.get("content-type", "").startswith(
                        "application/json") else {}
                    if resp.status_code == 200:
                        answer["usage"] = body.get("usage") or {}
                    else:
                        answer["code"] = body.get("code") if isinstance(body, dict) else None
                except httpx.HTTPError as exc:
                    answer.update(status=0, code=type(exc).__name__)
                    time.sleep(0.2)
                answer["t"] = time.time()
                with self._lock:
                    self.answers.append(answer)
                    self._record.write(json.dumps(answer) + "\n")
                    self._record.flush()


def _pg_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", *action.split()],
                   check=True, capture_output=True, timeout=120)


def _kill_replica(deployment: str) -> str:
    """Kill one replica actor of `deployment` (without restart: Serve must replace it)."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith("SERVE_REPLICA::") and f"#{deployment}#" in a["name"]]
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    return names[0]


def run_faults(redis: RedisServer, down_s: float) -> list[tuple[str, callable]]:
    def restart_redis() -> float:
        redis.stop()
        time.sleep(down_s)
        redis.start()
        return down_s

    def restart_postgres() -> float:
        stopped = time.time()
        _pg_cluster("stop -m fast")
        time.sleep(down_s)
        _pg_cluster("start")
        return round(time.time() - stopped, 1)

    def kill_model_replica() -> float:
        _kill_replica("embedding")
        return 0.0

    def kill_gateway_replica() -> float:
        _kill_replica("Gateway")
        return 0.0

    def kill_node() -> float:
        kill_second_node()
        return 0.0

    return [("restart Redis", restart_redis), ("restart PostgreSQL", restart_postgres),
            ("kill a model replica", kill_model_replica),
            ("kill a Gateway replica", kill_gateway_replica),
            ("kill the second Ray node", kill_node)]


def window_summary(answers: list[dict], start: float, back: float, end: float) -> dict:
    """Answers that arrived between the fault and the next one: by status, and when requests
    were answered again (RECOVERED_AFTER in a row without a 5xx or a broken connection)."""
    seen = sorted((a for a in answers if start <= a["t"] < end), key=lambda a: a["t"])
    statuses = Counter(f"{a['status']} {a.get('code') or ''}".strip() for a in seen)
    recovered_at, in_a_row, last_failure = None, 0, None
    for a in seen:
        if 0 < a["status"] < 500:  # answered (a 402 of the limited key is an answer too)
            in_a_row += 1
            if in_a_row == RECOVERED_AFTER and recovered_at is None and last_failure:
                recovered_at = a["t"]
        else:
            in_a_row, recovered_at, last_failure = 0, None, a["t"]
    if last_failure is None:  # nothing failed: the clients never noticed
        recovery = {"answering_s": 0.0, "answering_after_back_s": 0.0}
    elif recovered_at is None:
        recovery = {"answering_s": -1.0, "answering_after_back_s": -1.0}
    else:
        recovery = {"answering_s": round(recovered_at - start, 1),
                    "answering_after_back_s": round(max(0.0, recovered_at - back), 1)}
    server_errors = sum(n for s, n in statuses.items() if s.startswith("5"))
    return {"answers": len(seen), "statuses": dict(statuses), "server_errors": server_errors,
            **recovery}


def rate_windows(answers: list[dict], client: int, down: float, back: float) -> dict:
    """Requests a rate-limited key got admitted per one-minute window, as the limiter counted
    them: answers of one window carry the same reset time (`x-ratelimit-reset-requests`).
    Apart: those admitted while Redis was down, when each replica counted on its own (until
    REDIS_RETRY_S after its return)."""
    fallback_ends = back + REDIS_RETRY_S
    per_window: Counter = Counter()
    during = 0
    for a in answers:
        if a["client"] != client or a["status"] != 200:
            continue
        if down <= a["sent"] < fallback_ends:
            during += 1
        else:
            per_window[a["window"]] += 1
    return {"limit": RATE_LIMIT, "windows": len(per_window),
            "max_in_a_window": max(per_window.values(), default=0),
            "admitted_while_counting_per_replica": during}


def markdown(summary: dict) -> str:
    out = [f"{summary['clients']} clients sending embeddings without pause; "
           f"{summary['quiet_s']} s between faults.", "",
           "| fault | down s | answering again after s (from the fault / from its return) "
           "| answers | by status |", "|---|---|---|---|---|"]
    for fault in summary["faults"]:
        out.append(f"| {fault['fault']} | {fault['down_s']} | {fault['answering_s']} / "
                   f"{fault['answering_after_back_s']} | {fault['answers']} | "
                   f"{json.dumps(fault['statuses'])} |")
    limits = summary["rate_limit"]
    out += ["", f"Rate-limited key ({limits['limit']} requests a minute): at most "
            f"{limits['max_in_a_window']} admitted in any of its {limits['windows']} windows "
            f"counted in Redis; {limits['admitted_while_counting_per_replica']} admitted while "
            "Redis was down (each Gateway replica counting on its own).",
            "", f"Answers lost with a killed Gateway replica (Serve's 500, no request id): "
            f"{summary['lost_answers']}",
            "", "Reconciliation: " + json.dumps(summary["reconciliation"]),
            "", "Audit (every account's balance is its journal's sum less its holds): "
            + json.dumps(summary["audit"])]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--quiet-s", type=float, default=40.0,
                        help="seconds of load before the first fault and after each")
    parser.add_argument("--down-s", type=float, default=5.0,
                        help="how long Redis and PostgreSQL stay down")
    args = parser.parse_args()
    if _PG_REASON or shutil.which("redis-server") is None or not Path("/etc/postgresql").exists():
        print(f"needs the machine's PostgreSQL and redis-server ({_PG_REASON or 'missing'})")
        return 2
    out = HERE / "results" / datetime.now(UTC).strftime("faults-%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    base_port = _free_port_run(8) + 10_000
    temp_dir = tempfile.mkdtemp(prefix="/tmp/rayft-")
    pg_url = new_postgres_schema("faults")
    redis = RedisServer()
    env = cluster_env()
    try:
        address = start_two_nodes(base_port, temp_dir, env)
        os.environ.update(env)
        print(f"[faults] deploying on {address} ...", flush=True)
        placed = deploy(address, base_port + 4, str(out / "data"), pg_url, redis.url,
                        deployments=("embedding",))
        print(f"[faults] replicas: {placed}", flush=True)
        base = f"http://127.0.0.1:{base_port + 4}/api/v1"
        settings = Settings(database_url=pg_url, data_dir=out / "data")
        made = cli(["create-account", "--usd", "1000"], settings=settings)
        cli(["set-tier", "benchmark", "--account", made["accountId"]], settings=settings)
        admin = {"Authorization": f"Bearer {made['apiKey']}"}
        keys = []
        for i in range(args.clients):
            body = {"apiKeyType": "INFERENCE", "description": f"faults {i}"}
            if i == 0:  # one key runs into its consumption limit during the run
                body["consumptionLimit"] = {"usd": 0.0005}
            resp = httpx.post(f"{base}/api_keys", headers=admin, json=body, timeout=30)
            resp.raise_for_status()
            keys.append(resp.json()["data"]["apiKey"])
        # a client of another account, on the default tier: the catalog's 100 requests a
        # minute per key apply to it, so the run also shows whether limits hold under faults
        limited = cli(["create-account", "--usd", "10"], settings=settings)
        resp = httpx.post(f"{base}/api_keys", json={"apiKeyType": "INFERENCE",
                                                    "description": "faults rate-limited"},
                          headers={"Authorization": f"Bearer {limited['apiKey']}"}, timeout=30)
        resp.raise_for_status()
        keys.append(resp.json()["data"]["apiKey"])
        balance = httpx.get(f"{base}/billing/balance", headers=admin, timeout=30).json()
        start_nanos = round((float(balance["balances"]["usd"])
                             + float(balance["balances"]["diem"] or 0)) * 1e9)

        record = out / "record.jsonl"
        load = Load(base, keys, record)
        load.start()
        time.sleep(args.quiet_s)
        marks = []
        for name, fault in run_faults(redis, args.down_s):
            print(f"[faults] {name} ...", flush=True)
            started = time.time()
            down_s = fault()
            marks.append((name, started, started + down_s, down_s))
            time.sleep(args.quiet_s)
        load.finish()
        ended = time.time()
        # the holds of requests on killed Gateway replicas: released by a live replica's
        # sweep once their billing service has been silent for HOLDER_TIMEOUT
        grace = HOLDER_TIMEOUT.total_seconds() + SWEEP_INTERVAL_S + 2 * HEARTBEAT_S
        print(f"[faults] waiting {grace:.0f} s for the holds of killed replicas to be "
              "released, then reconciling ...", flush=True)
        time.sleep(grace)
        os.environ["DATABASE_URL"] = pg_url
        main_account = [a for a in load.answers if a["client"] < args.clients]
        (out / "record-main.jsonl").write_text(
            "".join(json.dumps(a) + "\n" for a in main_account))
        reconciliation = reconcile(made["accountId"], str(out / "record-main.jsonl"),
                                   start_nanos)
        # A replica killed after a request's charge committed but before its answer left:
        # the client got Serve's 500 without a request id, the ledger has the entry (charges
        # are durable before the answer; the other order would lose charges instead).
        lost_answers = sum(a["status"] == 500 and not a["cf_ray"] for a in main_account)
        if 0 < reconciliation["entries_without_success"] <= lost_answers:
            reconciliation["reconciled"] = all(
                reconciliation[check] for check in
                ("lines_match", "rollups_match", "balance_matches")) and not any(
                reconciliation[count] for count in
                ("missing_entries", "charged_after_failure", "wrong_units", "open_holds",
                 "keys_over_limit"))
        redis_down = next((start, back) for name, start, back, _ in marks if "Redis" in name)
        rate_limit = rate_windows(load.answers, args.clients, *redis_down)
        faults = []
        for i, (name, started, back, down_s) in enumerate(marks):
            until = marks[i + 1][1] if i + 1 < len(marks) else ended
            faults.append({"fault": name, "down_s": down_s,
                           **window_summary(load.answers, started, back, until)})
        summary = {"clients": args.clients, "quiet_s": args.quiet_s, "placed": placed,
                   "faults": faults, "rate_limit": rate_limit,
                   "lost_answers": lost_answers, "reconciliation": reconciliation,
                   "audit": audit_books()}
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        (out / "summary.md").write_text(markdown(summary))
        print(markdown(summary))
        print(f"[faults] results in {out}")
        held = rate_limit["max_in_a_window"] <= RATE_LIMIT
        return 0 if reconciliation["reconciled"] and summary["audit"]["ok"] and held else 1
    finally:
        kill_cluster(temp_dir)
        redis.stop()
        with contextlib.suppress(subprocess.CalledProcessError):  # already running
            _pg_cluster("start")  # if the run stopped while PostgreSQL was down
        drop_postgres_schema(pg_url)
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
