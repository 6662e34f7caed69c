"""How soon a thread waiting for the GIL gets it, in the Gateway and the model replicas.

These replicas hand work to threads and take the results back on their event loop: the
Gateway's billing writer commits holds and charges; an embedding, image or audio replica runs
its forward passes in a worker thread (the loop keeps taking calls meanwhile). A vLLM model's
forward pass runs in vLLM's own engine process, which this does not reach. Between its native
calls such a thread needs the GIL for a moment; if the event loop's thread holds it, the waiter
asks for it only after Python's switch interval, 5 ms by default, and a request's steps stall
in those waits. At
0.5 ms, one embedding request at a time answered in 21.6-22.5 ms p50 instead of 24.0-25.7 ms
(benchmarks/README.md); the cost is more frequent switches between busy threads, which the
throughput figures of `make bench` did not show.

The embedding replica's forward pass takes the GIL back after each of its few hundred torch
operations, while the loop answers the previous pass's calls and takes the next ones in
Python: at 0.5 ms the pass waits up to that long for every operation in those stretches.
Its replica hands the GIL over at FORWARD_PASS_SWITCH_INTERVAL_S (benchmarks/README.md,
"Embeddings on the full platform").
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005
FORWARD_PASS_SWITCH_INTERVAL_S = 0.0001


def hand_over_the_gil_quickly(interval_s: float = SWITCH_INTERVAL_S) -> None:
    sys.setswitchinterval(interval_s)
