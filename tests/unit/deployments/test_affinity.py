"""engine_options.cpus: a replica's threads kept on the chosen cores (deployments/affinity.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError

from deployments.affinity import chosen_cores, replica_cpus
from serve_app.models.engine_options import EngineOptions

# Run in a child process: pinning is for the whole process, and must not pin the test runner.
CHILD = textwrap.dedent("""
    import os, sys, threading
    from deployments.affinity import pin_process
    started, stop = threading.Event(), threading.Event()
    seen = {}
    def work():
        seen["tid"] = threading.get_native_id()
        started.set()
        stop.wait()
    thread = threading.Thread(target=work)
    thread.start()
    started.wait()
    cores = pin_process([int(a) for a in sys.argv[1:]])
    before = sorted(os.sched_getaffinity(seen["tid"]))
    later = {}
    t2 = threading.Thread(target=lambda: later.update(c=sorted(os.sched_getaffinity(0))))
    t2.start(); t2.join()
    stop.set(); thread.join()
    print(None if cores is None else sorted(cores), before, later["c"])
""")


def run_child(*indices: int) -> str:
    result = subprocess.run([sys.executable, "-c", CHILD, *map(str, indices)],
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_a_running_thread_and_a_later_one_end_on_the_last_core() -> None:
    last = max(os.sched_getaffinity(0))
    assert run_child(-1) == f"[{last}] [{last}] [{last}]"


def test_an_index_the_machine_lacks_pins_nothing() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert run_child(len(allowed) + 7) == f"None {allowed} {allowed}"


def test_indices_count_among_the_allowed_cores() -> None:
    assert chosen_cores([-1], [4, 2, 9]) == {9}
    assert chosen_cores([0, -1], [4, 2, 9]) == {2, 9}
    assert chosen_cores([-4], [4, 2, 9]) is None
    assert chosen_cores([3], [4, 2, 9]) is None


def test_models_of_one_replica_asking_for_different_cores_are_refused() -> None:
    assert replica_cpus([{"cpus": [-1]}, {}]) == [-1]
    assert replica_cpus([{}, {"threads": 2}]) is None
    with pytest.raises(ValueError, match=r"different engine_options\.cpus"):
        replica_cpus([{"cpus": [-1]}, {"cpus": [0]}])


def test_the_catalog_types_cpus() -> None:
    assert EngineOptions(cpus=[-1]).cpus == [-1]
    assert "cpus" not in EngineOptions(cpus=[-1]).engine_arguments
    with pytest.raises(ValidationError):
        EngineOptions(cpus=[])
    with pytest.raises(ValidationError):
        EngineOptions(cpus="last")
