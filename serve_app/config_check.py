"""`inference-admin check-config CONFIG`: a dry run of a Serve config, without GPUs and without
starting anything. It reads what `build_app` would read (the config's arguments, the settings
from the environment, the catalog) and reports, one line each, OK / WARNING / ERROR:

- the catalog: it loads (every vLLM model's engine options are vLLM's engine arguments), and
  each model's engine is one its deployment runs;
- each model's weights: present, built at the first start, or, on a multi-node config, the
  folder to mount on every node (a cluster's weights live on the nodes' volume, not on the
  machine that runs the check); on one node, missing weights are an error, as at the start;
- each deployment's resources as Serve would get them (the code's options, which follow the
  catalog, replaced option by option by the config's): Serve accepts them, a tensor parallel
  model's replica gets its GPUs, and a replica fits a node type of `cluster.yaml` and of the
  KubeRay manifest (on one node: this machine);
- on several nodes, the settings they need (serve_app/shared_state.py) and no test-weight
  model.

It exits 1 when any line is an ERROR.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deployments.registry import MODEL_DEPLOYMENTS, deployment_options
from deployments.spec import (
    PARALLEL_PLACEMENT_STRATEGY,
    gpus_per_engine,
    parallel_placement,
    replica_options,
)
from deployments.weights.registry import BUILDERS
from deployments.weights.store import resolve_weights
from serve_app.models.catalog import VLLM_ENGINE, Catalog, CatalogModel, load_catalog
from serve_app.models.vllm_arguments import vllm_arguments
from serve_app.settings import PROJECT_ROOT, Settings
from serve_app.shared_state import Finding, multi_node_findings

BUILD_APP = "serve_app.app:build_app"
CLUSTER_FILE = PROJECT_ROOT / "cluster.yaml"
KUBERAY_FILES = (PROJECT_ROOT / "deploy" / "kubernetes" / "base" / "rayservice.yaml",
                 PROJECT_ROOT / "configs" / "kuberay" / "rayservice.yaml")
# Serve's options that place a replica, which a config's deployment entry replaces one by one.
PLACEMENT_OPTIONS = ("placement_group_bundles", "placement_group_strategy")


@dataclass(frozen=True)
class NodeType:
    """What one kind of node offers Ray."""

    source: str  # cluster.yaml, the KubeRay manifest, this machine
    name: str
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Demand:
    """What one replica asks Ray for: its bundles (one, its own resources, when it has none)
    and whether they must share a node."""

    bundles: list[dict[str, float]]
    one_node: bool

    def fits(self, node: NodeType) -> bool:
        if self.one_node:
            return (sum(b.get("CPU", 0) for b in self.bundles) <= node.cpus
                    and sum(b.get("GPU", 0) for b in self.bundles) <= node.gpus)
        return all(b.get("CPU", 0) <= node.cpus and b.get("GPU", 0) <= node.gpus
                   for b in self.bundles)

    def shown(self) -> str:
        if len(self.bundles) == 1:
            b = self.bundles[0]
            return f"{b.get('CPU', 0):g} CPU, {b.get('GPU', 0):g} GPU"
        return " + ".join(f"[{b.get('CPU', 0):g} CPU, {b.get('GPU', 0):g} GPU]"
                          for b in self.bundles) + (" on one node" if self.one_node else "")


def check_config(config_path: Path, *, catalog_path: Path | None = None,
                 cluster: Path | None = CLUSTER_FILE, kuberay: Path | None = None
                 ) -> list[Finding]:
    """Every finding of a dry run of the Serve config at `config_path`."""
    from serve_app.app import AppArgs  # the arguments build_app takes, as it reads them

    try:
        raw = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        return [Finding("ERROR", str(config_path), f"not a readable YAML file: {exc}")]
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(raw)
    except ValidationError as exc:
        return [Finding("ERROR", str(config_path), f"not a Serve config: {_errors(exc)}")]
    apps = [a for a in raw.get("applications", []) if a.get("import_path") == BUILD_APP]
    if not apps:
        return [Finding("ERROR", str(config_path), f"no application imports {BUILD_APP}")]
    findings: list[Finding] = []
    for app in apps:
        try:
            args = AppArgs.model_validate(app.get("args") or {})
            settings = Settings(**args.settings)
        except ValidationError as exc:
            findings.append(Finding("ERROR", f"{app.get('name')} args", _errors(exc)))
            continue
        findings += _check_app(app, args.model_deployments, args.multi_node, settings,
                               catalog_path, cluster, kuberay)
    return findings


def _check_app(app: dict[str, Any], wanted: list[str] | None, multi_node: bool,
               settings: Settings, catalog_path: Path | None, cluster: Path | None,
               kuberay: Path | None) -> list[Finding]:
    path = (catalog_path or settings.model_catalog).resolve()
    try:
        catalog = load_catalog(path)
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        problems = _errors(exc) if isinstance(exc, ValidationError) else str(exc)
        return [Finding("ERROR", "catalog", f"{_shown_path(path)}: {problems}")]
    findings = [Finding("OK", "catalog", f"{_shown_path(path)}: {len(catalog.models)} models"),
                _engine_arguments(catalog)]
    if wanted is None:
        wanted = sorted(d for d in catalog.deployments if d in MODEL_DEPLOYMENTS)
    unknown = [d for d in wanted if d not in MODEL_DEPLOYMENTS]
    if unknown:
        findings.append(Finding("ERROR", "model_deployments", (
            f"no model deployment named {unknown}; known: {sorted(MODEL_DEPLOYMENTS)}")))
    served = [m for m in catalog.models
              if m.deployment in wanted and m.deployment in MODEL_DEPLOYMENTS]
    findings += [_weights(m, settings.data_dir, multi_node) for m in served]
    findings += [f for m in served if (f := _engine(m)) is not None]
    nodes = _node_types(multi_node, cluster, kuberay, findings)
    configured = {d["name"]: d for d in app.get("deployments") or []}
    for name in wanted:
        if name in MODEL_DEPLOYMENTS:
            models = [m for m in catalog.models if m.deployment == name]
            findings += _deployment(name, models, configured.get(name, {}), nodes)
    for name in ("Gateway", "KeyEventHub"):
        if name in configured:
            options = configured[name]
            findings += _fits(name, _demand(options.get("ray_actor_options") or {}, options),
                              nodes)
    if multi_node:
        findings += multi_node_findings(settings)
        noise = [m.id for m in catalog.models if m.test_weights]
        if noise:
            findings.append(Finding("ERROR", "catalog", (
                f"test-weight models {noise} (noise at real prices) on a cluster: set "
                "MODEL_CATALOG=configs/models.production.yaml or a catalog of your own")))
    else:
        findings.append(Finding("OK", "nodes", (
            "one node: the SQLite file and DATA_DIR/results are fine (a config with "
            "`multi_node: true` needs PostgreSQL, Redis and a shared result store)")))
    return findings


def _engine_arguments(catalog: Catalog) -> Finding:
    arguments = vllm_arguments()
    vllm_models = [m for m in catalog.models if m.engine == VLLM_ENGINE]
    if arguments is None:
        return Finding("WARNING", "engine arguments", (
            f"vLLM is not installed here: the engine options of {len(vllm_models)} vLLM "
            "models are not checked (run the check where the image's vLLM is)"))
    return Finding("OK", "engine arguments", (
        f"{len(vllm_models)} vLLM models name only engine arguments of vLLM "
        f"{arguments.version}"))


def _engine(model: CatalogModel) -> Finding | None:
    """An error when the model's deployment has no engine of its name (its replica would fail
    to start, and Serve start it again and again)."""
    engines = getattr(MODEL_DEPLOYMENTS[model.deployment].func_or_class, "ENGINES", {})
    if model.engine in engines:
        return None
    return Finding("ERROR", f"engine of {model.id}", (
        f"deployment {model.deployment} has no engine {model.engine!r}; its engines: "
        f"{sorted(engines)}"))


def _weights(model: CatalogModel, data_dir: Path, multi_node: bool) -> Finding:
    subject = f"weights of {model.id}"
    spec = model.weights_spec(data_dir)
    builder = model.engine_options.build
    if builder:
        if builder not in BUILDERS:
            return Finding("ERROR", subject, f"no weights builder named {builder!r}; known: "
                                             f"{sorted(BUILDERS)}")
        return Finding("OK", subject, f"built at the first start by `build: {builder}` into "
                                      f"{spec} (from installed packages)")
    if spec is None:
        return Finding("OK", subject, f"none, or the {model.engine} engine's own")
    try:
        path = resolve_weights(spec)
    except FileNotFoundError as exc:  # a weights package: the environment must install it
        return Finding("ERROR", subject, f"{exc}: install it with the platform's engines")
    if path.exists():
        return Finding("OK", subject, f"present at {path}")
    if multi_node:
        return Finding("WARNING", subject, (
            f"TO MOUNT: not on this machine; copy the folder to {path} on the volume every "
            f"node running {model.deployment} mounts (DATA_DIR there: {data_dir})"))
    return Finding("ERROR", subject, f"missing: {path} does not exist (catalog: "
                                     f"{model.weights}); copy the weights there")


def _deployment(name: str, models: list[CatalogModel], configured: dict[str, Any],
                nodes: list[NodeType]) -> list[Finding]:
    """A model deployment's resources as Serve gets them: the code's options (which follow
    the catalog), each option the config names replacing the code's."""
    from ray.serve.deployment import Deployment

    code = replica_options(deployment_options(name), list(models))
    options = {**code, **{k: v for k, v in configured.items() if k != "name"}}
    actor = options.get("ray_actor_options") or {}
    subject = f"deployment {name}"
    if not models:
        subject += " (no model in the catalog: not started)"
    findings = []
    try:
        cls: Deployment = MODEL_DEPLOYMENTS[name]
        cls.options(name=name, **options)
    except (TypeError, ValueError) as exc:
        findings.append(Finding("ERROR", subject, f"Serve refuses its options: {exc}"))
    needed = max((gpus_per_engine(m.engine_options.given()) for m in models), default=1)
    bundles = options.get("placement_group_bundles")
    if needed > 1:
        given = sum(b.get("GPU", 0) for b in bundles or [])
        if given != needed or options.get("placement_group_strategy") != \
                PARALLEL_PLACEMENT_STRATEGY:
            wanted = parallel_placement(dict(actor), needed)
            findings.append(Finding("ERROR", subject, (
                f"its models' engines run on {needed} GPUs (tensor_parallel_size x "
                f"pipeline_parallel_size) but the replica's bundles give {given:g}: set "
                f"placement_group_bundles: {_flow(wanted['placement_group_bundles'])}, "
                f"placement_group_strategy: {PARALLEL_PLACEMENT_STRATEGY} and "
                f"ray_actor_options: {_flow(wanted['ray_actor_options'])}, or leave all "
                "three to the code")))
    elif bundles and models:
        findings.append(Finding("WARNING", subject, (
            f"placement group bundles for {len(bundles)} GPUs, but its models' engines run on "
            "one: set tensor_parallel_size on them or drop the bundles")))
    return findings + _fits(subject, _demand(actor, options), nodes)


def _demand(actor: dict[str, Any], options: dict[str, Any]) -> Demand:
    bundles = options.get("placement_group_bundles")
    if bundles:
        return Demand([{k: float(v) for k, v in b.items()} for b in bundles],
                      options.get("placement_group_strategy") in ("STRICT_PACK", "PACK"))
    return Demand([{"CPU": float(actor.get("num_cpus", 1)),
                    "GPU": float(actor.get("num_gpus", 0))}], True)


def _fits(subject: str, demand: Demand, nodes: list[NodeType]) -> list[Finding]:
    """One line: the node types of each source a replica fits, or an error per source where
    it fits none."""
    if not subject.startswith("deployment"):
        subject = f"deployment {subject}"
    fits, findings = [], []
    for source in dict.fromkeys(n.source for n in nodes):
        kinds = [n for n in nodes if n.source == source]
        fitting = [n.name for n in kinds if demand.fits(n)]
        if fitting:
            fits.append(f"{source} {', '.join(fitting)}".strip())
        else:
            offered = "; ".join(f"{n.name} {n.cpus:g} CPU, {n.gpus:g} GPU".strip()
                                for n in kinds)
            findings.append(Finding("ERROR", subject, (
                f"a replica asks {demand.shown()}: no node type of {source} has that "
                f"({offered}); give a node type more or the deployment less")))
    if fits and not findings:
        findings.append(Finding("OK", subject, f"a replica asks {demand.shown()}: fits "
                                               f"{'; '.join(fits)}"))
    return findings


def _node_types(multi_node: bool, cluster: Path | None, kuberay: Path | None,
                findings: list[Finding]) -> list[NodeType]:
    """The node types a replica may land on: those of cluster.yaml and of the KubeRay
    manifest for a multi-node config, this machine for one node."""
    if not multi_node:
        return [NodeType("this machine", "", float(os.cpu_count() or 1), float(_local_gpus()))]
    nodes: list[NodeType] = []
    if cluster is not None:
        nodes += _cluster_node_types(cluster, findings)
    manifest = kuberay or next((p for p in KUBERAY_FILES if p.exists()), None)
    if manifest is not None:
        nodes += _kuberay_node_types(manifest, findings)
    return nodes


def _cluster_node_types(path: Path, findings: list[Finding]) -> list[NodeType]:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        findings.append(Finding("ERROR", "cluster.yaml", f"{path}: {exc}"))
        return []
    nodes = []
    for name, node_type in (raw.get("available_node_types") or {}).items():
        resources = node_type.get("resources") or {}
        if "CPU" not in resources:
            findings.append(Finding("WARNING", _shown_path(path), (
                f"node type {name} states no resources (the launcher guesses them from the "
                "instance type): write `resources: {CPU: n, GPU: m}` to have it checked")))
            continue
        nodes.append(NodeType(_shown_path(path), name, float(resources["CPU"]),
                              float(resources.get("GPU", 0))))
    return nodes


def _kuberay_node_types(path: Path, findings: list[Finding]) -> list[NodeType]:
    """The head and worker groups of the RayService in a manifest (a file, or a kustomize
    folder rendered by `kubectl kustomize`)."""
    try:
        if path.is_dir():
            kubectl = shutil.which("kubectl")
            if kubectl is None:
                findings.append(Finding("WARNING", _shown_path(path),
                                        "kubectl is not installed: not rendered, not checked"))
                return []
            text = subprocess.run([kubectl, "kustomize", str(path)], check=True,
                                  capture_output=True, text=True).stdout
        else:
            text = path.read_text(encoding="utf-8")
        documents = [d for d in yaml.safe_load_all(text) if d]
    except (OSError, yaml.YAMLError, subprocess.CalledProcessError) as exc:
        findings.append(Finding("ERROR", _shown_path(path), f"not a readable manifest: {exc}"))
        return []
    nodes = []
    for doc in documents:
        if doc.get("kind") != "RayService":
            continue
        cluster = doc["spec"].get("rayClusterConfig") or {}
        groups = [("head", cluster.get("headGroupSpec") or {})]
        groups += [(g.get("groupName", "?"), g) for g in cluster.get("workerGroupSpecs") or []]
        for name, group in groups:
            nodes.append(_kuberay_group(_shown_path(path), name, group))
    return nodes


def _kuberay_group(source: str, name: str, group: dict[str, Any]) -> NodeType:
    """What a group's pod offers Ray: `rayStartParams` where they say, else the container's
    resource limits (as KubeRay starts Ray)."""
    params = group.get("rayStartParams") or {}
    containers = group.get("template", {}).get("spec", {}).get("containers") or [{}]
    limits = containers[0].get("resources", {}).get("limits", {})
    cpus = params.get("num-cpus", limits.get("cpu", 0))
    gpus = params.get("num-gpus", limits.get("nvidia.com/gpu", 0))
    return NodeType(source, name, _quantity(cpus), _quantity(gpus))


def _quantity(value: Any) -> float:
    """A Kubernetes quantity of CPUs or devices: "8", 8, "500m"."""
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _local_gpus() -> int:
    return len(list(Path("/dev").glob("nvidia[0-9]*")))


def _errors(exc: ValidationError) -> str:
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()


def _shown_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def main(args: argparse.Namespace, out: Any = None) -> int:
    """Print the findings, one a line; 1 when any is an error. `args`: the subcommand's
    (serve_app/cli.py): config, catalog, cluster, kuberay."""
    out = out or sys.stdout
    findings = check_config(args.config, catalog_path=args.catalog,
                            cluster=args.cluster or CLUSTER_FILE, kuberay=args.kuberay)
    for finding in findings:
        print(finding.line(), file=out)
    errors = _count(findings, "ERROR")
    print(f"check-config {args.config}: {errors} errors, {_count(findings, 'WARNING')} "
          "warnings", file=out)
    return 1 if errors else 0


def _count(findings: Iterable[Finding], level: str) -> int:
    return sum(1 for f in findings if f.level == level)
