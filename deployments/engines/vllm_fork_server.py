"""vLLM's engine core, imported beside the replica's own import of vLLM instead of after it.

On CPU, vLLM starts its engine core with `spawn` (always, inside a Ray actor): a fresh
interpreter that imports vLLM again before it loads the model. A text replica thus imports
vLLM twice, one after the other (about 9 s each on two cores), a third of a warm `make run`.

Here the replica first starts a fork server (multiprocessing's `forkserver`) that imports
vLLM's engine core module while the replica imports vLLM itself, and vLLM's engine core is
then forked from that server, its import done. The engine core is the server's child (vLLM
watches it through the server; the server lives as long as the replica), and its memory is
the server's pages, copied as they are written.

The forked engine core must be what `spawn` would have started:
- its environment is the replica's at the moment vLLM starts it, set in the child before
  vLLM's code runs;
- what the server read from its environment when it started and imported vLLM was the same.
  The settings that vLLM's CPU platform puts in the replica's environment for its engine core
  are put there before the server starts (`cpu_platform_env`). When vLLM starts its engine
  core, the replica's environment may differ from the server's only as the import of vLLM
  changed it (the server's import did the same; never for what the dynamic loader reads at
  exec, `AT_EXEC`) and in variables read by ROCm's libraries alone (`RUN_TIME_ONLY`).
  Otherwise vLLM's own `spawn` starts the engine core, as without this module, the server is
  stopped, and the variables that moved are logged;
- it ends when the replica does: a spawned engine core is the replica's child, which Ray ends
  with the replica, where a forked one is the server's (`_end_with`).

Off with ENGINE_CORE_FORK_SERVER=0; only on CPU, where vLLM spawns its engine core.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from deployments.engines.cpu_flags import cpu_flags

logger = logging.getLogger("deployments.text")

ENGINE_CORE_MODULE = "vllm.v1.engine.core"
# Read by the dynamic loader and the C libraries when a program starts: a value set later
# (even by vLLM's import, as OpenCV's adds to LD_LIBRARY_PATH) reaches a spawned engine core
# but not one forked from the server.
AT_EXEC = ("LD_", "MALLOC_", "GLIBC_", "PYTHON")
# Set by vLLM when its ROCm module is first imported, read only by ROCm's libraries.
RUN_TIME_ONLY = ("AITER_",)
# How long a forked engine core whose replica is gone has to shut down before it is ended.
ORPHAN_GRACE_S = 10.0


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """On vLLM's CPU build, where it spawns its engine core, unless turned off."""
    return (env.get("VLLM_TARGET_DEVICE") == "cpu"
            and env.get("ENGINE_CORE_FORK_SERVER", "1") != "0"
            and env.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn")


def cpu_platform_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables vLLM's CPU platform sets for its engine core when it builds the engine's
    configuration, with the values it gives them on this machine (vllm/platforms/cpu.py). A
    value that drifts from vLLM's only costs the speed-up: the engine core is then spawned."""
    values = {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "NUMEXPR_MAX_THREADS": str(len(os.sched_getaffinity(0))),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1",
        "TORCHINDUCTOR_CPP_DYNAMIC_THREADS": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    if "avx512_bf16" in cpu_flags():  # its state layout for models with convolution state
        values["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"
    preload = env.get("LD_PRELOAD", "")
    if not any(name in preload for name in ("libomp", "libgomp", "libiomp")):
        gomp = _first_file("torch", ("../torch.libs", "lib"), "libgomp*.so*")
        if gomp:  # torch's own OpenMP runtime, so that thread binding uses it
            preload = f"{preload}:{gomp}" if preload else gomp
    if "libtcmalloc" not in preload:
        tcmalloc = _first_file("vllm", ("libs",), "libtcmalloc_minimal*.so*") \
            or _first_file("vllm", ("libs",), "libtcmalloc.so*")
        if tcmalloc:  # the allocator vLLM ships in some builds
            preload = f"{tcmalloc}:{preload}" if preload else tcmalloc
    if preload:
        values["LD_PRELOAD"] = preload
    return values


def _first_file(package: str, folders: tuple[str, ...], pattern: str) -> str | None:
    """The first file matching `pattern` in a folder of an installed package, in the order
    the file system lists them (as vLLM looks them up)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    root = os.path.dirname(spec.origin)
    for folder in folders:
        found = glob.glob(os.path.join(os.path.normpath(os.path.join(root, folder)), pattern))
        if found:
            return found[0]
    return None


@dataclass
class ForkServer:
    """The fork server of this process, and the environment it was started with."""

    pid: int
    started_with: dict[str, str]
    # What importing vLLM changed in this process's environment (the server's import made the
    # same changes in its own): set once the replica has imported vLLM.
    import_changes: dict[str, str | None] = field(default_factory=dict)

    def seen_import(self, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        self.import_changes.update({k: after.get(k) for k in set(before) | set(after)
                                    if before.get(k) != after.get(k)})

    def moved(self, env: Mapping[str, str]) -> list[str]:
        """The variables of `env` that differ from the server's environment in a way a forked
        engine core could have read otherwise than a spawned one."""
        def same(key: str) -> bool:
            value = env.get(key)
            if value == self.started_with.get(key) or key.startswith(RUN_TIME_ONLY):
                return True
            if key.startswith(AT_EXEC):
                return key == "LD_LIBRARY_PATH" and _existing_folders(value) == \
                    _existing_folders(self.started_with.get(key))
            return key in self.import_changes and value == self.import_changes[key]

        return sorted(k for k in set(env) | set(self.started_with) if not same(k))

    def alive(self) -> bool:
        with contextlib.suppress(ChildProcessError):
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        return False

    def stop(self) -> None:
        """End the server (its import may still run) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


def _existing_folders(search_path: str | None) -> list[str]:
    """A library search path as the loader uses it: the folders that exist."""
    return [p for p in (search_path or "").split(":") if p and os.path.isdir(p)]


_server: ForkServer | None = None


def start(env: MutableMapping[str, str] = os.environ) -> ForkServer | None:
    """Start the fork server (once per process), importing vLLM's engine core; call it before
    importing vLLM. None where it is not wanted, or could not start."""
    global _server
    if _server is not None:
        return _server
    if not wanted(env):
        return None
    for name, value in cpu_platform_env(env).items():
        env.setdefault(name, value)
    try:
        multiprocessing.get_context("forkserver").set_forkserver_preload([ENGINE_CORE_MODULE])
        multiprocessing.forkserver.ensure_running()
        pid = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    except Exception:
        logger.warning("the engine core's fork server did not start; vLLM spawns the engine "
                       "core", exc_info=True)
        return None
    _server = ForkServer(pid=pid, started_with=dict(env))
    return _server


@contextlib.contextmanager
def engine_core_forked(server: ForkServer | None, before_import: Mapping[str, str]
                       ) -> Iterator[None]:
    """While vLLM starts its engine core (`AsyncLLM(...)`), it forks it from `server` instead
    of spawning it, when nothing it reads at start-up moved. `before_import`: this process's
    environment just before it imported vLLM."""
    if server is None:
        yield
        return
    import vllm.v1.engine.utils as engine_utils

    server.seen_import(before_import, os.environ)
    own = engine_utils.get_mp_context

    def get_mp_context() -> Any:
        global _server
        moved = server.moved(os.environ)
        if moved or not server.alive():
            logger.warning("vLLM spawns the engine core: %s", f"{', '.join(moved)} moved since "
                           "its fork server started" if moved else "its fork server is gone")
            server.stop()
            _server = None
            return own()
        logger.info("vLLM's engine core is forked from its fork server")
        return _ForkedContext()

    engine_utils.get_mp_context = get_mp_context
    try:
        yield
    finally:
        engine_utils.get_mp_context = own


class _EngineCoreProcess(multiprocessing.context.ForkServerProcess):
    """A process forked from the fork server that runs in the environment its parent had
    when it started it, as a spawned one would, and ends with that parent."""

    def start(self) -> None:
        self._target = _InEnvironment(self._target, dict(os.environ),  # type: ignore
                                      os.getpid())
        super().start()


class _ForkedContext(multiprocessing.context.ForkServerContext):
    Process = _EngineCoreProcess


class _InEnvironment:
    """`target`, run once the environment is `env`, in a process that ends soon after the
    process `parent_pid` (picklable: it travels to the forked process)."""

    def __init__(self, target: Callable[..., Any], env: dict[str, str], parent_pid: int
                 ) -> None:
        self.target, self.env, self.parent_pid = target, env, parent_pid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.clear()
        os.environ.update(self.env)
        threading.Thread(target=_end_with, args=(self.parent_pid,), daemon=True,
                         name="end-with-replica").start()
        return self.target(*args, **kwargs)


def _end_with(pid: int, grace_s: float = ORPHAN_GRACE_S) -> None:
    """Once process `pid` is gone, end this one: SIGTERM (vLLM's engine core shuts down on
    it), then, if it is still there after `grace_s`, at once. A spawned engine core is ended
    by Ray with the replica it is a child of; a forked one is the fork server's child."""
    try:
        watched = os.pidfd_open(pid)
    except ProcessLookupError:
        pass  # gone already
    except OSError:  # a kernel without pidfd: look every second
        while _exists(pid):
            time.sleep(1.0)
    else:
        select.select([watched], [], [])
        os.close(watched)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
