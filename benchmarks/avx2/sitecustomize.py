"""An AVX2-only CPU, as vLLM sees one, on a CPU that also has AVX-512: loaded at start-up by
every Python process of a benchmark run with `--isa avx2` (this folder first on PYTHONPATH;
benchmarks/isa.py).

vLLM picks its own kernels (its AVX2 or AVX-512 library, its attention's vector code) by
asking PyTorch what the CPU has; these probes answer as an AVX2-only CPU does. The environment
that benchmarks/isa.py sets caps the rest: PyTorch's kernels, TorchInductor's generated code
and its compiler flags, oneDNN and MKL. What this cannot give is that CPU's caches and memory
bandwidth: a figure measured so tells which kernels win, not the other machine's speed."""

try:
    import torch.cpu
except ImportError:  # a process without PyTorch (a peer's own virtualenv): nothing to answer
    pass
else:
    for probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        if hasattr(torch.cpu, probe):
            setattr(torch.cpu, probe, lambda: False)
