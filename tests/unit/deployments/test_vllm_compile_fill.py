"""On CPU a text engine starts eager while the compile cache holds nothing for its settings, and
a background process fills the cache; once filled, the engine starts compiled. A catalog's own
`enforce_eager` is kept either way."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from deployments.engines import vllm_compile_fill, vllm_compile_process
from deployments.engines.vllm_compile_fill import choose, is_warm, records, settings_key


@dataclass
class Args:  # the fields of vLLM's engine arguments that matter here
    model: str = "/models/smollm2"
    enforce_eager: bool = False
    max_num_batched_tokens: int | None = 512
    max_num_seqs: int = 10


def cpu(root: Path) -> dict[str, str]:
    return {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(root)}


def fill_done(root: Path, args: Args, artifacts: list[Path]) -> None:
    """What a finished fill leaves: its artifacts and its record."""
    for artifact in artifacts:
        artifact.parent.mkdir(parents=True, exist_ok=True)
        artifact.write_bytes(b"compiled")
    key = settings_key(args)
    (root / "fill").mkdir(parents=True, exist_ok=True)
    (root / "fill" / f"{key}.json").write_text(json.dumps(
        {"key": key, "state": "done", "artifacts": [str(p) for p in artifacts]}))


def artifact(root: Path, digest: str = "abc") -> Path:
    return root / "torch_compile_cache" / "torch_aot_compile" / digest / "rank_0_0" / "model"


def test_a_cold_cache_starts_eager_and_asks_for_a_fill(tmp_path):
    choice = choose(Args(), {}, cpu(tmp_path))

    assert choice.fill is True
    assert choice.args.enforce_eager is True
    assert choice.args.max_num_batched_tokens is None  # vLLM's default for an eager engine
    assert choice.key == settings_key(Args())  # the compiled settings' key, for the fill


def test_a_filled_cache_starts_compiled(tmp_path):
    fill_done(tmp_path, Args(), [artifact(tmp_path)])

    choice = choose(Args(), {}, cpu(tmp_path))

    assert choice.fill is False
    assert choice.args == Args()


def test_a_fill_of_other_settings_leaves_the_cache_cold(tmp_path):
    fill_done(tmp_path, Args(max_num_seqs=4), [artifact(tmp_path)])

    assert choose(Args(), {}, cpu(tmp_path)).fill is True


def test_a_record_whose_artifact_is_gone_is_cold(tmp_path):
    fill_done(tmp_path, Args(), [artifact(tmp_path)])
    artifact(tmp_path).unlink()

    assert is_warm(tmp_path, settings_key(Args())) is False
    assert choose(Args(), {}, cpu(tmp_path)).args.enforce_eager is True


def test_a_running_or_failed_fill_is_cold(tmp_path):
    key = settings_key(Args())
    (tmp_path / "fill").mkdir()
    for state in ("compiling", "failed"):
        (tmp_path / "fill" / f"{key}.json").write_text(json.dumps({"state": state}))
        assert is_warm(tmp_path, key) is False


@pytest.mark.parametrize("eager", [True, False])
def test_a_catalogs_own_enforce_eager_is_kept_on_a_cold_cache(tmp_path, eager):
    choice = choose(Args(enforce_eager=eager), {"enforce_eager": eager}, cpu(tmp_path))

    assert choice.args.enforce_eager is eager
    assert choice.fill is False


def test_the_rule_holds_only_on_cpu_with_a_cache_that_is_kept(tmp_path):
    gpu = {"VLLM_CACHE_ROOT": str(tmp_path)}
    nowhere = {"VLLM_TARGET_DEVICE": "cpu"}
    disabled = {**cpu(tmp_path), "VLLM_DISABLE_COMPILE_CACHE": "1"}

    for env in (gpu, nowhere, disabled):
        choice = choose(Args(), {}, env)
        assert choice.args.enforce_eager is False and choice.fill is False


def test_the_key_ignores_only_enforce_eager():
    assert settings_key(Args(enforce_eager=True)) == settings_key(Args())
    assert settings_key(Args(max_num_batched_tokens=2048)) != settings_key(Args())


class FakePopen:
    def __init__(self, command, **kwargs):
        self.command, self.kwargs = command, kwargs


def test_the_fill_runs_the_same_model_and_options_in_the_background(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_compile_fill.subprocess, "Popen", FakePopen)
    env = {**cpu(tmp_path), "DATA_DIR": str(tmp_path)}

    started = vllm_compile_fill.start_fill("/models/smollm2", {"max_model_len": 2048}, "k1", env)

    assert started.command == [sys.executable, "-m", "deployments.engines.vllm_compile_process",
                               "/models/smollm2", '{"max_model_len": 2048}', "k1"]
    assert started.kwargs["env"] == env and started.kwargs["start_new_session"] is True
    # recorded before the process runs, so the launcher can say so at once
    (record,) = records(tmp_path)
    assert record["state"] == "compiling" and record["model"] == "smollm2"
    assert record["log"] == str(tmp_path / "fill" / "k1.log")


def idle_fill(monkeypatch, tmp_path, engine_key: str) -> list[dict]:
    """main() in process, with an engine that leaves an artifact as vLLM's compile does."""
    from deployments.engines import text

    started: list[dict] = []

    class CompilingEngine:
        def __init__(self, model_path: str, options: dict) -> None:
            started.append(options)
            artifact(tmp_path, "new").parent.mkdir(parents=True, exist_ok=True)
            artifact(tmp_path, "new").write_bytes(b"compiled")
            self.compile_key = engine_key

        def shutdown(self) -> None:
            pass

    monkeypatch.setattr(text, "VLLMEngine", CompilingEngine)
    monkeypatch.setattr(vllm_compile_process.os, "nice", lambda _n: 0)
    monkeypatch.setattr(vllm_compile_process.os, "sched_setscheduler", lambda *_a: None)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    return started


def test_a_finished_fill_records_the_artifacts_it_left(tmp_path, monkeypatch):
    key = settings_key(Args())
    artifact(tmp_path, "other").parent.mkdir(parents=True)
    artifact(tmp_path, "other").write_bytes(b"another model's")
    started = idle_fill(monkeypatch, tmp_path, key)

    assert vllm_compile_process.main(["/models/smollm2", '{"max_model_len": 256}', key]) == 0

    assert started == [{"max_model_len": 256, "enforce_eager": False}]  # compiled
    (record,) = records(tmp_path)
    assert record["state"] == "done" and record["artifacts"] == [str(artifact(tmp_path, "new"))]
    assert choose(Args(), {}, cpu(tmp_path)).fill is False  # the next start runs compiled


def test_a_fill_that_compiled_other_settings_records_a_failure(tmp_path, monkeypatch):
    key = settings_key(Args())
    idle_fill(monkeypatch, tmp_path, "another-key")

    with pytest.raises(RuntimeError):
        vllm_compile_process.main(["/models/smollm2", "{}", key])

    assert vllm_compile_fill.read_record(tmp_path, key)["state"] == "failed"
    assert is_warm(tmp_path, key) is False


def test_make_run_tells_when_a_fill_starts_and_ends():
    from serve_app.launch import fill_news

    told: dict[str, str] = {}
    compiling = {"key": "k1", "state": "compiling", "model": "smollm2", "started": 10.0,
                 "log": "/data/cache/vllm/fill/k1.log"}
    earlier = {"key": "k0", "state": "compiling", "model": "old", "started": 1.0}

    ((_, started),) = fill_news([compiling, earlier], told, since=5.0)
    again = fill_news([compiling], told, since=5.0)
    ((record, done),) = fill_news([{**compiling, "state": "done", "seconds": 95.2}], told,
                                  since=5.0)

    assert "smollm2" in started and "eager" in started and compiling["log"] in started
    assert again == []  # each state once; a fill from an earlier start is not told
    assert "compiled in the background in 95s" in done and "without a restart" not in done
    assert "moving chat onto it" in done
    assert record["state"] == "done" and record["key"] == "k1"  # what the launcher rolls on
