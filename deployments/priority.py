"""The model replicas at a lower CPU priority than the request path.

On a machine where the engines and the Gateway share the cores (`make run` on a laptop), an
engine busy with a batch would otherwise take CPU time from the Gateway in equal shares, and a
cheap route (`GET /models`, a key's balance) would wait behind token generation. A model
replica raises its own niceness to ENGINE_NICENESS (Linux nice values: 19 is the lowest
priority) before it loads its engines, so what it starts (vLLM's engine core, a fork server,
worker threads) inherits it; the scheduler then gives the Gateway, Serve's proxy and
controller the CPU first when both want it, and the engines all the rest.

Linux keeps a nice value per thread: every thread the process already has is reniced, and the
threads started later inherit the value of the thread that starts them. A process may only
raise its niceness without privileges, so a value below the current one leaves it as it is.
Unset or 0: nothing changes (the tests and a cluster, where engines have their own nodes).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger("deployments")

ENV = "ENGINE_NICENESS"
LOWEST = 19


def niceness(env: Mapping[str, str] = os.environ) -> int:
    """The niceness asked for (0 to 19); 0 when unset or not a number."""
    try:
        return max(0, min(LOWEST, int(env.get(ENV, "0") or 0)))
    except ValueError:
        logger.warning("%s=%r is not a whole number: the priority is left as it is", ENV,
                       env.get(ENV))
        return 0


def lower_cpu_priority(env: Mapping[str, str] = os.environ) -> int:
    """Raise every thread of this process to the niceness ENGINE_NICENESS asks for (never
    lower one); returns how many threads changed."""
    wanted = niceness(env)
    if not wanted or not hasattr(os, "setpriority"):
        return 0
    changed = 0
    for thread_id in _threads():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if os.getpriority(os.PRIO_PROCESS, thread_id) < wanted:
                os.setpriority(os.PRIO_PROCESS, thread_id, wanted)
                changed += 1
    return changed


def _threads() -> list[int]:
    """The ids of this process's threads (Linux: /proc/self/task), else the process itself."""
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        return [int(p.name) for p in tasks.iterdir() if p.name.isdigit()]
    return [0]
