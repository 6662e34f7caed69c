"""The background process of a cold compile cache (deployments/engines/vllm_compile_fill.py):
it starts the engine compiled, which compiles into the cache, records what it left, and exits.
Run as `python -m deployments.engines.vllm_compile_process MODEL OPTIONS KEY`."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from deployments.engines import text
from deployments.engines.vllm_compile_fill import (
    FILL_FOLDER,
    artifacts,
    record_path,
    write_record,
)


def fill(model_path: str, options: dict[str, Any], key: str, root: Path) -> None:
    """Start the engine compiled (which compiles it and saves the artifact), then stop it."""
    before = artifacts(root)
    started = time.monotonic()
    engine = text.VLLMEngine(model_path, {**options, "enforce_eager": False})
    try:
        if engine.compile_key != key:
            raise RuntimeError(f"the compiled engine's settings are {engine.compile_key}, "
                               f"not {key}: nothing recorded")
    finally:
        engine.shutdown()
    after = artifacts(root)
    new = sorted(p for p, mtime in after.items() if before.get(p) != mtime)
    # No new artifact: vLLM loaded one it had (a cache filled before this record existed).
    write_record(root, key, state="done", model=Path(model_path).name, error=None,
                  seconds=round(time.monotonic() - started, 1), artifacts=new or sorted(after))


def main(argv: list[str] | None = None) -> int:
    model_path, options, key = argv or sys.argv[1:]
    os.nice(19)
    if hasattr(os, "SCHED_IDLE"):  # Linux: CPU time only when nothing else wants it
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    root = Path(os.environ["VLLM_CACHE_ROOT"])
    (root / FILL_FOLDER).mkdir(parents=True, exist_ok=True)
    with record_path(root, key).with_suffix(".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another fill of these settings is running", flush=True)
            return 0
        try:
            fill(model_path, json.loads(options), key, root)
        except BaseException as exc:
            write_record(root, key, state="failed", model=Path(model_path).name,
                          error=f"{type(exc).__name__}: {exc}")
            raise
    print(f"compiled into {root}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
