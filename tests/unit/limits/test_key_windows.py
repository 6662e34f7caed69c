"""Reading a key's counts on the Ray actor: a PEEK travels in the same actor call as the
decisions beside it, sees them, and counts nothing."""

from __future__ import annotations

from serve_app.limits.backends import PEEK, run_calls
from serve_app.limits.core import LimiterCore, Outcome

T0 = 1_800_000_000_000


def test_a_peek_in_an_actor_call_reads_the_decisions_before_it_and_counts_nothing():
    core = LimiterCore()
    bucket = "key|class:XS"
    out = run_calls(core, [(bucket, 500, 1000, 10, [], T0), (PEEK, [bucket, "key|IMAGE"], T0),
                           (PEEK, [bucket], T0 + 1), (bucket, 500, 1000, 5, [], T0 + 2)])
    assert out[1] == [T0, 1, 10, 0, 0, 0]
    assert out[2] == [T0, 1, 10]
    assert Outcome.from_wire(out[3]).requests == 2
    assert core.peek(["key|IMAGE"], T0 + 3, 60_000) == [0, 0, 0]  # never created
