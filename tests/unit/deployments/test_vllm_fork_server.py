"""The engine core's fork server: where it is used, the environment it starts with, when a
replica's environment has moved too far for a forked engine core, and the environment the
forked process runs in. The engine itself forked from it: tests/integration/test_fork_server.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.engines import vllm_fork_server
from deployments.engines.vllm_fork_server import ForkServer, cpu_platform_env, wanted

ROOT = Path(__file__).resolve().parents[3]
CPU_SPAWN = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}


def test_used_on_the_cpu_build_where_vllm_spawns_its_engine_core_unless_turned_off():
    assert wanted(CPU_SPAWN)
    assert not wanted({**CPU_SPAWN, "ENGINE_CORE_FORK_SERVER": "0"})
    assert not wanted({**CPU_SPAWN, "VLLM_TARGET_DEVICE": "cuda"})
    assert not wanted({"VLLM_TARGET_DEVICE": "cpu"})  # vLLM forks by itself there
    assert vllm_fork_server.start(dict(CPU_SPAWN, ENGINE_CORE_FORK_SERVER="0")) is None


def test_the_server_starts_with_the_cpu_settings_vllm_gives_its_engine_core():
    env = cpu_platform_env({})
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert env["NUMEXPR_MAX_THREADS"] == str(len(os.sched_getaffinity(0)))
    # torch's own OpenMP runtime is preloaded, after what was preloaded already
    assert "libgomp" in env["LD_PRELOAD"]
    assert cpu_platform_env({"LD_PRELOAD": "/x/libfoo.so"})["LD_PRELOAD"].startswith(
        "/x/libfoo.so:")
    # an OpenMP runtime already preloaded stays the only one
    assert "libgomp" not in cpu_platform_env({"LD_PRELOAD": "/x/libiomp5.so"})["LD_PRELOAD"]


def test_an_environment_that_moved_otherwise_than_by_vllms_import_is_told():
    server = ForkServer(pid=0, started_with={"OMP_NUM_THREADS": "1", "HOME": "/root"})
    before = {"OMP_NUM_THREADS": "1", "HOME": "/root"}
    imported = {**before, "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
                "LD_LIBRARY_PATH": "/no/such/folder:"}
    server.seen_import(before, imported)

    # what importing vLLM changed, the server's import changed too; a library search path
    # through folders that do not exist finds nothing more
    assert server.moved(imported) == []
    assert server.moved({**imported, "AITER_SITUV2_A4W4": "1"}) == []  # ROCm's alone
    assert server.moved({**imported, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere",
                         "OMP_NUM_THREADS": "2", "HOME": "/home/x"}) == [
        "HOME", "OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR"]
    assert server.moved({"HOME": "/root"}) == ["OMP_NUM_THREADS"]  # gone counts too


def test_what_the_loader_reads_at_exec_counts_even_when_vllms_import_set_it(tmp_path):
    server = ForkServer(pid=0, started_with={})
    server.seen_import({}, {"LD_PRELOAD": "/x/libtcmalloc.so",
                            "LD_LIBRARY_PATH": str(tmp_path)})
    assert server.moved({"LD_PRELOAD": "/x/libtcmalloc.so",
                         "LD_LIBRARY_PATH": str(tmp_path)}) == ["LD_LIBRARY_PATH", "LD_PRELOAD"]


def test_a_forked_engine_core_ends_soon_after_the_replica_that_started_it():
    replica = subprocess.Popen(["sleep", "1"])
    core = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from deployments.engines.vllm_fork_server import _end_with\n"
         "_end_with(int(sys.argv[1]), grace_s=30)\ntime.sleep(60)", str(replica.pid)],
        cwd=ROOT)
    replica.wait()
    assert core.wait(timeout=120) == -signal.SIGTERM  # its own end, at 60 s, would be 0


@pytest.fixture
def kept_environment():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_forked_process_runs_in_its_parents_environment_of_when_it_started(
        kept_environment):
    os.environ["LEFT_FROM_THE_SERVER"] = "1"
    target = vllm_fork_server._InEnvironment(lambda x: (x, dict(os.environ)),
                                             {"FROM_THE_REPLICA": "yes"}, os.getpid())
    value, env = target(7)
    assert value == 7 and env == {"FROM_THE_REPLICA": "yes"}
