"""A model replica lowers its own CPU priority (ENGINE_NICENESS) before it loads its engines:
every thread it has, the threads and processes it starts after, never raised back. Each case
runs in its own process, so that the test process keeps its priority."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deployments.priority import niceness

ROOT = Path(__file__).resolve().parents[3]

REPLICA = """
import os, subprocess, sys, threading
from deployments.priority import lower_cpu_priority

os.nice(int(sys.argv[2]))  # the niceness the process starts with (Ray's workers: 15)
started_before = threading.Event()
stop = threading.Event()
before = threading.Thread(target=lambda: (started_before.set(), stop.wait()), daemon=True)
before.start()
started_before.wait()
lower_cpu_priority({"ENGINE_NICENESS": sys.argv[1]})
seen = {}
after = threading.Thread(target=lambda: seen.update(after=os.getpriority(os.PRIO_PROCESS, 0)))
after.start(); after.join()
threads = {}
for task in os.listdir("/proc/self/task"):
    try:
        threads[int(task)] = os.getpriority(os.PRIO_PROCESS, int(task))
    except ProcessLookupError:  # a joined thread still listed until the kernel reaps it
        pass
child = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                       capture_output=True, text=True).stdout.strip()
stop.set(); before.join()
print(sorted(set(threads.values())), seen["after"], child)
"""


def _replica(wanted: str, starting: int = 0) -> str:
    done = subprocess.run([sys.executable, "-c", REPLICA, wanted, str(starting)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_every_thread_and_what_the_replica_starts_after_runs_at_the_engines_niceness():
    assert _replica("12") == "[12] 12 12"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_a_niceness_below_the_current_one_leaves_the_priority_as_it_is():
    assert _replica("5", starting=15) == "[15] 15 15"
    assert _replica("0", starting=3) == "[3] 3 3"  # unset or 0: nothing changes


def test_the_setting_is_read_as_a_linux_nice_value():
    assert niceness({}) == 0 and niceness({"ENGINE_NICENESS": ""}) == 0
    assert niceness({"ENGINE_NICENESS": "10"}) == 10
    assert niceness({"ENGINE_NICENESS": "40"}) == 19  # the lowest priority there is
    assert niceness({"ENGINE_NICENESS": "-5"}) == 0  # raising a priority is not ours to do
    assert niceness({"ENGINE_NICENESS": "low"}) == 0
