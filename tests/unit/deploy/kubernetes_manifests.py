"""The Kubernetes manifests as an operator applies them: each overlay of deploy/kubernetes
rendered by `kubectl kustomize`, and the schemas that check what the API server would take.

Built-in kinds are checked against Kubernetes' own schemas (the `kubernetes-validate` package
ships them); KubeRay's RayService and prometheus-operator's PodMonitor against the
openAPIV3Schema of their CustomResourceDefinitions, kept in schemas/ (each names its source).
Both strictly: a field the schema does not know is an error, as `kubectl apply
--validate=strict` reports it, where the API server would silently drop it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from serve_app.settings import PROJECT_ROOT

KUBERNETES = PROJECT_ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu-demo", "gpu")
# The Kubernetes version whose schemas the built-in kinds are checked against.
KUBERNETES_VERSION = "1.32"
SCHEMAS = Path(__file__).parent / "schemas"
CUSTOM_SCHEMAS = {("ray.io/v1", "RayService"): "ray.io_v1_rayservice.json",
                  ("monitoring.coreos.com/v1", "PodMonitor"):
                      "monitoring.coreos.com_v1_podmonitor.json"}


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` renders for an overlay (skips where kubectl is missing)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize overlays are not rendered")
    return _render(kubectl, overlay)


@cache
def _render(kubectl: str, overlay: str) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(KUBERNETES / "overlays" / overlay)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever it lists the fields it knows."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(value) for value in schema]
    return schema


@cache
def custom_schema(api_version: str, kind: str) -> dict[str, Any]:
    raw = json.loads((SCHEMAS / CUSTOM_SCHEMAS[api_version, kind]).read_text(encoding="utf-8"))
    schema: dict[str, Any] = _strict(raw)
    return schema


def validate(manifest: dict[str, Any]) -> None:
    """Raises if the API server (strict field validation) would refuse the object."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key in CUSTOM_SCHEMAS:
        jsonschema.validate(manifest, custom_schema(*key))
        return
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (Kubernetes' schemas) is not installed")
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def ray_pods(ray_service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every Ray pod template of a RayService with its group's rayStartParams, by group name
    (`head` for the head)."""
    cluster = ray_service["spec"]["rayClusterConfig"]
    groups = {"head": cluster["headGroupSpec"]}
    groups.update({g["groupName"]: g for g in cluster.get("workerGroupSpecs", [])})
    return groups
