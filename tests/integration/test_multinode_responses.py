"""Background responses survive the Gateway replica that drove them, on two Ray nodes (one
machine, loopback only): PostgreSQL and Redis shared, a Gateway replica on each node, the text
model on the head. The second node is killed while some of its replica's responses are under
way; the surviving replica takes them over, and every response completes, streams from its
first event with contiguous numbers through the surviving Gateway, and is charged once. How
long the takeover took is written to test-artifacts/multinode_responses.json, not asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.two_nodes import run_on_two_nodes

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_background_responses_survive_their_gateway_replica(tmp_path):
    # The head's proxy routes to either Gateway replica (by default it prefers its own node's)
    found = run_on_two_nodes("tests.integration.multinode_responses", tmp_path, "mr",
                             env={"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"})

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    (artifacts / "multinode_responses.json").write_text(json.dumps(found, indent=2))
    assert found["placed"]["Gateway"] == ["head", "worker"], found["placed"]
    assert found["placed"]["text-xs"] == ["head"], found["placed"]
    assert found["taken_over"] >= 1, found  # under way on the node that was killed
    assert set(found["statuses"].values()) == {"completed"}, \
        (found["statuses"], found["errors"])
    for response_id, stream in found["streams"].items():
        assert stream["contiguous"] and stream["last"] == "response.completed", \
            (response_id, stream)
        assert stream["text_chars"] > 0 and stream["output_tokens"] > 0, (response_id, stream)
    assert set(found["charges"].values()) == {1}, found["charges"]  # each charged once
    assert found["open_holds"] == 0
