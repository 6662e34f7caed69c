"""A vLLM plugin: on CPU, the compiled model's ahead-of-time artifact loads back at the next start.

vLLM keeps two things of a compiled model under its cache: inductor's compiled graphs, and an
ahead-of-time artifact that also holds what Dynamo traced, so that a start with a warm cache
skips tracing the model (8.4 s of SmolLM2's warm start on two cores, measured with py-spy).
vLLM 0.32 loads that artifact and then calls `finalize_loading` on the compiled function in
it. That method belongs to vLLM's own compile backend (GPUs); the CPU build compiles with
torch's inductor backend, whose compiled function is a plain function without it. The load
fails (`'function' object has no attribute 'finalize_loading'`), vLLM logs "Compiling model
again due to a load failure" and traces again. Upstream vLLM answered by turning the artifact
off on CPU (vllm-project/vllm#32037, with the root cause open as pytorch/pytorch#173090).

Inductor's function is ready when loaded: there is nothing to finalize. This plugin gives such
a function a `finalize_loading` that does nothing, at the one place vLLM loads the artifact
(`torch.compiler.load_compiled_function`), and only on CPU. Greedy outputs of the loaded
artifact match those of a fresh compile (tests/integration/test_compile_cache.py).

Registered in pyproject.toml under `vllm.general_plugins`, so vLLM runs `register` in every
process it starts, its engine core included.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

Loader = Callable[..., Any]


def register() -> None:
    if os.environ.get("VLLM_TARGET_DEVICE") != "cpu":
        return
    import torch.compiler

    if not getattr(torch.compiler.load_compiled_function, "finalizes_plain_functions", False):
        torch.compiler.load_compiled_function = loading_plain_functions(
            torch.compiler.load_compiled_function)


def loading_plain_functions(load: Loader) -> Loader:
    """`load`, whose loaded function's compiled function always has a `finalize_loading`."""

    def load_compiled_function(*args: Any, **kwargs: Any) -> Any:
        loaded = load(*args, **kwargs)
        artifacts = getattr(loaded, "_artifacts", None)
        compiled = getattr(artifacts, "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = _nothing_to_finalize
        return loaded

    load_compiled_function.finalizes_plain_functions = True  # type: ignore[attr-defined]
    return load_compiled_function


def _nothing_to_finalize(_vllm_config: Any) -> None:
    """Inductor's compiled function is complete once loaded."""
