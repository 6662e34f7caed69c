"""vLLM runs compiled by default, and keeps what it compiled under DATA_DIR.

- `enforce_eager` (a catalog model's `engine_options`) defaults to false on every device. On
  a GPU that is vLLM's own recommendation: torch.compile, then CUDA graphs captured for the
  batch sizes it serves (eager would turn both off). On CPU, vLLM's CPU build traces the model
  once and compiles it with inductor: one stream of SmolLM2 runs faster than eager, the price
  is the first start (benchmarks/README.md has the figures).
- The compiled graphs go under `DATA_DIR/cache/vllm` (vLLM's `VLLM_CACHE_ROOT`, keyed by
  vLLM's own hash of the model, its settings and vLLM's code), so a second `make run` loads
  them instead of compiling again. An operator's own `VLLM_CACHE_ROOT` wins; without DATA_DIR
  in the replica's environment vLLM keeps its default (`~/.cache/vllm`).
- On CPU the ahead-of-time artifact that vLLM 0.32 writes by default cannot be loaded back
  (`'function' object has no attribute 'finalize_loading'`: every start compiled again). The
  CPU build therefore compiles without it (`VLLM_USE_AOT_COMPILE=0`) and reuses inductor's own
  graph cache, which loads; that cache is placed beside vLLM's (`TORCHINDUCTOR_CACHE_DIR`,
  otherwise a folder in /tmp). Importing vLLM already sets that variable to torch's default,
  so a value equal to the default is replaced; an operator's own is kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

CACHE_FOLDER = Path("cache") / "vllm"


def compile_settings(options: Mapping[str, Any],
                     env: MutableMapping[str, str] = os.environ) -> dict[str, Any]:
    """The engine arguments on compilation (`enforce_eager`), with the compile cache placed
    in `env` (the replica's environment, read by vLLM when it compiles)."""
    if "VLLM_CACHE_ROOT" not in env and env.get("DATA_DIR"):
        env["VLLM_CACHE_ROOT"] = str(Path(env["DATA_DIR"]) / CACHE_FOLDER)
    if env.get("VLLM_TARGET_DEVICE") == "cpu":
        env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if env.get("VLLM_CACHE_ROOT") and \
                env.get("TORCHINDUCTOR_CACHE_DIR") in (None, _inductor_default()):
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(env["VLLM_CACHE_ROOT"]) / "inductor_cache")
    return {"enforce_eager": bool(options.get("enforce_eager", False))}


def _inductor_default() -> str | None:
    """Where torch's inductor keeps its cache when nobody says (a folder in /tmp)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # no torch, or a torch that moved it: nothing to tell apart
        return None
    return default_cache_dir()
