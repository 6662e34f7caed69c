"""vLLM's records of its model classes travel between the data folders of one checkout: a start
brings the records it lacks from the shared folder (vLLM then skips the subprocess that learns
them) and shares what it has after it started; a folder that cannot be read or written costs
the copy only."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from deployments.engines.vllm_model_infos import FOLDER, bring, keep

LLAMA = "vllm-model_executor-models-llama-LlamaForCausalLM.json"
QWEN = "vllm-model_executor-models-qwen2-Qwen2ForCausalLM.json"


def _record(folder: Path, name: str, module_hash: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps({"hash": module_hash, "modelinfo": {"architecture": name}}))
    return path


def test_a_new_data_folder_gets_the_records_an_earlier_start_shared(tmp_path: Path) -> None:
    first, second, shared = tmp_path / "a" / "vllm", tmp_path / "b" / "vllm", tmp_path / "shared"
    _record(first / FOLDER, LLAMA, "h1")

    assert bring(first, shared) == []  # nothing shared yet
    assert keep(first, shared) == [LLAMA]
    assert bring(second, shared) == [LLAMA]
    assert (second / FOLDER / LLAMA).read_bytes() == (first / FOLDER / LLAMA).read_bytes()
    assert keep(second, shared) == []  # the same record: nothing to copy


def test_bring_leaves_a_folders_own_records_and_keep_shares_the_newest(tmp_path: Path) -> None:
    root, shared = tmp_path / "vllm", tmp_path / "shared"
    _record(shared, LLAMA, "old")
    _record(shared, QWEN, "q")
    _record(root / FOLDER, LLAMA, "new")  # vLLM refused the old one and wrote its own

    assert bring(root, shared) == [QWEN]
    assert json.loads((root / FOLDER / LLAMA).read_text())["hash"] == "new"
    assert keep(root, shared) == [LLAMA]
    assert json.loads((shared / LLAMA).read_text())["hash"] == "new"
    assert sorted(p.name for p in shared.iterdir()) == [LLAMA, QWEN]  # no partial file left


def test_a_folder_that_cannot_be_written_costs_the_copy_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "vllm"
    _record(root / FOLDER, LLAMA, "h1")
    blocked = tmp_path / "file-in-the-way"
    blocked.write_text("not a folder")

    with caplog.at_level(logging.INFO, logger="deployments.text"):
        assert keep(root, blocked) == []
    assert "not copied" in caplog.text
    assert bring(tmp_path / "other", tmp_path / "missing") == []
