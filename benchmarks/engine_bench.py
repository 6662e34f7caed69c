"""The text engine alone, eager or compiled: start-up (cold or warm compile cache), one
stream's tokens/s and its time to first token, with the deployment's environment (one OpenMP
thread, the worker inside the engine core process).

    .venv/bin/python benchmarks/engine_bench.py --mode compiled --cache /tmp/vllm-cache
    .venv/bin/python benchmarks/engine_bench.py --mode eager
    .venv/bin/python benchmarks/engine_bench.py --mode both --cache /tmp/vllm-cache --rounds 4
    .venv/bin/python benchmarks/engine_bench.py --mode compiled --isa avx2 --dtype float32

`--dtype` sets the engine's dtype (default: the rule of deployments/engines/text.py for this
CPU). `--isa avx2` runs the engine as on a CPU with AVX2 and no AVX-512 (benchmarks/avx2/):
the kernels such a CPU gets, on this one's caches and memory; `--short-chats` adds 1-token
chats per second at concurrency 8 (prefill), as `chat_1token_c8` of `make bench`.

Each call is one process, so start-up is measured from a cold import. `--cache` is the
vLLM cache root (VLLM_CACHE_ROOT, where the compiled graphs are kept); an empty folder
measures the first start, the same folder again the second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import isa  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("eager", "compiled", "both"), required=True,
                        help="both: one engine of each, measured in alternation")
    parser.add_argument("--cache", type=Path, help="VLLM_CACHE_ROOT (default: vLLM's own)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --mode both")
    parser.add_argument("--dtype", default="auto", help="the engine's dtype (auto: our rule)")
    parser.add_argument("--isa", choices=isa.CHOICES, default="native",
                        help="avx2: the kernels of a CPU without AVX-512 (benchmarks/avx2/)")
    parser.add_argument("--short-chats", action="store_true",
                        help="also 1-token chats/s at concurrency 8")
    parser.add_argument("--verbose", action="store_true", help="vLLM's INFO log")
    args = parser.parse_args()
    isa.run_as(args.isa)
    started = time.monotonic()
    if args.cache:
        os.environ["VLLM_CACHE_ROOT"] = str(args.cache.resolve())
    import bench  # the deployment's engine environment, set on import

    if args.verbose:
        os.environ["VLLM_LOGGING_LEVEL"] = "INFO"

    modes = ("eager", "compiled") if args.mode == "both" else (args.mode,)
    asyncio.run(measure(modes, args, started, bench.MODELS_DIR / args.model))


async def measure(modes: tuple[str, ...], args: argparse.Namespace, started: float,
                  folder: Path) -> None:
    """Start one engine per mode, then measure them in alternation (one event loop: vLLM's
    engine keeps its output task on the loop of its first request)."""
    import bench

    from deployments.engines.text import VLLMEngine

    engines = {}
    for mode in modes:
        options = {"max_model_len": 2048, "max_num_seqs": 8, "enforce_eager": mode == "eager",
                   "dtype": args.dtype}
        engines[mode] = VLLMEngine(str(folder), options)
        print(json.dumps({"mode": mode, "isa": args.isa, "dtype": engine_dtype(engines[mode]),
                          "start_s": round(time.monotonic() - started, 1)}), flush=True)
        started = time.monotonic()
    try:
        for _ in range(args.rounds if len(modes) > 1 else 1):
            for mode, engine in engines.items():
                rate, ttft = await bench._engine_streams(engine, args.streams, args.tokens)
                figures = {"mode": mode, "tok_s": round(rate, 1), "ttft_ms": round(ttft, 1)}
                if args.short_chats:
                    figures["chats_1token_c8"] = round(
                        await bench._engine_short_chats(engine, 8, 8.0), 1)
                print(json.dumps(figures), flush=True)
    finally:
        for engine in engines.values():
            engine.shutdown()


def engine_dtype(engine) -> str:
    """The dtype the engine runs in, as vLLM resolved it."""
    try:
        return str(engine.engine.model_config.dtype).removeprefix("torch.")
    except AttributeError:
        return "?"


if __name__ == "__main__":
    main()
