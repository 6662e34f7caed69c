"""The text engine's core forked from its fork server (deployments/engines/vllm_fork_server.py)
answers as the spawned one does: the same greedy text, from a process that is the fork
server's child, and it ends by itself when the process it served is killed. Each start is its
own process with a replica's environment (vLLM's CPU build, `spawn`, one thread)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from deployments.weights.text import build_tiny_chat_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

START_AND_CHAT = """
import asyncio, logging, os, sys

import psutil

from deployments.engines.text import VLLMEngine
from deployments.protocol import Chunk, Sampling, TextRequest


def main():
    logging.basicConfig(level=logging.INFO)
    engine = VLLMEngine(sys.argv[1], {"max_model_len": 256, "max_num_seqs": 2,
                                      "enforce_eager": True})

    async def chat():
        request = TextRequest(request_id="fork-server",
                              messages=[{"role": "user", "content": "Hi"}],
                              sampling=Sampling(temperature=0, max_tokens=12, n=1))
        return [e async for e in engine.generate(request)]

    events = asyncio.run(chat())
    print("chat", psutil.Process().pid, flush=True)
    for process in psutil.Process().children(recursive=True):
        parent = process.parent()
        print("process", process.pid, "parent", parent.pid if parent else None,
              "server" if "multiprocessing.forkserver" in " ".join(process.cmdline()) else "",
              flush=True)
    print("text", repr("".join(e.text for e in events if isinstance(e, Chunk))), flush=True)
    if sys.argv[2] == "killed":  # as a replica Ray kills: no shutdown
        os._exit(0)
    engine.shutdown()


if __name__ == "__main__":
    main()
"""


def _start_and_chat(model: Path, data_dir: Path, fork_server: bool, end: str = "shutdown"
                    ) -> str:
    """Standard output and error of one start and one greedy chat; `end`: "shutdown" the
    engine, or leave it as a killed process would ("killed")."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE")}
    env.update({"DATA_DIR": str(data_dir), "VLLM_TARGET_DEVICE": "cpu",
                "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "OMP_NUM_THREADS": "1",
                "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "ENGINE_CORE_FORK_SERVER": "1" if fork_server else "0",
                "PYTHONPATH": str(ROOT)})
    script = data_dir / "start_and_chat.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(START_AND_CHAT)
    # Into a file, not a pipe: an engine core left running must not hold the run open.
    output = data_dir / "output.txt"
    with output.open("w") as out:
        done = subprocess.run([sys.executable, str(script), str(model), end], env=env,
                              stdout=out, stderr=subprocess.STDOUT, timeout=600, cwd=ROOT)
    assert done.returncode == 0, output.read_text()[-3000:]
    return output.read_text()


def _text(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("text "))


def test_the_forked_engine_core_answers_as_the_spawned_one(tmp_path):
    model = build_tiny_chat_model(tmp_path / "models" / "tiny-chat")

    forked = _start_and_chat(model, tmp_path / "forked", fork_server=True, end="killed")
    spawned = _start_and_chat(model, tmp_path / "spawned", fork_server=False)

    assert "forked from its fork server" in forked
    assert "vLLM spawns the engine core" not in forked
    assert "fork server" not in spawned
    assert _text(forked) == _text(spawned) and len(_text(forked)) > len("text ''")
    # the engine core is a child of the fork server, itself a child of the chat process
    chat = next(line.split()[1] for line in forked.splitlines() if line.startswith("chat "))
    processes = [line.split() for line in forked.splitlines() if line.startswith("process ")]
    servers = {f[1] for f in processes if f[3] == chat and f[-1] == "server"}
    cores = [int(f[1]) for f in processes if f[3] in servers]
    assert len(servers) == 1 and cores
    # its chat process gone without a word, the engine core and its server end by themselves
    left = [*cores, *map(int, servers)]
    deadline = time.monotonic() + 180
    try:
        while any(psutil.pid_exists(pid) for pid in left):
            assert time.monotonic() < deadline, "the engine core outlived the process it served"
            time.sleep(0.5)
    finally:
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
