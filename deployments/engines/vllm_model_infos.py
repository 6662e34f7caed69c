"""vLLM's records of its model classes, shared by the data folders of one checkout.

vLLM learns what a model class supports (text generation, pooling, multimodal input...) by
importing it in a subprocess, which imports vLLM again: about 10 s on two cores, on the way to
a chat model's first answer. It keeps what it learnt under `VLLM_CACHE_ROOT/modelinfos`, one
file per class, with a hash of the class's source; a start whose root holds the file skips the
subprocess. That root is per `DATA_DIR` (vllm_compile.py), so every new data folder paid the
subprocess again. The files are therefore kept in a folder of the checkout after a start
(`keep`) and brought into a new root before one (`bring`). A file that no longer matches
vLLM's code fails vLLM's own hash check: that start runs the subprocess and writes a new one,
which `keep` then shares.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger("deployments.text")

FOLDER = "modelinfos"  # vLLM's, under its VLLM_CACHE_ROOT
SHARED = Path(__file__).resolve().parents[2] / ".cache" / "vllm-modelinfos"


def bring(root: Path, shared: Path = SHARED) -> list[str]:
    """Copy into `root`'s records those of `shared` it lacks; their names."""
    return _copy(shared, root / FOLDER, replace=False)


def keep(root: Path, shared: Path = SHARED) -> list[str]:
    """Copy `root`'s records (this start's, checked by vLLM) into `shared`; their names."""
    return _copy(root / FOLDER, shared, replace=True)


def _copy(source: Path, target: Path, *, replace: bool) -> list[str]:
    """A cache: any file that cannot be read or written is left out, and said in the log."""
    copied: list[str] = []
    try:
        records = sorted(source.glob("*.json"))
        if records:
            target.mkdir(parents=True, exist_ok=True)
        for record in records:
            into = target / record.name
            if into.exists() and (not replace or into.read_bytes() == record.read_bytes()):
                continue
            partial = into.with_name(f".{record.name}.{os.getpid()}")
            shutil.copyfile(record, partial)
            os.replace(partial, into)  # whole or not at all, for a start reading it meanwhile
            copied.append(record.name)
    except OSError as exc:
        logger.info("vLLM's model records not copied from %s to %s: %s", source, target, exc)
    return copied
