"""What `make run` (serve_app/launch.py) does for an idle platform and a finished compile:
the media deployments of configs/local.yaml run no replica until used, the Ray processes get
the settings that keep them quiet, the engines a lower CPU priority than the request path, and
a chat deployment whose compile finished is deployed again with compiled replicas that start
beside the eager one."""

from __future__ import annotations

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.registry import vllm_cpu_env
from serve_app.launch import (
    COMPILED_ENV,
    always_running,
    compiled_config,
    compiled_deployments,
    deferred_deployments,
    ray_environment,
)
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT, Settings

CONFIGS = PROJECT_ROOT / "configs"
MEDIA = {"image-upscale", "image-matting", "image-diffusion", "speech", "transcription",
         "video-generation", "video-enhance"}


@pytest.fixture(scope="module")
def local() -> dict:
    return yaml.safe_load((CONFIGS / "local.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(CONFIGS / "models.yaml")


def _deployments(config: dict) -> dict[str, dict]:
    return {d["name"]: d for app in config["applications"] for d in app["deployments"]}


def test_the_media_deployments_start_on_first_use_and_the_rest_always_runs(local, catalog):
    deferred = deferred_deployments(local, catalog)
    assert deferred >= MEDIA
    running = always_running(local, deferred)
    assert running == deferred - MEDIA == {"embedding"}  # the second stage waits for it only
    assert always_running(local, ["Gateway", "KeyEventHub", "text-xs"]) == {
        "Gateway", "KeyEventHub", "text-xs"}
    for name in MEDIA:  # a request can still start one: at most one replica on two cores
        scaling = _deployments(local)[name]["autoscaling_config"]
        assert scaling["min_replicas"] == scaling["initial_replicas"] == 0, name
        assert scaling["max_replicas"] == 1, name


def test_ray_gets_quieter_intervals_and_the_engines_the_lowest_priority(monkeypatch, tmp_path):
    for name in ("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS",
                 "ENGINE_NICENESS", "RAY_worker_niceness"):
        monkeypatch.delenv(name, raising=False)
    env = ray_environment(Settings(data_dir=tmp_path))
    assert float(env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) > 0.1  # Serve's default
    assert int(env["RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"]) > 100
    assert env["ENGINE_NICENESS"] == "19"
    assert env["RAY_worker_niceness"] == "0"  # the Gateway at the normal priority (Ray: 15)
    # an operator's own values win
    monkeypatch.setenv("ENGINE_NICENESS", "0")
    monkeypatch.setenv("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.1")
    monkeypatch.setenv("RAY_worker_niceness", "15")
    env = ray_environment(Settings(data_dir=tmp_path))
    assert env["ENGINE_NICENESS"] == "0" and env["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"] == "0.1"
    assert env["RAY_worker_niceness"] == "15"


def test_a_finished_compile_moves_its_chat_deployment_onto_compiled_replicas(local, catalog,
                                                                             tmp_path):
    # a fill's record names the model by its weights folder
    names = compiled_deployments(local, catalog, tmp_path, "smollm2-135m-instruct")
    assert names == {"text-xs"}
    assert compiled_deployments(local, catalog, tmp_path, "another-model") == set()

    rolled = compiled_config(local, names, "k1")
    ServeDeploySchema.model_validate(rolled)  # what Serve is given
    before, after = _deployments(local), _deployments(rolled)
    text = after["text-xs"]
    # new actor options: Serve replaces the replica; the old one serves until the new is ready
    assert text["ray_actor_options"]["runtime_env"]["env_vars"] == {
        **vllm_cpu_env(), COMPILED_ENV: "k1"}
    assert text["max_surge_percent"] == 100
    assert {k: v for k, v in text.items() if k not in ("ray_actor_options",
                                                       "max_surge_percent")} == {
        k: v for k, v in before["text-xs"].items() if k != "ray_actor_options"}
    assert {n: d for n, d in after.items() if n != "text-xs"} == {
        n: d for n, d in before.items() if n != "text-xs"}
    assert COMPILED_ENV not in str(local)  # the config given is left as it was
    # a second compile of the same deployment: a new key, replaced again
    again = compiled_config(rolled, names, "k2")
    assert _deployments(again)["text-xs"]["ray_actor_options"]["runtime_env"]["env_vars"][
        COMPILED_ENV] == "k2"


def test_a_chat_deployment_without_actor_options_in_the_config_keeps_the_codes():
    config = {"applications": [{"name": "inference", "import_path": "serve_app.app:build_app",
                                "deployments": [{"name": "text-xs"}]}]}
    (text,) = compiled_config(config, {"text-xs"}, "k1")["applications"][0]["deployments"]
    env = text["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == {**vllm_cpu_env(), COMPILED_ENV: "k1"}
