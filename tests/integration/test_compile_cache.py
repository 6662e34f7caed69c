"""The text engine compiles once per DATA_DIR: the first start leaves its compiled graphs and
the ahead-of-time artifact of what Dynamo traced under DATA_DIR/cache/vllm, and a second start
on the same DATA_DIR loads both (the artifact through the project's vLLM plugin) and answers
the same greedy text without compiling again. Each start is its own process, as each `make run`
is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.weights.text import build_tiny_chat_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# One chat through a fresh engine (the replica's environment: vLLM's CPU build, one thread,
# the worker inside the engine core process).
START_AND_CHAT = """
import asyncio, sys
from deployments.engines.text import VLLMEngine
from deployments.protocol import Chunk, Sampling, TextRequest

# compiled at start even on a cold cache: what this test is about
engine = VLLMEngine(sys.argv[1], {"max_model_len": 256, "max_num_seqs": 2,
                                  "enforce_eager": False})

async def chat():
    request = TextRequest(request_id="compile-cache", messages=[{"role": "user", "content": "Hi"}],
                          sampling=Sampling(temperature=0, max_tokens=8, n=1))
    return [e async for e in engine.generate(request)]

events = asyncio.run(chat())
engine.shutdown()
print("tokens", sum(e.tokens for e in events if isinstance(e, Chunk)), flush=True)
print("text", repr("".join(e.text for e in events if isinstance(e, Chunk))), flush=True)
"""


def _start_and_chat(model: Path, data_dir: Path) -> tuple[str, str]:
    """(stdout, stderr) of one start and one greedy chat."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_USE_AOT_COMPILE")}
    env.update({"DATA_DIR": str(data_dir), "VLLM_TARGET_DEVICE": "cpu",
                "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "VLLM_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": str(ROOT)})
    done = subprocess.run([sys.executable, "-c", START_AND_CHAT, str(model)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def _compiled_graphs(data_dir: Path) -> dict[Path, int]:
    """Each file of what was compiled under DATA_DIR's cache (inductor's graphs and kernels,
    vLLM's ahead-of-time artifact), with when it was written."""
    return {p: p.stat().st_mtime_ns for p in (data_dir / "cache" / "vllm").rglob("*")
            if p.is_file() and "locks" not in p.parts}


def test_a_second_start_reuses_the_graphs_the_first_compiled(tmp_path):
    model = build_tiny_chat_model(tmp_path / "models" / "tiny-chat")
    data_dir = tmp_path / "data"

    first, _ = _start_and_chat(model, data_dir)
    compiled = _compiled_graphs(data_dir)
    traced = list((data_dir / "cache" / "vllm").rglob("torch_aot_compile/*/rank_*/model"))
    again, log = _start_and_chat(model, data_dir)

    assert "tokens 8" in first and "tokens 8" in again
    assert compiled, "the first start left no compiled graph under DATA_DIR/cache/vllm"
    assert traced, "the first start left no ahead-of-time artifact under DATA_DIR/cache/vllm"
    assert _compiled_graphs(data_dir) == compiled  # nothing compiled or written again
    # the artifact loaded (vLLM logs to stdout): the model was not traced again
    assert "Directly load AOT compilation" in again and "load failure" not in again + log
    text = [line for line in first.splitlines() if line.startswith("text ")]
    assert text and text == [line for line in again.splitlines() if line.startswith("text ")]
