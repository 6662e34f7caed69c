"""Keeping a replica's threads on chosen cores (`engine_options.cpus`).

The catalog names cores by index into the cores this process may use (`os.sched_getaffinity`),
a negative index counting from the last (`[-1]`: the last core). Pinning is applied once, after
the replica's engines load, to every thread of the process (`/proc/self/task`); threads made
later inherit it. An index this machine does not have is logged and nothing is pinned, so a
catalog written for a big machine still runs on a small one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

logger = logging.getLogger("deployments")


def chosen_cores(indices: Sequence[int], allowed: Sequence[int]) -> set[int] | None:
    """The cores `indices` name among `allowed` (sorted), or None when one is out of range."""
    cores = sorted(allowed)
    if not indices or any(not -len(cores) <= i < len(cores) for i in indices):
        return None
    return {cores[i] for i in indices}


def replica_cpus(option_sets: Iterable[dict]) -> list[int] | None:
    """The one `cpus` setting of the models a replica serves (None: none pins). Models of one
    replica share its threads, so different settings are refused."""
    settings = {tuple(options["cpus"]) for options in option_sets if options.get("cpus")}
    if len(settings) > 1:
        raise ValueError(f"models of one deployment ask for different engine_options.cpus: "
                         f"{sorted(settings)}; one replica's threads run on one set of cores")
    return list(settings.pop()) if settings else None


def pin_process(indices: Sequence[int]) -> set[int] | None:
    """Every thread of this process onto the cores `indices` name; the cores, or None (logged)
    when an index is outside the cores this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = chosen_cores(indices, allowed)
    if cores is None:
        logger.warning("engine_options.cpus %s outside this process's %d cores %s: not pinned",
                       list(indices), len(allowed), allowed)
        return None
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
    logger.info("replica threads pinned to cores %s", sorted(cores))
    return cores
