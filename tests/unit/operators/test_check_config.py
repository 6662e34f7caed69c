"""`inference-admin check-config`: a dry run of a Serve config that passes on the production
config with a cluster's settings, and fails, saying what to set, on broken copies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.cli import run
from serve_app.settings import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"
CLUSTER_SETTINGS = {
    "DATABASE_URL": "postgresql://platform:secret@db.internal:5432/platform",
    "REDIS_URL": "redis://redis.internal:6379/0",
    "RESULT_STORE_URL": "s3://results/platform?endpoint=http://minio.internal:9000",
    "ADMIN_API_KEY": "sk-admin-0123456789abcdefghij",
    "MODEL_CATALOG": str(CONFIGS / "models.production.yaml"),
}


@pytest.fixture
def cluster_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """A cluster's settings in the environment, DATA_DIR an empty folder (the weights to
    mount are not on the machine that runs the check)."""
    for name, value in CLUSTER_SETTINGS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as ended:
        run(["check-config", *argv])
    return ended.value.code, capsys.readouterr().out.splitlines()


def _lines(lines: list[str], level: str) -> list[str]:
    return [line for line in lines if line.startswith(level)]


def _broken_copy(tmp_path: Path, name: str, change) -> Path:
    """A copy of a shipped Serve config with `change(config)` applied."""
    config = yaml.safe_load((CONFIGS / name).read_text())
    change(config)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config))
    return path


def _catalog(tmp_path: Path, *models: dict, include: str = "models.production.yaml") -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"include": [str(CONFIGS / include)],
                                    "models": list(models)}))
    return path


def _chat_model(model_id: str, deployment: str, weights: str, **engine_options) -> dict:
    return {"id": model_id, "type": "text", "name": model_id, "deployment": deployment,
            "engine": "vllm", "weights": weights, "size_class": "L",
            "engine_options": engine_options,
            "pricing": {"input": {"usd": 1, "diem": 1}, "output": {"usd": 2, "diem": 2}}}


def test_the_production_config_passes_with_a_clusters_settings(cluster_env, capsys):
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"))
    assert code == 0, _lines(lines, "ERROR")
    assert _lines(lines, "ERROR") == []
    assert lines[-1].endswith("0 errors, 1 warnings")
    (mount,) = _lines(lines, "WARNING")
    assert "weights of qwen2.5-vl-7b-instruct: TO MOUNT" in mount
    assert "models/Qwen2.5-VL-7B-Instruct on the volume every node running text-m" in mount
    assert any("engine arguments: 2 vLLM models name only engine arguments of vLLM" in line
               for line in lines)
    assert any(line.startswith("OK      deployment text-m: a replica asks 4 CPU, 1 GPU: fits "
                               "cluster.yaml gpu_worker") for line in lines)
    for setting in ("DATABASE_URL", "REDIS_URL", "RESULT_STORE_URL", "ADMIN_API_KEY"):
        assert any(line.startswith(f"OK      {setting}:") for line in lines), setting


def test_the_local_config_passes_on_one_machine(monkeypatch, tmp_path, capsys):
    for name in CLUSTER_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    code, lines = _check(capsys, str(CONFIGS / "local.yaml"))
    assert code == 0, _lines(lines, "ERROR")
    assert any("one node: the SQLite file and DATA_DIR/results are fine" in line
               for line in lines)


def test_sqlite_and_no_shared_store_on_several_nodes_fail_saying_what_to_set(
        cluster_env, capsys):
    for name in ("DATABASE_URL", "RESULT_STORE_URL", "REDIS_URL"):
        cluster_env.delenv(name)
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"))
    assert code == 1
    errors = "\n".join(_lines(lines, "ERROR"))
    assert "DATABASE_URL: a SQLite file (DATA_DIR/platform.db) that each node would keep " \
           "for itself: set DATABASE_URL=postgresql://" in errors
    assert "RESULT_STORE_URL: unset" in errors and "set RESULT_STORE_URL=s3://" in errors
    assert "set REDIS_URL=redis://" in errors


def test_the_test_weight_catalog_on_several_nodes_fails(cluster_env, capsys):
    cluster_env.setenv("MODEL_CATALOG", str(CONFIGS / "models.yaml"))
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"))
    assert code == 1
    (error,) = _lines(lines, "ERROR")
    assert "test-weight models ['instruct-pix2pix-test'," in error
    assert "set MODEL_CATALOG=configs/models.production.yaml" in error


def test_an_unknown_engine_option_fails_naming_the_model_and_option(
        cluster_env, tmp_path, capsys):
    catalog = _catalog(tmp_path, _chat_model("big-chat", "text-l", "${DATA_DIR}/models/big",
                                             gpu_memory_utilisation=0.9))
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"), "--catalog", str(catalog))
    assert code == 1
    (error,) = _lines(lines, "ERROR")
    assert "catalog" in error and "model 'big-chat': engine option 'gpu_memory_utilisation' " \
                                  "is not an engine argument of vLLM" in error
    assert "did you mean 'gpu_memory_utilization'?" in error


def test_missing_weights_fail_on_one_node(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("MODEL_CATALOG", raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    catalog = _catalog(tmp_path, _chat_model("mine", "text-xs", "${DATA_DIR}/models/mine"),
                       include="models.yaml")
    code, lines = _check(capsys, str(CONFIGS / "local.yaml"), "--catalog", str(catalog))
    assert code == 1
    (error,) = _lines(lines, "ERROR")
    assert f"weights of mine: missing: {tmp_path}/models/mine does not exist" in error


def test_gpu_counts_that_fit_no_node_type_fail(cluster_env, tmp_path, capsys):
    def eight_gpus(config: dict) -> None:
        (app,) = config["applications"]
        (text_m,) = [d for d in app["deployments"] if d["name"] == "text-m"]
        text_m["ray_actor_options"]["num_gpus"] = 8

    config = _broken_copy(tmp_path, "production.yaml", eight_gpus)
    code, lines = _check(capsys, str(config))
    assert code == 1
    errors = _lines(lines, "ERROR")
    assert len(errors) == 2  # cluster.yaml's node types, and the KubeRay manifest's
    assert errors[0].startswith("ERROR   deployment text-m: a replica asks 4 CPU, 8 GPU: no "
                                "node type of cluster.yaml has that (head 4 CPU, 0 GPU;")
    assert "give a node type more or the deployment less" in errors[0]
    assert "no node type of deploy/kubernetes/base/rayservice.yaml has that" in errors[1]


def test_a_tensor_parallel_model_needs_as_many_gpus_in_its_bundles(
        cluster_env, tmp_path, capsys):
    catalog = _catalog(tmp_path, _chat_model("big-chat", "text-l", "${DATA_DIR}/models/big",
                                             tensor_parallel_size=4))
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"), "--catalog", str(catalog))
    assert code == 1
    (error,) = _lines(lines, "ERROR")
    assert "deployment text-l: its models' engines run on 4 GPUs" in error
    assert "the replica's bundles give 2: set placement_group_bundles: [{CPU: 8.0, GPU: " \
           "1.0}, {GPU: 1.0}, {GPU: 1.0}, {GPU: 1.0}]" in error


def test_an_engine_its_deployment_does_not_run_fails(cluster_env, tmp_path, capsys):
    model = _chat_model("big-chat", "text-l", "${DATA_DIR}/models/big")
    catalog = _catalog(tmp_path, {**model, "engine": "vlm"})
    code, lines = _check(capsys, str(CONFIGS / "production.yaml"), "--catalog", str(catalog))
    assert code == 1
    (error,) = _lines(lines, "ERROR")
    assert "engine of big-chat: deployment text-l has no engine 'vlm'; its engines: [" in error
    assert "'vllm'" in error
