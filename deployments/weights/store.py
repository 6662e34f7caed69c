"""Where weights are, and how a built folder is made once: `resolve_weights` turns a catalog's
weights spec into a folder, `build_once` runs a builder under a file lock and marks the folder
complete last, and `copy_prebuilt` fills a folder from one built ahead (by `make install`,
into `PREBUILT_DIR`). Every builder of the package goes through `build_once`; this module
imports none of them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

logger = logging.getLogger("deployments.weights")

PACKAGE_PREFIX = "package:"

# Where `make install` builds, once per checkout, the weights the catalog says how to build
# (`python -m deployments.weights prebuild`): one folder per builder. WEIGHTS_PREBUILT_DIR
# names another; set empty, every data folder builds its own.
PREBUILT_DIR = Path(__file__).resolve().parents[2] / ".cache" / "weights"
PREBUILT_DIR_ENV = "WEIGHTS_PREBUILT_DIR"

# Written into the folders of the test weights the builders make (tiny random networks).
WEIGHTS_LABEL = "TEST WEIGHTS: tiny random networks built locally; their output is noise"


def package_folder(module: str) -> Path:
    """The folder of an installed Python package (weights shipped as a package)."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"weights package {module!r} is not installed")
    return Path(next(iter(found.submodule_search_locations)))


def resolve_weights(spec: str) -> Path:
    """`package:<module>/<sub/path>` -> that folder inside the installed package; anything else
    is a filesystem path."""
    if not spec.startswith(PACKAGE_PREFIX):
        return Path(spec)
    module, _, sub = spec[len(PACKAGE_PREFIX):].partition("/")
    return package_folder(module) / sub


def expand_spec(weights: str | None, data_dir: Path) -> str | None:
    """A catalog's `weights` with `${DATA_DIR}` (and other environment variables) filled in,
    as serve_app's `CatalogModel.weights_spec` does."""
    if not weights:
        return None
    return os.path.expandvars(weights.replace("${DATA_DIR}", str(data_dir)))


def log(message: str) -> None:
    """A builder's progress: to the log, and to the console of `python -m deployments.weights`."""
    logger.info(message)
    print(message, file=sys.stderr, flush=True)


def marker(target: Path) -> Path:
    """Written last by a build: its presence says the folder is complete."""
    return target / ".complete"


def is_built(target: Path) -> bool:
    return marker(target).exists()


def build_once(target: Path, build: Callable[[Path], dict]) -> Path:
    """Run `build(target)` unless an earlier run completed it; one builder at a time across
    processes (replicas of a deployment may start together). `build` returns what the
    marker records (seeds, source versions)."""
    done = marker(target)
    if done.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not done.exists():
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps(build(target)))
    return target


def prebuilt_dir() -> Path | None:
    """The folder of weights built ahead (None: none are to be used)."""
    named = os.environ.get(PREBUILT_DIR_ENV)
    if named is None:
        return PREBUILT_DIR
    return Path(named) if named else None


class _SourceChanged(Exception):
    """The folder built ahead was rebuilt or removed while it was copied."""


def copy_prebuilt(source: Path, target: Path) -> bool:
    """Fill `target` with a copy of `source`, a folder a builder completed ahead (its marker
    too, written last); False, with `target` left unbuilt, when `source` is not complete or
    changes while it is copied (`make` rebuilds it). A builder's folder depends on the builder
    alone, so one built ahead serves every data folder."""
    if not is_built(source):
        return False

    def copy(folder: Path) -> dict:
        log(f"Copying the weights built ahead at {source} to {folder}...")
        try:
            before = marker(source).stat()
            shutil.copytree(source, folder, dirs_exist_ok=True, copy_function=shutil.copy2,
                            ignore=shutil.ignore_patterns(marker(source).name))
            record = marker(source).read_text()
            after = marker(source).stat()
            if (before.st_ino, before.st_mtime_ns) != (after.st_ino, after.st_mtime_ns):
                raise _SourceChanged(str(source))
        except (OSError, shutil.Error, _SourceChanged):
            shutil.rmtree(folder, ignore_errors=True)  # under the lock: no half copy stays
            raise _SourceChanged(str(source)) from None
        return json.loads(record or "{}")

    try:
        build_once(target, copy)  # at once when `target` is already complete
    except _SourceChanged:
        log(f"The weights built ahead at {source} changed while being copied: building them")
        return False
    return True
