"""cluster.yaml as `ray up` reads it: Ray's autoscaler schema, node types that hold every
deployment of configs/production.yaml, the settings file every node is started with, and a
sync that leaves the checkout's local state behind."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from ray.autoscaler._private.command_runner import SSHCommandRunner
from ray.autoscaler._private.util import fillout_defaults, validate_config

from serve_app.settings import PROJECT_ROOT
from tests.unit.deploy.serve_options import (
    STREAMING_DEPLOYMENTS,
    deployments,
    longest_stream_s,
    replica_resources,
)

CLUSTER = PROJECT_ROOT / "cluster.yaml"
ENV_EXAMPLE = PROJECT_ROOT / "deploy" / "ray-cluster" / "platform.env.example"
# What a cluster of several nodes cannot do without (docs/operators/settings.md).
CLUSTER_SETTINGS = {"DATABASE_URL", "REDIS_URL", "ADMIN_API_KEY", "DATA_DIR", "RESULT_STORE_URL",
                    "MODEL_CATALOG"}


def _load(path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _documented_settings() -> set[str]:
    table = (PROJECT_ROOT / "docs" / "operators" / "settings.md").read_text(encoding="utf-8")
    return {name for row in re.findall(r"^\| (`[A-Z0-9_]+`(?:, `[A-Z0-9_]+`)*) \|", table, re.M)
            for name in re.findall(r"`([A-Z0-9_]+)`", row)}


def _env_file(path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_cluster_yaml_passes_the_autoscaler_schema():
    raw = _load(CLUSTER)
    validate_config(fillout_defaults(raw))
    assert raw["head_node_type"] in raw["available_node_types"]


def test_every_node_type_states_its_resources():
    for name, node_type in _load(CLUSTER)["available_node_types"].items():
        resources = node_type["resources"]
        assert isinstance(resources.get("CPU"), int) and resources["CPU"] > 0, name
        assert isinstance(resources.get("GPU"), int), name


def test_every_production_deployment_fits_a_node_type():
    """text-l's two GPUs included: a replica that fits no node type never starts."""
    node_types = _load(CLUSTER)["available_node_types"]
    options = deployments(_load(PROJECT_ROOT / "configs" / "production.yaml"))
    assert replica_resources(options["text-l"])[1] == 2
    for name, option in options.items():
        cpus, gpus = replica_resources(option)
        assert any(cpus <= t["resources"]["CPU"] and gpus <= t["resources"]["GPU"]
                   for t in node_types.values()), (name, cpus, gpus)


def test_the_sync_leaves_local_state_and_builds_behind(tmp_path):
    """rsync run with the arguments `ray up` builds from cluster.yaml, on a checkout-like tree."""
    rsync = shutil.which("rsync")
    if rsync is None:
        pytest.skip("rsync is not installed: the launcher's sync is not tried")
    raw = _load(CLUSTER)
    assert raw["file_mounts"]["/home/ubuntu/inference-platform"] == "."
    checkout = tmp_path / "checkout"
    kept = ["serve_app/app.py", "configs/models.yaml", "console/dist/index.html",
            "deployments/weights/data/kept.txt", "requirements/weights.txt"]
    left = [".venv/bin/python", "data/platform.db", ".cache/weights/.complete",
            "console/node_modules/vite/index.js", "site/index.html", "platform.env",
            ".git/HEAD", "test-artifacts/multinode.json"]
    for name in kept + left:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("x", encoding="utf-8")
    runner = SSHCommandRunner("", "node", None, raw["auth"], raw["cluster_name"], subprocess,
                              False)
    arguments = runner._create_rsync_filter_args(
        {"rsync_exclude": raw.get("rsync_exclude"), "rsync_filter": raw.get("rsync_filter")})
    subprocess.run([rsync, "-a", *arguments, f"{checkout}/", f"{tmp_path / 'node'}/"],
                   check=True)
    synced = {p.relative_to(tmp_path / "node").as_posix()
              for p in (tmp_path / "node").rglob("*") if p.is_file()}
    assert synced == set(kept)


def test_every_node_is_started_with_the_settings_file_it_was_given():
    raw = _load(CLUSTER)
    (remote,) = [r for r, local in raw["file_mounts"].items() if local == "./platform.env"]
    assert remote == "/home/ubuntu/platform.env"
    # a node without the file stops at its setup, saying what to do
    assert "test -s ~/platform.env" in raw["setup_commands"][0]
    assert ENV_EXAMPLE.relative_to(PROJECT_ROOT).as_posix() in raw["setup_commands"][0]
    for commands in (raw["head_start_ray_commands"], raw["worker_start_ray_commands"]):
        start = commands[-1]
        # exported (set -a), so that the processes `ray start` forks read it
        assert "set -a && . ~/platform.env && set +a" in start
        assert start.index("platform.env") < start.index("ray start")


def test_the_settings_file_template_holds_documented_settings_a_cluster_needs():
    settings = _env_file(ENV_EXAMPLE)
    assert set(settings) <= _documented_settings(), set(settings) - _documented_settings()
    assert set(settings) >= CLUSTER_SETTINGS
    assert settings["DATABASE_URL"].startswith("postgresql://")
    assert settings["RESULT_STORE_URL"].startswith("s3://")  # nodes share no disk
    assert (PROJECT_ROOT / settings["MODEL_CATALOG"]).is_file()


def test_setup_installs_the_gpu_environment_from_files_the_checkout_has():
    setup = " ".join(_load(CLUSTER)["setup_commands"])
    assert '-e ".[gpu]"' in setup
    for requirements in re.findall(r"-r (\S+)", setup):
        assert (PROJECT_ROOT / requirements).is_file(), requirements
    assert "deployments.weights prebuild" in setup


def test_ray_listens_beside_redis_and_exports_metrics_on_one_port():
    raw = _load(CLUSTER)
    head, worker = raw["head_start_ray_commands"][-1], raw["worker_start_ray_commands"][-1]
    assert "--port=6380" in head and ":6380" in worker  # 6379 is Redis's
    ports = {arg for command in (head, worker) for arg in shlex.split(command)
             if arg.startswith("--metrics-export-port=")}
    assert len(ports) == 1, ports


def test_a_stopped_replica_waits_for_the_longest_stream():
    options = deployments(_load(PROJECT_ROOT / "configs" / "production.yaml"))
    longest = longest_stream_s(PROJECT_ROOT / "configs" / "models.production.yaml")
    for name in STREAMING_DEPLOYMENTS:
        assert options[name]["graceful_shutdown_timeout_s"] >= longest, (name, longest)


def test_every_command_is_valid_shell():
    """The launcher runs each command with bash on the node: a quoting slip fails `ray up`
    halfway through a node's setup."""
    raw = _load(CLUSTER)
    for key in ("setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands"):
        for command in raw[key]:
            checked = subprocess.run(["bash", "-n", "-c", command], capture_output=True,
                                     text=True, check=False)
            assert checked.returncode == 0, (key, command, checked.stderr)
