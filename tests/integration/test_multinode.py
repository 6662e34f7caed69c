"""The platform on two Ray nodes (one machine, loopback only): a head started with `ray start
--head` and a second node that joins it with `ray start --address`, each with its own CPUs,
resources and labels; the application deployed with PostgreSQL and Redis. Its replicas spread
over both nodes (read from Ray's actor state), requests through both are counted in Redis and
charged in PostgreSQL, and after the second node is killed the platform answers again and
Serve replaces what it lost. How long that takes is written to test-artifacts/multinode.json
and reported in docs, not asserted: a timing bound on a shared 2-core machine is a flaky
test, not a guarantee."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema
from tests.integration.conftest import RedisServer, _free_port_run
from tests.integration.multinode import REQUESTS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _ray(*args: str, env: dict[str, str]) -> None:
    subprocess.run([str(Path(sys.executable).parent / "ray"), "start", *args,
                    "--node-ip-address=127.0.0.1", "--disable-usage-stats"],
                   env=env, check=True, capture_output=True, timeout=120)


def _kill_cluster(temp_dir: str) -> None:
    """Every process of this cluster (its command lines name its temp dir), and their
    children; the test session's own Ray is left alone."""
    doomed = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any(temp_dir in arg for arg in proc.info["cmdline"] or []):
                doomed += [proc, *proc.children(recursive=True)]
    for proc in doomed:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(doomed, timeout=10)


@pytest.fixture
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


def test_the_platform_spreads_over_two_nodes_and_survives_losing_one(cluster_env, tmp_path):
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    base = _free_port_run(8) + 10_000  # above Ray's worker port range (10002-19999)
    temp_dir = tempfile.mkdtemp(prefix="/tmp/raymn-")  # short: Ray's socket paths are
    pg_url = new_postgres_schema("mn")
    redis = RedisServer()
    try:
        _ray("--head", f"--port={base}", "--num-cpus=2", '--resources={"head_node": 1}',
             "--labels=platform/role=head", "--include-dashboard=false",
             f"--temp-dir={temp_dir}", f"--ray-client-server-port={base + 1}",
             f"--dashboard-agent-listen-port={base + 2}",
             f"--min-worker-port={base + 100}", f"--max-worker-port={base + 199}",
             env=cluster_env)
        _ray(f"--address=127.0.0.1:{base}", "--num-cpus=2", '--resources={"second_node": 1}',
             "--labels=platform/role=worker", f"--dashboard-agent-listen-port={base + 3}",
             f"--min-worker-port={base + 200}", f"--max-worker-port={base + 299}",
             env=cluster_env)
        run = subprocess.run(
            [sys.executable, "-m", "tests.integration.multinode", f"127.0.0.1:{base}",
             str(base + 4), str(tmp_path), pg_url, redis.url],
            env=cluster_env, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        found = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        _kill_cluster(temp_dir)
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
    assert recovery["answering"] > 0, recovery
    assert recovery["replaced"] > 0, recovery
