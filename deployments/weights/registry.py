"""Which builder makes which weights, and what the rest of the platform asks of weights: the
folder a model's engine loads (built first when the catalog says how), the check at build time
that a model's weights exist, and the models whose weights are still to be built.

A catalog model names its builder with `engine_options: {build: <name>}`; its `weights` is
then the folder the builder fills, or a copy of the folder built ahead for that builder (by
`make install`, `prebuild_all`), since what a builder makes depends on nothing else.
Builders live one module per family (text, image, video, audio); this module imports them,
none of them imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from deployments.spec import ServedModel
from deployments.weights.audio import (
    default_kokoro_model,
    default_whisper_model,
    join_kokoro,
    join_whisper_parts,
)
from deployments.weights.image import (
    build_tiny_instruct_pix2pix,
    build_tiny_matting_onnx,
    build_tiny_sd,
)
from deployments.weights.store import copy_prebuilt, is_built, prebuilt_dir, resolve_weights
from deployments.weights.text import build_tiny_chat_model, convert_smollm2
from deployments.weights.video import build_tiny_wan
from deployments.weights.vision import build_tiny_smolvlm

BUILDERS: dict[str, Callable[[Path], Path]] = {
    "smollm2-gguf": convert_smollm2, "tiny-llama": build_tiny_chat_model,
    # vision chat test weights (Idefics3, SmolVLM's layout)
    "tiny-smolvlm": build_tiny_smolvlm,
    # image test weights
    "tiny-sd": build_tiny_sd, "tiny-instruct-pix2pix": build_tiny_instruct_pix2pix,
    "tiny-matting-onnx": build_tiny_matting_onnx,
    # video test weights
    "tiny-wan": build_tiny_wan,
    # Whisper base joined from the two packages that ship it in parts
    "whisper-base": join_whisper_parts,
    # Kokoro-82M joined from the four packages that ship it, with kokoro-js's English voices
    "kokoro-82m": join_kokoro,
}

# Engines that load weights of their own making when the catalog names none (the others then
# read the weights their Python package ships, or need none).
DEFAULT_WEIGHTS: dict[str, Callable[[], Path]] = {"faster-whisper": default_whisper_model,
                                                  "kokoro": default_kokoro_model}


def prepare_weights(spec: str, engine_options: dict, built_ahead: Path | None = None) -> Path:
    """The weights folder of a model, built first when the catalog says how: copied from the
    folder built ahead for its builder, in `built_ahead` (default: `store.prebuilt_dir()`),
    where that is complete."""
    builder = engine_options.get("build")
    if not builder:
        return resolve_weights(spec)
    ahead = built_ahead or prebuilt_dir()
    if ahead is not None:
        copy_prebuilt(ahead / builder, Path(spec))
    return BUILDERS[builder](Path(spec))


def engine_weights(engine: str, spec: str | None, engine_options: dict) -> Path | None:
    """What an engine is given to load: the model's folder (built first when the catalog says
    how), the engine's default weights, or None (the engine's package ships them)."""
    if spec:
        return prepare_weights(spec, engine_options)
    default = DEFAULT_WEIGHTS.get(engine)
    return default() if default else None


def weights_to_build(models: Iterable[ServedModel], data_dir: Path) -> list[str]:
    """Ids of the models whose weights are still to be built."""
    return [model.id for model in models
            if model.engine_options.build
            and not is_built(Path(model.weights_spec(data_dir) or ""))]


def check_weights(model: ServedModel, data_dir: Path) -> None:
    """Fail at build time, with the model's name, when its weights cannot be found (Serve would
    otherwise retry a failing replica forever)."""
    spec = model.weights_spec(data_dir)
    if spec is None or model.engine_options.build:
        return
    path = resolve_weights(spec)
    if not path.exists():
        raise FileNotFoundError(f"weights of model {model.id!r} not found at {path} "
                                f"(catalog: {spec})")


def prebuild_all(models: Iterable[ServedModel], into: Path) -> list[Path]:
    """Build, once, the folder of each builder the catalog names, into `into/<builder>`: the
    folders `prepare_weights` copies instead of building again."""
    builders = sorted({b for model in models if (b := model.engine_options.build)})
    return [BUILDERS[builder](into / builder) for builder in builders]


def prepare_all(models: Iterable[ServedModel], data_dir: Path) -> list[Path]:
    """Build every model's weights that the catalog says how to build; their folders."""
    return [prepare_weights(str(model.weights_spec(data_dir)), model.engine_options.given())
            for model in models if model.engine_options.build]
