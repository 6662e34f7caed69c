"""Autoscaling on the two-node harness (tests/integration/autoscaling.py drives it): under
sustained embeddings load the Gateway and the embedding deployment scale above one replica
and back to one after, with every request answered (200, or an honest 503 with Retry-After)
and charged exactly once; the matting deployment, scaled to zero, takes a request: it waits
for the cold start, answers 200, and goes back to zero; a deployment at zero whose replica
cannot start answers 503 MODEL_AT_CAPACITY with Retry-After once the Gateway's cold-start
bound has passed, and charges nothing. How long each step took goes to
test-artifacts/autoscaling.json and docs/operators/cluster.md, not into assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.integration.autoscaling import MODEL
from tests.integration.multinode import CATALOG
from tests.integration.two_nodes import run_on_two_nodes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_gateway_and_embeddings_scale_up_and_down_and_media_from_zero(tmp_path):
    found = run_on_two_nodes("tests.integration.autoscaling", tmp_path, "as")

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "autoscaling.json").write_text(json.dumps(found, indent=2))
    seconds = found["seconds"]  # -1: the condition did not hold within its (minutes) deadline
    assert found["peak"]["Gateway"] > 1 and found["peak"]["embedding"] > 1, found["timeline"]
    assert seconds["scaled_up"] >= 0 and seconds["back_to_min"] >= 0, found["timeline"]
    assert found["final"]["Gateway"] == 1 and found["final"]["embedding"] == 1
    # every request answered: 200, or 503 MODEL_AT_CAPACITY with Retry-After; none lost
    statuses = found["statuses"]
    assert set(statuses) <= {"200", "503 MODEL_AT_CAPACITY"}, statuses
    assert statuses.get("200", 0) > 0 and found["capacity_without_retry_after"] == 0
    # the matting deployment went from zero to one for its first request, and back
    assert seconds["matting_at_zero"] >= 0 and found["peak"]["image-matting"] == 1
    assert found["cold_start"]["status"] == 200, found["cold_start"]
    assert seconds["matting_back_to_zero"] >= 0 and found["final"]["image-matting"] == 0
    refused = found["cold_start_refused"]  # a replica that cannot start: bounded, honest
    assert (refused["status"], refused["code"]) == (503, "MODEL_AT_CAPACITY"), refused
    assert int(refused["retry_after"]) > 0
    assert seconds["cold_start_refused"] >= found["cold_start_wait_s"]
    # the Gateway read the replica count (serve.status() in its replica) and logged why
    assert found["replica_count_read_failures"] == 0 and found["refusals_logged"] >= 1
    # one ledger entry per 200 and none for a failure, the units the answers reported, the
    # balance moved by the ledger's total, no hold left open
    reconciliation = found["reconciliation"]
    assert reconciliation["reconciled"], reconciliation
    assert reconciliation["succeeded"] == statuses.get("200", 0) + 1  # + the cold start's
    assert reconciliation["charged_after_failure"] == 0  # the refused upscale among them
    # and the money is what the answers' usage says at the catalog's prices: the embeddings'
    # prompt tokens (per million) and one background removal
    prices = {m["id"]: m["pricing"] for m in yaml.safe_load(CATALOG.read_text())["models"]}
    per_token_nanos = prices[MODEL]["input"]["usd"] * 1e9 / 1e6
    removal_nanos = prices["background-remover"]["generation"]["usd"] * 1e9
    assert round(reconciliation["ledger_usd"] * 1e9) == round(
        found["prompt_tokens"] * per_token_nanos + removal_nanos), reconciliation
