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
- its environment is the replica's at the moment vLLM starts it (set in the child before
  vLLM's code runs);
- what is read from the environment when a module is imported or a program starts (OpenMP
  and allocator preloads, inductor's threads: `READ_AT_START`) was read by the server from
  the environment it was started with. The CPU settings that vLLM's CPU platform puts in the
  replica's environment before it starts its engine core are put there before the server
  starts (`cpu_platform_env`). If such a variable has moved in the replica by then otherwise
  than as the import of vLLM changed it (the server's import did the same), vLLM's own
  `spawn` starts the engine core, as without this module, and says which variables moved.

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
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("deployments.text")

ENGINE_CORE_MODULE = "vllm.v1.engine.core"
# Variables read when a program starts or a module is imported: the dynamic loader's, OpenMP's
# and the allocators', torch's and inductor's, Python's own, and vLLM's (most of vLLM's are
# read when used, but a module may keep one from its import). Any other is read at run time,
# from the environment the forked engine core is given before vLLM's code runs.
READ_AT_START = ("LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "NUMEXPR_", "MALLOC_",
                 "TCMALLOC_", "TORCH", "PYTORCH_", "CUDA_", "PYTHON", "VLLM_")


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """On vLLM's CPU build, where it spawns its engine core, unless turned off."""
    return (env.get("VLLM_TARGET_DEVICE") == "cpu"
            and env.get("ENGINE_CORE_FORK_SERVER", "1") != "0"
            and env.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn")


def cpu_platform_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables vLLM's CPU platform sets for its engine core when it builds the engine's
    configuration, with the values it gives them on this machine (vllm/platforms/cpu.py)."""
    values = {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "NUMEXPR_MAX_THREADS": str(len(os.sched_getaffinity(0))),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "VLLM_DISABLE_SHARED_EXPERTS_STREAM": "1",
        "TORCHINDUCTOR_CPP_DYNAMIC_THREADS": "1",
        "LOCAL_WORLD_SIZE": "1",
    }
    if _cpu_flag("avx512_bf16"):  # its state layout for models with convolution state
        values["VLLM_SSM_CONV_STATE_LAYOUT"] = "SD"
    preload = env.get("LD_PRELOAD", "")
    if not any(name in preload for name in ("libomp", "libgomp", "libiomp")):
        # torch's own OpenMP runtime, preloaded so that thread binding uses it
        gomp = _torch_libgomp()
        if gomp:
            preload = f"{preload}:{gomp}" if preload else gomp
    if preload:
        values["LD_PRELOAD"] = preload
    return values


def _cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return any(line.startswith("flags") and flag in line.split() for line in fh)
    except OSError:
        return False


def _torch_libgomp() -> str | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    package = os.path.dirname(spec.origin)
    for folder in (os.path.join(os.path.dirname(package), "torch.libs"),
                   os.path.join(package, "lib")):
        found = sorted(glob.glob(os.path.join(folder, "libgomp*.so*")))
        if found:
            return found[0]
    return None


@dataclass
class ForkServer:
    """The fork server of this process, and the environment it was started with."""

    started_with: dict[str, str]
    # What importing vLLM changed in this process's environment (the server's import made the
    # same changes in its own): set once the replica has imported vLLM.
    import_changes: dict[str, str | None] = field(default_factory=dict)

    def seen_import(self, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        self.import_changes.update({k: after.get(k) for k in set(before) | set(after)
                                    if before.get(k) != after.get(k)})

    def moved(self, env: Mapping[str, str]) -> list[str]:
        """The variables read at start-up that differ in `env` from the server's environment
        other than as importing vLLM changed them: what a forked engine core would have read
        otherwise than a spawned one."""
        keys = {k for k in set(env) | set(self.started_with) if k.startswith(READ_AT_START)}
        return sorted(k for k in keys if env.get(k) != self.started_with.get(k)
                      and not (k in self.import_changes and env.get(k) == self.import_changes[k]))


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
    except Exception:
        logger.warning("the engine core's fork server did not start; vLLM spawns the engine "
                       "core", exc_info=True)
        return None
    _server = ForkServer(started_with=dict(env))
    return _server


@contextlib.contextmanager
def engine_core_forked(server: ForkServer | None, before_import: Mapping[str, str]
                       ) -> Iterator[None]:
    """While vLLM starts its engine core (`AsyncLLM(...)`), it forks it from `server` instead
    of spawning it, when nothing read at start-up moved. `before_import`: this process's
    environment just before it imported vLLM."""
    if server is None:
        yield
        return
    import vllm.v1.engine.utils as engine_utils

    server.seen_import(before_import, os.environ)
    own = engine_utils.get_mp_context

    def get_mp_context() -> Any:
        moved = server.moved(os.environ)
        if moved:
            logger.warning("vLLM spawns the engine core: %s moved since its fork server "
                           "started", ", ".join(moved))
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
    when it started it, as a spawned one would."""

    def start(self) -> None:
        self._target = _InEnvironment(self._target, dict(os.environ))  # type: ignore[attr-defined]
        super().start()


class _ForkedContext(multiprocessing.context.ForkServerContext):
    Process = _EngineCoreProcess


class _InEnvironment:
    """`target`, run once the environment is `env` (picklable: it travels to the child)."""

    def __init__(self, target: Callable[..., Any], env: dict[str, str]) -> None:
        self.target, self.env = target, env

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        os.environ.clear()
        os.environ.update(self.env)
        return self.target(*args, **kwargs)
