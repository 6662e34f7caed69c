"""`--isa avx2` of the benchmarks: the same command again, with every process it starts (Ray's
workers, vLLM's engine cores, the peers' servers) given the kernels of a CPU with AVX2 and no
AVX-512 (benchmarks/avx2/sitecustomize.py says how, and what this cannot reproduce)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHOICES = ("native", "avx2")
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
            "DNNL_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SITECUSTOMIZE = Path(__file__).resolve().parent / "avx2"


def run_as(isa: str) -> None:
    """Return at once for `native`, or where this process already runs as `isa`; otherwise
    replace this process by the same command under `isa`'s environment."""
    if isa == "native" or os.environ.get("ATEN_CPU_CAPABILITY") == AVX2_ENV["ATEN_CPU_CAPABILITY"]:
        return
    path = os.pathsep.join(p for p in (str(SITECUSTOMIZE), os.environ.get("PYTHONPATH", ""))
                           if p)
    os.execve(sys.executable, [sys.executable, *sys.argv],
              {**os.environ, **AVX2_ENV, "PYTHONPATH": path})
