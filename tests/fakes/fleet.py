"""One handle per model deployment of a catalog, for `GatewayServices.build(handles=...)`."""

from __future__ import annotations

from typing import Any

from tests.fakes.embedding import DEFAULT_DIMENSIONS, FakeEmbeddingDeployment
from tests.fakes.handles import DeploymentHandle
from tests.fakes.image import FakeImageDeployment
from tests.fakes.served import ServedDeployment
from tests.fakes.text import FakeTextDeployment
from tests.fakes.video import FakeVideoDeployment

_FAMILY_OF_TYPE: dict[str, type[ServedDeployment]] = {
    "text": FakeTextDeployment,
    "embedding": FakeEmbeddingDeployment,
    "image": FakeImageDeployment,
    "upscale": FakeImageDeployment,
    "inpaint": FakeImageDeployment,
    "video": FakeVideoDeployment,
}


def fake_deployments(catalog: Any) -> dict[str, DeploymentHandle]:
    """A handle per deployment of `catalog` (a serve_app.models.catalog.Catalog) whose models
    are text, embedding, image or video models, by deployment name: the real deployment
    class holding the catalog's models of its deployment (with their engine options; an
    embedding model with its catalog dimensions) on fake engines. Deployments of other
    families (speech, music) are left out: their models are offline."""
    by_deployment: dict[str, list[Any]] = {}
    for model in catalog.models:
        by_deployment.setdefault(model.deployment, []).append(model)
    fleet: dict[str, DeploymentHandle] = {}
    for name, models in by_deployment.items():
        families = {_FAMILY_OF_TYPE.get(m.type) for m in models}
        if len(families) != 1 or None in families:
            continue
        family = families.pop()
        if family is FakeEmbeddingDeployment:
            fleet[name] = FakeEmbeddingDeployment(
                name, models,
                dimensions={m.id: m.dimensions or DEFAULT_DIMENSIONS for m in models})
        elif family is not None:
            fleet[name] = family(name, models)
    return fleet
