"""The platform on two Ray nodes (one machine, loopback only): a head started with `ray start
--head` and a second node that joins it with `ray start --address`, each with its own CPUs,
resources and labels; the application deployed with PostgreSQL and Redis. Its replicas spread
over both nodes (read from Ray's actor state), requests through both are counted in Redis and
charged in PostgreSQL, and after the second node is killed the platform answers again and
Serve replaces what it lost. How long that takes is written to test-artifacts/multinode.json
and reported in docs, not asserted: a timing bound on a shared 2-core machine is a flaky
test, not a guarantee."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema
from tests.integration.conftest import RedisServer, _free_port_run
from tests.integration.multinode import REQUESTS, cluster_env, kill_cluster, start_two_nodes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_platform_spreads_over_two_nodes_and_survives_losing_one(tmp_path):
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    base = _free_port_run(8) + 10_000  # above Ray's worker port range (10002-19999)
    temp_dir = tempfile.mkdtemp(prefix="/tmp/raymn-")  # short: Ray's socket paths must fit
    pg_url = new_postgres_schema("mn")
    redis = RedisServer()
    env = cluster_env()
    try:
        start_two_nodes(base, temp_dir, env)
        run = subprocess.run(
            [sys.executable, "-m", "tests.integration.multinode", f"127.0.0.1:{base}",
             str(base + 4), str(tmp_path), pg_url, redis.url],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        found = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        kill_cluster(temp_dir)
        redis.stop()
        drop_postgres_schema(pg_url)
        shutil.rmtree(temp_dir, ignore_errors=True)

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "multinode.json").write_text(json.dumps(found, indent=2))
    placed = found["placed"]
    assert placed["Gateway"] == ["head", "worker"], placed  # one Gateway replica per node
    assert {role for roles in placed.values() for role in roles} == {"head", "worker"}
    assert found["statuses"] == [200] * REQUESTS
    assert found["ledger_rows"] == REQUESTS  # every request charged once, in PostgreSQL
    recovery = found["recovery_s"]  # -1: not within the harness's five minutes
    assert recovery["answering"] >= 0, recovery
    assert recovery["replaced"] >= 0, recovery
