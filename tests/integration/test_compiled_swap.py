"""A first start compiles its chat model in the background; once that compile is done the
chat deployment moves onto compiled replicas without a restart and without dropping a request
(serve_app/launch.py's step, driven by tests/integration/compiled_swap.py on a cluster of its
own): every chat streamed while the compiled replica started beside the eager one and took
over is answered whole, and the replica answering after reports its engine compiled. How long
the move took goes to docs/getting-started.md, not into assertions."""

from __future__ import annotations

import pytest

from tests.integration.two_nodes import run_on_two_nodes

pytestmark = pytest.mark.integration


def test_the_chat_model_moves_onto_its_compiled_engine_without_dropping_a_request(tmp_path):
    found = run_on_two_nodes("tests.integration.compiled_swap", tmp_path, "cs")

    assert found["compiled_before"] is False and found["fill"]["state"] == "done"
    assert found["compiled_after"] is True
    outcomes = found["outcomes"]
    assert found["during_move"] > 0, found  # chats kept coming while it moved
    failed = [o for o in outcomes if o["status"] != 200 or o["error"] or o["finish"] is None]
    assert failed == [], failed
    assert all(o["text"] for o in outcomes)
    assert found["replicas_after"] == {"RUNNING": 1}  # the eager replica is gone
