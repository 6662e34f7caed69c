"""A driver run on a two-node Ray cluster of its own (tests/integration/multinode.py starts
it), with PostgreSQL and a Redis of its own: what the multi-node and autoscaling tests share.
A process joins one Ray cluster, and the test session's process is in the session's, so the
driver runs as a process of its own and prints one JSON object last."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _PG_REASON, drop_postgres_schema, new_postgres_schema
from tests.integration.conftest import RedisServer, _free_port_run
from tests.integration.multinode import cluster_env, kill_cluster, start_two_nodes

REPO = Path(__file__).resolve().parents[2]


def run_on_two_nodes(driver: str, data_dir: Path, tag: str,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """`python -m <driver> ADDRESS PORT DATA_DIR DATABASE_URL REDIS_URL` against a fresh
    two-node cluster (skipped without PostgreSQL or redis-server); what it printed last.
    `tag`: two letters naming its temporary folder and database schema; `env`: more of the
    cluster's environment."""
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    base = _free_port_run(8) + 10_000  # above Ray's worker port range (10002-19999)
    temp_dir = tempfile.mkdtemp(prefix=f"/tmp/ray{tag}-")  # short: Ray's socket paths must fit
    pg_url = new_postgres_schema(tag)
    redis = RedisServer()
    env = {**cluster_env(), **(env or {})}
    try:
        start_two_nodes(base, temp_dir, env)
        run = subprocess.run(
            [sys.executable, "-m", driver, f"127.0.0.1:{base}", str(base + 4), str(data_dir),
             pg_url, redis.url],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        kill_cluster(temp_dir)
        # the head's logs (its Gateway replica's among them) outlive the cluster, in the
        # test's own folder: what a failed run did is read there
        with contextlib.suppress(OSError):  # none when the cluster did not start
            shutil.copytree(Path(temp_dir) / "session_latest" / "logs", data_dir / "ray-logs",
                            dirs_exist_ok=True, ignore_dangling_symlinks=True)
        redis.stop()
        drop_postgres_schema(pg_url)
        shutil.rmtree(temp_dir, ignore_errors=True)
