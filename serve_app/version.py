"""The running revision, as `YYYYMMDD.HHMMSS` (UTC), for `x-service-version` and OpenAPI.

Taken from `SERVICE_VERSION` when set (a release pins it), else from the time of the git
commit the code runs from, else from the newest source file's modification time.
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def _format(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y%m%d.%H%M%S")


def _git_commit_time() -> float | None:
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%ct"],
            cwd=_PACKAGE_DIR,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        return float(out) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


@lru_cache(maxsize=1)
def service_version() -> str:
    pinned = os.environ.get("SERVICE_VERSION")
    if pinned:
        return pinned
    ts = _git_commit_time()
    if ts is None:
        ts = max(p.stat().st_mtime for p in _PACKAGE_DIR.rglob("*.py"))
    return _format(ts)
