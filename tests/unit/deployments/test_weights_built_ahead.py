"""Weights built ahead: `python -m deployments.weights prebuild` (run by `make install`) builds
one folder per builder the catalog names, and a model's weights on a new data folder are then
a copy of that folder instead of a second build; a folder left unfinished is never copied."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from deployments.weights.__main__ import main
from deployments.weights.registry import prepare_weights
from deployments.weights.store import copy_prebuilt, is_built, marker


def _catalog(tmp_path: Path) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [
        {"id": "sd-a", "weights": "${DATA_DIR}/models/sd-a",
         "engine_options": {"build": "tiny-sd"}},
        {"id": "sd-b", "weights": "${DATA_DIR}/models/sd-b",
         "engine_options": {"build": "tiny-sd", "steps": 2}},
        {"id": "shipped", "weights": "/nowhere/needed"},
    ]}), encoding="utf-8")
    return path


def _made_ahead(root: Path) -> Path:
    """A complete folder built ahead for `tiny-sd`, told apart from a build by its file."""
    ahead = root / "tiny-sd"
    ahead.mkdir(parents=True)
    (ahead / "made-ahead.txt").write_text("from make install")
    marker(ahead).write_text(json.dumps({"seed": 0}))
    return ahead


def _built_here(folder: Path) -> bool:
    return is_built(folder) and (folder / "model_index.json").exists() \
        and not (folder / "made-ahead.txt").exists()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_prebuild_builds_each_named_builder_once_into_its_own_folder(tmp_path: Path) -> None:
    ahead = tmp_path / "ahead"
    assert main(["prebuild", "--catalog", str(_catalog(tmp_path)), "--into", str(ahead)]) == 0
    assert sorted(p.name for p in ahead.iterdir() if p.is_dir()) == ["tiny-sd"]
    assert is_built(ahead / "tiny-sd")
    record = json.loads(marker(ahead / "tiny-sd").read_text())
    assert record["pipeline"] == "StableDiffusionPipeline"

    # a new data folder gets a copy: every file, the marker's record too
    folder = prepare_weights(str(tmp_path / "data" / "sd-a"), {"build": "tiny-sd"}, ahead)
    assert _files(folder) == _files(ahead / "tiny-sd")


def test_a_folder_built_ahead_is_copied_rather_than_built_again(tmp_path: Path) -> None:
    ahead = _made_ahead(tmp_path / "ahead")

    folder = prepare_weights(str(tmp_path / "data" / "sd"), {"build": "tiny-sd"}, ahead.parent)
    assert sorted(p.name for p in folder.iterdir()) == [".complete", "made-ahead.txt"]
    assert json.loads(marker(folder).read_text()) == {"seed": 0}


def test_an_unfinished_folder_built_ahead_is_not_copied(tmp_path: Path) -> None:
    ahead = tmp_path / "ahead" / "tiny-sd"
    ahead.mkdir(parents=True)
    (ahead / "half-written.bin").write_bytes(b"\0" * 16)  # an install cut short: no marker

    assert copy_prebuilt(ahead, tmp_path / "copy") is False
    assert not (tmp_path / "copy").exists()
    folder = prepare_weights(str(tmp_path / "data" / "sd"), {"build": "tiny-sd"}, ahead.parent)
    assert _built_here(folder) and not (folder / "half-written.bin").exists()


def test_a_folder_rebuilt_while_it_is_copied_is_built_here_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = _made_ahead(tmp_path / "ahead")
    copy2 = shutil.copy2

    def make_swaps_it_in(src, dst, **kwargs):  # `make` replaces the folder mid-copy
        fresh = marker(ahead).with_suffix(".new")
        fresh.write_text(json.dumps({"seed": 0}))
        os.replace(fresh, marker(ahead))
        return copy2(src, dst, **kwargs)

    monkeypatch.setattr(shutil, "copy2", make_swaps_it_in)
    folder = prepare_weights(str(tmp_path / "data" / "sd"), {"build": "tiny-sd"}, ahead.parent)
    assert _built_here(folder)


def test_a_folder_removed_while_it_is_copied_is_built_here_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ahead = _made_ahead(tmp_path / "ahead")

    def gone(src, dst, **kwargs):
        raise FileNotFoundError(src)

    monkeypatch.setattr(shutil, "copy2", gone)
    assert copy_prebuilt(ahead, tmp_path / "copy") is False
    assert not is_built(tmp_path / "copy")
    monkeypatch.undo()
    folder = prepare_weights(str(tmp_path / "copy"), {"build": "tiny-sd"}, ahead.parent)
    assert is_built(folder) and (folder / "made-ahead.txt").exists()  # the next start copies


def test_starts_at_once_copy_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ahead = _made_ahead(tmp_path / "ahead")
    target = tmp_path / "data" / "sd"
    got: list[Path] = []
    starts = [threading.Thread(target=lambda: got.append(prepare_weights(
        str(target), {"build": "tiny-sd"}, ahead.parent))) for _ in range(3)]
    for start in starts:
        start.start()
    for start in starts:
        start.join()
    assert got == [target] * 3
    assert _files(target) == _files(ahead)
    assert capsys.readouterr().err.count("Copying the weights built ahead") == 1


def test_a_complete_data_folder_is_left_as_it_is(tmp_path: Path) -> None:
    ahead = _made_ahead(tmp_path / "ahead")
    target = tmp_path / "data" / "sd"
    target.mkdir(parents=True)
    (target / "mine.txt").write_text("built here before")
    marker(target).write_text("{}")

    assert prepare_weights(str(target), {"build": "tiny-sd"}, ahead.parent) == target
    assert sorted(p.name for p in target.iterdir()) == [".complete", "mine.txt"]
