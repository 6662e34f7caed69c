"""Leave no process behind: Ray's stop kills replicas, but not always the processes a replica
started itself (vLLM's EngineCore and Worker outlive a killed replica). Collect the tree before
stopping, then end whatever survived."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil


def ray_processes(temp_dir: str | None = None) -> list[psutil.Process]:
    """Our own descendants, and (given its temp dir) a raylet started elsewhere with all of its
    descendants: replicas and the engine processes they spawned."""
    found = list(psutil.Process().children(recursive=True))
    if temp_dir:
        for proc in psutil.process_iter(["name", "cmdline"]):
            with contextlib.suppress(psutil.Error):
                if proc.info["name"] == "raylet" and any(
                        temp_dir in arg for arg in proc.info["cmdline"] or []):
                    found += [proc, *proc.children(recursive=True)]
    return found


def reap(processes: Iterable[psutil.Process], timeout_s: float = 10.0) -> int:
    """Wait for the processes to end by themselves, then kill the rest; returns how many."""
    processes = [p for p in processes if p.is_running()]
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    return len(alive)
