"""The deployment files, checked the way their tools read them: the Serve configs against
Serve's own config schema (what `serve deploy`/`serve run` load). The cluster launcher config
and the Kubernetes manifests: tests/unit/deploy/."""

from __future__ import annotations

import pytest
import yaml
from ray.serve.schema import DeploymentSchema, ServeDeploySchema

from deployments.registry import (
    MODEL_DEPLOYMENTS,
    TEXT_DEPLOYMENTS,
    deployment_options,
    vllm_cpu_env,
)
from serve_app.app import AppArgs, build_app
from serve_app.settings import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"
GPU_CLASSES = {"text-xs", "text-s", "text-m", "text-l", "image-diffusion", "video-generation"}
MEDIA_CLASSES = {"image-upscale", "image-matting", "image-diffusion", "speech", "transcription",
                 "video-generation", "video-enhance"}


def _load(path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _check_serve_config(raw: dict) -> dict[str, dict]:
    """Serve's schema, our app's arguments, and one options entry per model deployment;
    returns the deployments' options by name."""
    config = ServeDeploySchema.model_validate(raw)
    assert config.logging_config.encoding == "JSON"
    (app,) = config.applications
    assert app.import_path == "serve_app.app:build_app" and app.route_prefix == "/"
    args = AppArgs.model_validate(app.args)
    options = {d.name: d.model_dump(exclude_unset=True) for d in app.deployments}
    assert set(options) == {"Gateway", "KeyEventHub", *args.model_deployments}
    assert set(args.model_deployments) <= set(MODEL_DEPLOYMENTS)
    for name, option in options.items():
        if name in MODEL_DEPLOYMENTS:  # every engine has a bounded queue
            assert option.get("max_queued_requests", 0) > 0, name
    return options


def test_every_model_deployment_has_its_serve_options_in_configs_deployments_yaml():
    """What a deployment is bound with when no Serve config overrides it (build_app called
    from Python: tests, benchmarks): Serve's schema, and a bounded queue."""
    for name in MODEL_DEPLOYMENTS:
        options = deployment_options(name)
        DeploymentSchema.model_validate({"name": name, **options})
        assert options.get("max_queued_requests", 0) > 0, name
    for name in TEXT_DEPLOYMENTS:
        env = deployment_options(name)["ray_actor_options"]["runtime_env"]["env_vars"]
        assert env == vllm_cpu_env() and env["VLLM_TARGET_DEVICE"] == "cpu", name


@pytest.mark.parametrize("name", ["local.yaml", "production.yaml"])
def test_a_config_running_a_text_class_on_cpus_gives_it_the_vllm_cpu_environment(name):
    """A Serve config's `ray_actor_options` replaces the code's as a whole, so a config that
    sets them for a text class without GPUs repeats configs/deployments.yaml's environment."""
    options = _check_serve_config(_load(CONFIGS / name))
    for deployment in TEXT_DEPLOYMENTS:
        actor = options.get(deployment, {}).get("ray_actor_options")
        on_gpus = actor and (actor.get("num_gpus")  # its own, or its engine's bundles
                             or options[deployment].get("placement_group_bundles"))
        if actor is not None and not on_gpus:
            assert actor["runtime_env"]["env_vars"] == vllm_cpu_env(), (name, deployment)


def test_local_config_runs_on_cpus_only_and_fits_two_cores():
    options = _check_serve_config(_load(CONFIGS / "local.yaml"))
    for name, option in options.items():
        assert not option.get("ray_actor_options", {}).get("num_gpus"), name
    assert {"video-generation", "video-enhance", "speech", "embedding"} <= set(options)
    # `make run` offers Ray the machine's cores: on a 2-core laptop every replica must be
    # placed, or the Gateway waits forever for a slot
    reserved = sum(option.get("ray_actor_options", {}).get("num_cpus", 1)
                   * option.get("autoscaling_config", {}).get(
                       "min_replicas", option.get("num_replicas", 1))
                   for option in options.values())
    assert reserved <= 2, reserved


def test_make_run_loads_the_chat_engine_alone_first_then_the_whole_local_config():
    from serve_app.launch import deferred_deployments, first_stage
    from serve_app.models.catalog import load_catalog

    config = _load(CONFIGS / "local.yaml")
    deferred = deferred_deployments(config, load_catalog(CONFIGS / "models.yaml"))
    assert "text-xs" not in deferred
    assert {"embedding", "image-upscale", "speech", "video-generation"} <= deferred
    first = _check_serve_config(first_stage(config, deferred))
    whole = _check_serve_config(config)
    for name, option in first.items():
        if name in deferred:  # no replica until the second stage, or a request, asks for one
            assert option["autoscaling_config"]["min_replicas"] == 0, name
            assert option["autoscaling_config"]["initial_replicas"] == 0, name
            assert option["autoscaling_config"]["max_replicas"] >= 1, name
            assert option["ray_actor_options"] == whole[name]["ray_actor_options"], name
        else:  # the running replicas are left alone when the whole config follows
            assert option == whole[name], name


def test_production_config_puts_the_heavy_engines_on_gpus_and_autoscales():
    options = _check_serve_config(_load(CONFIGS / "production.yaml"))
    assert {"text-xs", "text-s", "text-m", "text-l"} <= set(options)
    for name in GPU_CLASSES:  # the replica's own GPU, or its engine's bundles (text-l)
        bundles = options[name].get("placement_group_bundles") or [options[name][
            "ray_actor_options"]]
        assert sum(b.get("GPU", b.get("num_gpus", 0)) for b in bundles) >= 1, name
    for name, option in options.items():
        if name != "KeyEventHub":
            scaling = option["autoscaling_config"]
            # media engines scale to zero when idle (a request then waits for the cold
            # start: serve_app/models/calls.py); the Gateway, text and embeddings never do
            lowest = 0 if name in MEDIA_CLASSES else 1
            assert lowest <= scaling["min_replicas"] <= scaling["max_replicas"], name
    assert {n for n in MEDIA_CLASSES if
            options[n]["autoscaling_config"]["min_replicas"] == 0} == MEDIA_CLASSES
    assert options["Gateway"]["autoscaling_config"]["min_replicas"] >= 2


@pytest.mark.parametrize("name", ["local.yaml", "production.yaml"])
def test_every_model_deployment_of_a_config_has_catalog_models_or_is_skipped(name):
    from serve_app.models.catalog import load_catalog

    catalog = load_catalog(CONFIGS / "models.yaml")
    args = AppArgs.model_validate(_load(CONFIGS / name)["applications"][0]["args"])
    served = {d for d in args.model_deployments if any(m.deployment == d
                                                       for m in catalog.models)}
    assert {"text-xs", "embedding", "speech", "video-generation"} <= served


def test_model_replicas_get_their_models_and_no_secret(tmp_path):
    """A model deployment is bound with the models it serves and nothing of the platform's
    settings: no admin key, database URL or provider key reaches a model replica, and the
    Gateway's replicas are not given the admin key (only the first start needs it)."""
    secrets = {"admin_api_key": "sk-test-admin-secret-000000000001",
               "web_search_api_key": "search-provider-secret",
               "database_url": f"sqlite:///{tmp_path}/database-secret.db"}
    app = build_app({"settings": {"data_dir": str(tmp_path), **secrets},
                     "model_deployments": ["embedding"]})
    gateway_args = app._bound_deployment._replica_config.init_args
    embedding = gateway_args[1]["embedding"]
    (specs,) = embedding._bound_deployment._replica_config.init_args
    assert [spec["id"] for spec in specs] == ["text-embedding-all-minilm-l6-v2"]
    for secret in secrets.values():
        assert secret not in repr(specs)
    assert secrets["admin_api_key"] not in repr(gateway_args[0])
