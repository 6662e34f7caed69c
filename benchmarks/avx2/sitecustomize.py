"""An AVX2-only CPU, as the engine's libraries see one, on a CPU that also has AVX-512:
loaded at start-up by every Python process of `engine_bench.py --isa avx2` (this folder on
PYTHONPATH).

The environment that `engine_bench.py` sets caps the vector instructions of PyTorch's kernels
(ATEN_CPU_CAPABILITY, which TorchInductor's generated code follows too), oneDNN's
(ONEDNN_MAX_CPU_ISA) and MKL's (MKL_ENABLE_INSTRUCTIONS). vLLM picks its own kernels (its
AVX2 or AVX-512 library, its attention's vector code) by asking PyTorch what the CPU has;
these answers are what an AVX2-only CPU gives. What this cannot give is that CPU's caches and
memory bandwidth: a figure measured so tells which kernels win, not the other machine's
speed."""

import torch.cpu

for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, probe):
        setattr(torch.cpu, probe, lambda: False)
