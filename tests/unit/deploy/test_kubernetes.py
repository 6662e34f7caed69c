"""deploy/kubernetes as the cluster takes it: each overlay rendered by `kubectl kustomize`, every
object valid for the API server, and the RayService wired to the image, the volume, the
settings, the probes and the metrics port the platform really has."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from deployments.registry import TEXT_DEPLOYMENTS, vllm_cpu_env
from serve_app.app import AppArgs
from serve_app.settings import PROJECT_ROOT
from tests.unit.deploy.kubernetes_manifests import (
    KUBERNETES,
    OVERLAYS,
    one,
    ray_pods,
    render,
    validate,
)
from tests.unit.deploy.serve_options import (
    STREAMING_DEPLOYMENTS,
    deployments,
    longest_stream_s,
    replica_resources,
)

CONFIGS = PROJECT_ROOT / "configs"
SERVE_PORT = 8000
# The image every Ray container names in the sources: kustomize's `images:` replaces it.
IMAGE_VARIABLE = "inference-platform"


def _load(path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = group["template"]["spec"]["containers"]
    return containers


def _serve_config(ray_service: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(ray_service["spec"]["serveConfigV2"])
    return config


def _settings(objects: list[dict[str, Any]]) -> dict[str, str]:
    settings: dict[str, str] = one(objects, "ConfigMap")["data"]
    return settings


def _cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_for_kubernetes_and_kuberay(overlay):
    objects = render(overlay)
    assert {"RayService", "PersistentVolumeClaim", "ConfigMap"} <= {o["kind"] for o in objects}
    for manifest in objects:
        validate(manifest)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_ray_container_runs_the_one_image_the_overlay_names(overlay):
    kustomization = _load(KUBERNETES / "overlays" / overlay / "kustomization.yaml")
    (image,) = [i for i in kustomization["images"] if i["name"] == IMAGE_VARIABLE]
    ray_service = one(render(overlay), "RayService")
    for name, group in ray_pods(ray_service).items():
        for container in _containers(group):
            assert container["image"] == f"{image['newName']}:{image['newTag']}", name


def test_the_sources_name_the_image_only_through_the_variable():
    for path in KUBERNETES.rglob("rayservice.yaml"):
        for name, group in ray_pods(_load(path)).items():
            for container in _containers(group):
                assert container["image"] == IMAGE_VARIABLE, (path, name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_data_volume_is_mounted_at_data_dir_on_the_head_and_every_worker(overlay):
    objects = render(overlay)
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    assert "inference-platform-data" in claims
    data_dir = _settings(objects)["DATA_DIR"]
    ray_service = one(objects, "RayService")
    for name, group in ray_pods(ray_service).items():
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        (container,) = _containers(group)
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volume = volumes[mounts[data_dir]]
        assert volume["persistentVolumeClaim"]["claimName"] == "inference-platform-data", name
        # the settings reach every Ray container, the secrets too
        sources = {ref.get("configMapRef", ref.get("secretRef"))["name"]
                   for ref in container["envFrom"]}
        assert {one(objects, "ConfigMap")["metadata"]["name"], "inference-platform"} <= sources
    # a shared result store: every Gateway replica sees every job's files
    store = PurePosixPath(_settings(objects)["RESULT_STORE_URL"].removeprefix("file://"))
    assert store.is_relative_to(data_dir)


def test_the_production_volume_is_shared_by_pods_on_several_nodes():
    assert one(render("gpu"), "PersistentVolumeClaim")["spec"]["accessModes"] == [
        "ReadWriteMany"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_worker_serves_while_its_proxy_reaches_a_gateway_and_the_head_keeps_kuberays_probes(
        overlay):
    """Readiness on /health, a pod's own path to a Gateway; not /ready, whose checks of what
    every pod shares (database, Redis, default models scaled to zero) would empty the Service
    at once; KubeRay moves the Service to a cluster only once its applications run."""
    ray_service = one(render(overlay), "RayService")
    for name, group in ray_pods(ray_service).items():
        (container,) = _containers(group)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["serve"] == SERVE_PORT, name
        if name == "head":
            # KubeRay deploys the Serve config only once the head is ready: a probe that
            # needs the deployed application there would never let it
            assert "readinessProbe" not in container and "livenessProbe" not in container
            continue
        probe = container["readinessProbe"]["httpGet"]
        assert probe["path"] == "/health" and ports[probe["port"]] == SERVE_PORT, name
        assert "livenessProbe" not in container, name  # KubeRay's (the raylet answers) stays
    assert ray_service["spec"]["excludeHeadPodFromServeSvc"] is True
    (port,) = ray_service["spec"]["serveService"]["spec"]["ports"]
    assert port["name"] == "serve" and port["port"] == SERVE_PORT


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_metrics_port_is_the_one_ray_exports_on(overlay):
    objects = render(overlay)
    ray_service = one(objects, "RayService")
    for name, group in ray_pods(ray_service).items():
        (container,) = _containers(group)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["metrics"] == int(group["rayStartParams"]["metrics-export-port"]), name
    for monitor in (o for o in objects if o["kind"] == "PodMonitor"):
        selected = monitor["spec"]["selector"]["matchLabels"]
        for name, group in ray_pods(ray_service).items():
            assert selected.items() <= group["template"]["metadata"]["labels"].items(), name
        assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]


def test_gpu_overlay_scrapes_metrics_and_routes_an_ingress_to_the_serve_service():
    objects = render("gpu")
    assert one(objects, "PodMonitor")
    ray_service = one(objects, "RayService")
    service = ray_service["spec"]["serveService"]
    backend = one(objects, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert backend["service"]["name"] == service["metadata"]["name"]
    assert backend["service"]["port"]["name"] == service["spec"]["ports"][0]["name"]
    # a stream outlives no proxy timeout
    annotations = one(objects, "Ingress")["metadata"]["annotations"]
    gateway = deployments(_serve_config(ray_service))["Gateway"]
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= gateway[
        "graceful_shutdown_timeout_s"]


def test_kuberay_threshold_fields_it_ignores_are_gone():
    for overlay in OVERLAYS:
        spec = one(render(overlay), "RayService")["spec"]
        assert "serviceUnhealthySecondThreshold" not in spec
        assert "deploymentUnhealthySecondThreshold" not in spec


def test_gpu_overlay_deploys_configs_production_yaml_as_written():
    ray_service = one(render("gpu"), "RayService")
    assert _serve_config(ray_service) == _load(CONFIGS / "production.yaml")
    assert _settings(render("gpu"))["MODEL_CATALOG"].endswith("configs/models.production.yaml")


def test_cpu_demo_runs_the_local_applications_on_cpus():
    objects = render("cpu-demo")
    config = _serve_config(one(objects, "RayService"))
    local = _load(CONFIGS / "local.yaml")
    (app,), (local_app,) = config["applications"], local["applications"]
    assert AppArgs.model_validate(app["args"]) == AppArgs.model_validate(local_app["args"])
    assert config["http_options"]["port"] == SERVE_PORT
    assert config["proxy_location"] == "EveryNode"  # every worker answers on the Service
    options = deployments(config)
    for name in TEXT_DEPLOYMENTS:
        if name in options:
            actor = options[name]["ray_actor_options"]
            assert not actor.get("num_gpus") and actor["runtime_env"]["env_vars"] == (
                vllm_cpu_env()), name
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"} == {
        "postgres", "redis"}
    assert _settings(objects)["MODEL_CATALOG"].endswith("configs/models.yaml")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployments_replica_fits_a_worker_group(overlay):
    ray_service = one(render(overlay), "RayService")
    groups = []
    for name, group in ray_pods(ray_service).items():
        if name == "head":
            continue  # num-cpus 0: Ray's control plane only
        limits = _containers(group)[0]["resources"]["limits"]
        groups.append((name, _cpus(limits["cpu"]), float(limits.get("nvidia.com/gpu", 0))))
    assert ray_service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"][
        "num-cpus"] == "0"
    for deployment, options in deployments(_serve_config(ray_service)).items():
        cpus, gpus = replica_resources(options)
        assert any(cpus <= group_cpus and gpus <= group_gpus
                   for _, group_cpus, group_gpus in groups), (deployment, cpus, gpus, groups)


@pytest.mark.parametrize(("overlay", "catalog"), [("gpu", "models.production.yaml"),
                                                  ("cpu-demo", "models.yaml")])
def test_a_stopped_replica_waits_for_the_longest_stream(overlay, catalog):
    """Serve stops a replica (scale-down, redeploy) after its streams end, or after
    graceful_shutdown_timeout_s (20 s by default) with them cut; after an upgrade KubeRay keeps
    the old cluster, and its streams, for rayClusterDeletionDelaySeconds."""
    ray_service = one(render(overlay), "RayService")
    longest = longest_stream_s(CONFIGS / catalog)
    options = deployments(_serve_config(ray_service))
    for name in STREAMING_DEPLOYMENTS:
        if name in options:
            assert options[name]["graceful_shutdown_timeout_s"] >= longest, (name, longest)
            assert options[name]["graceful_shutdown_wait_loop_s"] <= 5, name
    assert ray_service["spec"]["rayClusterDeletionDelaySeconds"] >= longest


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kuberay_is_told_the_ray_version_the_image_installs(overlay):
    """KubeRay picks its probes and start options by rayVersion (HTTP health checks from 2.53)."""
    import ray

    ray_service = one(render(overlay), "RayService")
    assert ray_service["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__
