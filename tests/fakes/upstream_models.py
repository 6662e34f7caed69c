"""A model on a server the operator runs (`engine: openai`) in a flow test: its catalog entry
pointing at an `UpstreamServer` (tests/fakes/upstream_server.py), and the real deployment class
holding it behind a handle. Its engine is the real one, talking HTTP to that server; every
other deployment of the catalog stays a fake (tests/fakes/fleet.py).

    path = upstream_catalog(tmp_path, CATALOG, upstream_model(server, "chat-upstream", ...))
    fleet = upstream_fleet(load_catalog(path), UpstreamTextDeployment, "text-m")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import yaml

from deployments.embedding import EmbeddingDeployment
from deployments.text import TextDeployment
from tests.fakes.fleet import fake_deployments
from tests.fakes.handles import DeploymentHandle
from tests.fakes.served import class_of
from tests.fakes.upstream_server import UpstreamServer

UPSTREAM_ENGINE = "openai"
# Two failed calls take the model offline; its replica probes the server every 0.05 s.
FAILURES_TO_OFFLINE = 2
PROBE_INTERVAL_S = 0.05


def upstream_model(server: UpstreamServer, model_id: str, *, upstream_name: str,
                   api_key_env: str, **entry: Any) -> dict[str, Any]:
    """A catalog entry of `model_id` served by `server` as `upstream_name`, its key read from
    the variable `api_key_env`; `entry`: the rest of the entry (type, deployment, pricing...)."""
    return {"id": model_id, "engine": UPSTREAM_ENGINE, **entry,
            "engine_options": {"base_url": server.base_url, "upstream_model": upstream_name,
                               "api_key_env": api_key_env,
                               "failures_to_offline": FAILURES_TO_OFFLINE,
                               "probe_interval_s": PROBE_INTERVAL_S}}


def upstream_catalog(folder: Path, base: Path, *models: dict[str, Any],
                     **extra: Any) -> Path:
    """A catalog file in `folder`: `base` included, `models` added (`extra`: more top-level
    sections, e.g. `traits`)."""
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump({"include": [str(base)], "models": list(models), **extra}))
    return path


class UpstreamDeployment(DeploymentHandle):
    """A handle on the real `DEPLOYMENT` class holding `models` (catalog models of
    `engine: openai`, with their engine options); `deployment`: that instance."""

    DEPLOYMENT: ClassVar[type]

    def __init__(self, deployment_name: str, models: list[Any]) -> None:
        super().__init__(deployment_name)
        self.deployment = class_of(self.DEPLOYMENT)([
            {"id": m.id, "engine": m.engine, "weights": None,
             "engine_options": m.engine_options.given(), "max_queue_wait_s": 5.0}
            for m in models])

    def _answer(self, name: str) -> Any:
        return getattr(self.deployment, name)


class UpstreamTextDeployment(UpstreamDeployment):
    METHODS = ("generate", "complete", "stats")
    DEPLOYMENT = TextDeployment


class UpstreamEmbeddingDeployment(UpstreamDeployment):
    METHODS = ("embed", "stats")
    DEPLOYMENT = EmbeddingDeployment


def upstream_fleet(catalog: Any, handle: type[UpstreamDeployment],
                   deployment_name: str) -> dict[str, DeploymentHandle]:
    """The fakes of `catalog` (a serve_app.models.catalog.Catalog), but `deployment_name` is
    the real deployment (`handle`) holding the catalog's `engine: openai` models."""
    fleet = fake_deployments(catalog)
    models = [m for m in catalog.models if m.engine == UPSTREAM_ENGINE]
    fleet[deployment_name] = handle(deployment_name, models)
    return fleet
