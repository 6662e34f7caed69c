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
from pathlib import Path

import pytest

from tests.integration.multinode import REQUESTS
from tests.integration.two_nodes import run_on_two_nodes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_platform_spreads_over_two_nodes_and_survives_losing_one(tmp_path):
    found = run_on_two_nodes("tests.integration.multinode", tmp_path, "mn")

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
