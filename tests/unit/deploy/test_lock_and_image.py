"""The pinned environment and the image's entry: requirements/cpu.lock pins, with hashes, a
version of every distribution pyproject.toml declares (base, `dev`, `cpu`) that its bounds
accept, and the weight packages; the LICENSE is the one pyproject names; the launcher (the
image's entrypoint and `make run`) runs the Serve config it is given."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from serve_app.launch import CONFIG, serve_config
from serve_app.settings import PROJECT_ROOT

LOCK = PROJECT_ROOT / "requirements" / "cpu.lock"
WEIGHTS = PROJECT_ROOT / "requirements" / "weights.txt"
PYPROJECT = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _locked() -> dict[str, tuple[Version, list[str]]]:
    """Each pinned distribution's version and hashes (the lock's backslash-continued lines)."""
    text = LOCK.read_text(encoding="utf-8").replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, rest = line.split("==", 1)
        version = rest.split()[0].split(";")[0]
        pins[canonicalize_name(name)] = (Version(version),
                                         re.findall(r"--hash=sha256:([0-9a-f]{64})", rest))
    return pins


def _declared() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["dev"], *extras["cpu"]]]


def test_every_locked_distribution_has_a_hash() -> None:
    unhashed = [name for name, (_, hashes) in _locked().items() if not hashes]
    assert unhashed == []


def test_the_lock_pins_every_declared_distribution_within_its_bounds() -> None:
    locked = _locked()
    missing, outside = [], []
    for requirement in _declared():
        pinned = locked.get(canonicalize_name(requirement.name))
        if pinned is None:
            missing.append(requirement.name)
        elif not requirement.specifier.contains(pinned[0], prereleases=True):
            outside.append(f"{requirement} (locked {pinned[0]})")
    assert (missing, outside) == ([], []), "pyproject.toml changed: run `make lock`"


def test_the_lock_holds_the_weight_packages_and_no_cuda_extras() -> None:
    locked = _locked()
    for line in WEIGHTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().split("==")
            assert locked[canonicalize_name(name)][0] == Version(version)
    # vLLM's CPU build drags these in as CUDA builds that break its import; torch is the CPU one
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(locked)
    assert locked["torch"][0].local == "cpu"
    # one distribution of cv2, the one with the contrib modules (the face check's cascade)
    assert "opencv-python-headless" not in locked
    assert "opencv-contrib-python-headless" in locked


def test_the_license_file_is_the_one_pyproject_names() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (PROJECT_ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_the_launcher_runs_the_local_config_by_default() -> None:
    assert serve_config([]) == CONFIG == PROJECT_ROOT / "configs" / "local.yaml"


def test_the_launcher_takes_a_config_relative_to_the_checkout(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the image starts in /app, a checkout may start elsewhere
    assert serve_config(["configs/production.yaml"]) == (
        PROJECT_ROOT / "configs" / "production.yaml")


def test_the_launcher_refuses_a_config_that_does_not_exist() -> None:
    with pytest.raises(SystemExit, match=r"the Serve config configs/nothing\.yaml does not exist"):
        serve_config(["configs/nothing.yaml"])
