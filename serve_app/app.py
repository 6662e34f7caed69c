"""The Ray Serve application: the `Gateway` ingress deployment and `build_app`, the one place
that wires deployments together from a config.

    serve run configs/local.yaml
    serve run serve_app.app:build_app
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from ray import serve
from ray.serve.deployment import Application

from deployments.gil import hand_over_the_gil_quickly
from deployments.registry import MODEL_DEPLOYMENTS, bind
from deployments.weights.registry import check_weights
from serve_app.accounts.key_events import KeyEventHub, ServeKeyEvents
from serve_app.accounts.provisioning import bootstrap, show_admin_key
from serve_app.gateway import create_prefixed_app
from serve_app.models.catalog import load_catalog
from serve_app.services import GatewayServices
from serve_app.settings import Settings
from serve_app.shared_state import ray_nodes, refuse_per_node_state

logger = logging.getLogger("serve_app.app")


@dataclass(frozen=True)
class OtherAppDeployment:
    """A model deployment of another Serve application, looked up by the replica itself."""

    app_name: str
    deployment: str

    def resolve(self) -> Any:
        return serve.get_deployment_handle(self.deployment, app_name=self.app_name)


@serve.deployment(
    name="Gateway",
    max_ongoing_requests=256,
    ray_actor_options={"num_cpus": 0.25},
)
@serve.ingress()
class Gateway:
    """Ingress replica: auth, validation, limits, billing and headers happen here, then one
    hop to the model deployment."""

    def __init__(self, settings: dict[str, Any], handles: dict[str, Any], key_hub: Any) -> None:
        hand_over_the_gil_quickly()  # the billing writer's thread answers without a 5 ms wait
        self._services = GatewayServices.build(
            Settings.model_validate(settings),
            handles={name: h.resolve() if isinstance(h, OtherAppDeployment) else h
                     for name, h in handles.items()},
            key_events=ServeKeyEvents(key_hub),
        )

    def __serve_build_asgi_app__(self):
        return create_prefixed_app(self._services, under_serve=True)


class AppArgs(BaseModel):
    """Arguments of `build_app`, from the `args:` of a Serve config."""

    model_config = ConfigDict(extra="forbid")

    # Settings that override the environment (DATABASE_URL, DATA_DIR, ...), by field name.
    settings: dict[str, Any] = {}
    # Model deployments to run; by default every catalog deployment that has an engine.
    model_deployments: list[str] | None = None
    # Serve options of the Gateway deployment (num_replicas, ...) for callers of `build_app`
    # in Python; a config file sets them in its `deployments:` section instead.
    gateway_options: dict[str, Any] = {}
    # Use the model deployments of this other Serve application instead of running them: a
    # second gateway (another database, another region) shares one set of engines.
    model_app: str | None = None
    # The application runs on several nodes (configs/production.yaml): an autoscaled cluster
    # may start on its head alone, so the Ray cluster's node count cannot tell. Several
    # nodes need a shared database and result store (serve_app/shared_state.py).
    multi_node: bool = False


def build_app(args: dict[str, Any] | None = None) -> Application:
    app_args = AppArgs.model_validate(args or {})
    settings = Settings(**app_args.settings)
    refuse_per_node_state(settings, nodes=ray_nodes(), declared=app_args.multi_node)
    result = bootstrap(settings)
    show_admin_key(result)  # on the terminal only, never through logging
    catalog = load_catalog(settings.model_catalog)

    wanted = app_args.model_deployments
    if wanted is None:
        wanted = sorted(d for d in catalog.deployments if d in MODEL_DEPLOYMENTS)
    unknown = [d for d in wanted if d not in MODEL_DEPLOYMENTS]
    if unknown:
        raise ValueError(f"no model deployment named {unknown}; known: {sorted(MODEL_DEPLOYMENTS)}")
    idle = [d for d in wanted if not any(m.deployment == d for m in catalog.models)]
    if idle:  # e.g. production.yaml's text-m and text-l before the catalog has such models
        logger.warning("deployments %s serve no model of the catalog: not started", idle)
        wanted = [d for d in wanted if d not in idle]
    if app_args.model_app:
        handles = {name: OtherAppDeployment(app_args.model_app, name) for name in wanted}
    else:
        for name in wanted:
            for model in catalog.models:
                if model.deployment == name:
                    check_weights(model, settings.data_dir)
        handles = {
            name: bind(name, [m for m in catalog.models if m.deployment == name],
                       settings.model_dump(mode="json"))
            for name in wanted
        }
    # The admin key is only needed by bootstrap; keep it out of replica arguments.
    replica_settings = settings.model_dump(mode="json", exclude={"admin_api_key"})
    gateway = Gateway.options(**app_args.gateway_options) if app_args.gateway_options else Gateway
    return gateway.bind(replica_settings, handles, KeyEventHub.bind())
