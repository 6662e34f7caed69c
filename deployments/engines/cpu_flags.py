"""The instruction-set flags of this machine's CPU, as the kernel lists them: what the CPU
engines choose a dtype or a state layout by."""

from __future__ import annotations

import functools
import os

# PyTorch's ATEN_CPU_CAPABILITY values below AVX-512 (compared as PyTorch does, case and
# all): where an operator caps PyTorch's kernels there (as `benchmarks/isa.py` does to measure
# an AVX2-only CPU's kernels), the engine takes the dtype of a CPU without native bf16.
BELOW_AVX512 = frozenset({"default", "avx2"})


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The `flags` of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    """Whether the CPU computes in bfloat16 natively (AVX-512 BF16 or AMX), unless
    ATEN_CPU_CAPABILITY keeps the kernels below AVX-512."""
    if os.environ.get("ATEN_CPU_CAPABILITY") in BELOW_AVX512:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def cpu_dtype() -> str:
    """The dtype a CPU engine runs in when its catalog entry names none. Without native bf16,
    float32 prefills about 4x and runs 8 streams about 2.5x faster than emulated bf16, which
    wins only one stream's decode (about 1.3x): docs/models/adding-a-model.md, "The dtype on
    a CPU"."""
    return "bfloat16" if cpu_has_bf16() else "float32"
