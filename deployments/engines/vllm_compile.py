"""vLLM runs compiled by default, and keeps what it compiled under DATA_DIR.

- `enforce_eager` (a catalog model's `engine_options`) defaults to false on every device. On
  a GPU that is vLLM's own recommendation: torch.compile, then CUDA graphs captured for the
  batch sizes it serves (eager would turn both off). On CPU, vLLM's CPU build traces the model
  once and compiles it with inductor: one stream of SmolLM2 runs faster than eager, the price
  is a compile of 80 s or more on two cores. While the cache is cold for a model that does not
  name `enforce_eager`, the engine starts eager and the compile runs in the background
  instead (vllm_compile_fill.py).
- The compiled graphs go under `DATA_DIR/cache/vllm` (vLLM's `VLLM_CACHE_ROOT`, keyed by
  vLLM's own hash of the model, its settings and vLLM's code), so a second `make run` loads
  them instead of compiling again. An operator's own `VLLM_CACHE_ROOT` wins; without DATA_DIR
  in the replica's environment vLLM keeps its default (`~/.cache/vllm`).
- vLLM also keeps an ahead-of-time artifact with what Dynamo traced, so that a warm start skips
  tracing the model; inductor's graphs then live inside it. On CPU vLLM 0.32 cannot load it
  back on its own: the engine asks for it (`VLLM_USE_AOT_COMPILE=1`) only when the project's
  vLLM plugin (vllm_aot.py) that lets it is installed and allowed (`VLLM_PLUGINS`), since a
  failing load would trace and save again at every start. An operator's own value wins.
- Without the artifact on CPU, inductor's own graph cache is what loads back: it is placed
  beside vLLM's (`TORCHINDUCTOR_CACHE_DIR`, otherwise a folder in /tmp). Importing vLLM already
  sets that variable to torch's default, so a value equal to the default is replaced; an
  operator's own is kept.
- On CPU, vLLM warms the compiled model up at every start with one forward pass of
  `max_num_batched_tokens` tokens: 4.5 s of a warm start at its default of 2048 on two cores.
  A compiled text model on CPU therefore batches at most CPU_BATCHED_TOKENS tokens a step
  (1.1 s of warm-up); a longer prompt is prefilled in chunks of that size, which costs a CPU
  nothing measurable since prefill there is bound by arithmetic, not by steps. A vision model
  keeps vLLM's default (one image's tokens must fit in a step), as does a model asking for
  more sequences than that a step, and a catalog's own `max_num_batched_tokens` wins (an
  encoder-decoder model, which vLLM cannot prefill in chunks, sets its `max_model_len`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

CACHE_FOLDER = Path("cache") / "vllm"
CPU_BATCHED_TOKENS = 512
AOT_PLUGIN_GROUP, AOT_PLUGIN = "vllm.general_plugins", "cpu_aot_load"  # pyproject.toml


def compile_settings(options: Mapping[str, Any],
                     env: MutableMapping[str, str] = os.environ) -> dict[str, Any]:
    """The engine arguments on compilation (`enforce_eager`, `max_num_batched_tokens`; None
    leaves vLLM's default), with the compile cache placed in `env` (the replica's
    environment, read by vLLM when it compiles)."""
    if "VLLM_CACHE_ROOT" not in env and (root := cache_root(env)):
        env["VLLM_CACHE_ROOT"] = str(root)
    cpu = env.get("VLLM_TARGET_DEVICE") == "cpu"
    if cpu:
        env.setdefault("VLLM_USE_AOT_COMPILE", "1" if _aot_plugin_loads(env) else "0")
        if env["VLLM_USE_AOT_COMPILE"] == "0" and env.get("VLLM_CACHE_ROOT") and \
                env.get("TORCHINDUCTOR_CACHE_DIR") in (None, _inductor_default()):
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(env["VLLM_CACHE_ROOT"]) / "inductor_cache")
    eager = bool(options.get("enforce_eager", False))
    batched = options.get("max_num_batched_tokens")
    if batched is None and cpu and not eager \
            and not options.get("vision") \
            and int(options.get("max_num_seqs", 8)) <= CPU_BATCHED_TOKENS:
        batched = CPU_BATCHED_TOKENS
    return {"enforce_eager": eager,
            "max_num_batched_tokens": int(batched) if batched is not None else None}


def cache_root(env: Mapping[str, str]) -> Path | None:
    """Where vLLM keeps what it compiles: VLLM_CACHE_ROOT, else DATA_DIR/cache/vllm."""
    if env.get("VLLM_CACHE_ROOT"):
        return Path(env["VLLM_CACHE_ROOT"])
    return Path(env["DATA_DIR"]) / CACHE_FOLDER if env.get("DATA_DIR") else None


def _aot_plugin_loads(env: Mapping[str, str]) -> bool:
    """Whether vLLM will run the plugin that loads the artifact back on CPU (vllm_aot.py)."""
    from importlib.metadata import entry_points

    names = {e.name for e in entry_points(group=AOT_PLUGIN_GROUP)}
    allowed = env.get("VLLM_PLUGINS")  # vLLM's allowlist, comma-separated; unset: all
    return AOT_PLUGIN in names and (allowed is None or AOT_PLUGIN in allowed.split(","))


def _inductor_default() -> str | None:
    """Where torch's inductor keeps its cache when nobody says (a folder in /tmp)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # no torch, or a torch that moved it: nothing to tell apart
        return None
    return default_cache_dir()
