"""Wait until the replicas of chat deployments answer with compiled engines, then exit.

`make run` (serve_app/launch.py) runs this in a process of its own after it moved a chat
deployment onto compiled replicas: a deployment handle's router keeps working in the
background after `ray.shutdown()` in the process that used it (and would start a new local Ray
instance to report to), and the launcher lives as long as the platform. Exit status 0 once
every deployment named answered `stats()` with every engine compiled, 1 at the deadline.

    python -m serve_app.compiled_probe RAY_ADDRESS APP TIMEOUT_S DEPLOYMENT...
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any


def all_compiled(stats: dict[str, dict[str, Any]] | None) -> bool:
    """Whether a text deployment's `stats()` (per model) says every engine runs compiled (an
    engine that does not tell, as a remote server's, counts as compiled)."""
    return bool(stats) and all(engine.get("compiled", True) for engine in (stats or {}).values())


def wait_compiled(ask: Callable[[str], dict | None], names: Iterable[str], timeout_s: float,
                  pause_s: float = 1.0) -> set[str]:
    """Ask each deployment of `names` for its stats until all say compiled or `timeout_s`
    passed; returns those that did not."""
    waiting, deadline = set(names), time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for name in sorted(waiting):
            with contextlib.suppress(Exception):  # a replica stopping meanwhile: ask again
                if all_compiled(ask(name)):
                    waiting.discard(name)
        if waiting:
            time.sleep(pause_s)
    return waiting


def main(argv: list[str]) -> int:
    address, app, timeout_s, *names = argv
    import ray
    from ray import serve

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)

    def ask(name: str) -> dict | None:
        handle = serve.get_deployment_handle(name, app_name=app)
        return handle.stats.remote().result(timeout_s=10)

    left = wait_compiled(ask, names, float(timeout_s))
    if left:
        print(f"not compiled within {float(timeout_s):.0f}s: {', '.join(sorted(left))}",
              file=sys.stderr, flush=True)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
