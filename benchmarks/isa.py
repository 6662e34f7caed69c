"""`--isa avx2` of the benchmarks: the same command again, with every process it starts (Ray's
workers, vLLM's engine cores, the peers' servers) given the kernels of a CPU with AVX2 and no
AVX-512 (benchmarks/avx2/sitecustomize.py says how, and what this cannot reproduce)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHOICES = ("native", "avx2")
ROOT = Path(__file__).resolve().parent.parent
SITECUSTOMIZE = ROOT / "benchmarks" / "avx2"
# Set in the command run again: the marker that it runs under `--isa`.
MARKER = "BENCH_ISA"
AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's kernels, and TorchInductor's vector code
    "TORCHINDUCTOR_CPP_MARCH": "x86-64-v3",  # its compiler flags (AVX2, FMA, F16C), not native
    "ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
# Compiled graphs of their own (vLLM's cache key does not tell the two kinds of code apart),
# unless the environment names its own.
AVX2_CACHES = {
    "VLLM_CACHE_ROOT": str(ROOT / ".cache" / "isa-avx2" / "vllm"),
    "TORCHINDUCTOR_CACHE_DIR": str(ROOT / ".cache" / "isa-avx2" / "inductor"),
}


def run_as(isa: str) -> None:
    """Return where this process already runs as `isa` (`native`: nothing capped); otherwise
    replace it by the same command, interpreter options included, under `isa`'s environment."""
    if os.environ.get(MARKER, "native") == isa:
        return
    if isa == "native":
        raise SystemExit(f"this environment runs as {os.environ[MARKER]} ({MARKER}): start "
                         "the native run from a shell without it")
    path = os.pathsep.join(p for p in (str(SITECUSTOMIZE), os.environ.get("PYTHONPATH", ""))
                           if p)
    env = {**AVX2_CACHES, **os.environ, **AVX2_ENV, "PYTHONPATH": path, MARKER: isa}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
