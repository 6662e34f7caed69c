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
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.0005


def hand_over_the_gil_quickly() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
