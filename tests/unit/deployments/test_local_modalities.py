"""`make run` (configs/local.yaml) serves every modality the catalog lists: each catalog model
whose deployment has an engine class is served there, image edits and generation included,
their weights built by the launcher before Serve starts; the media deployments run no replica
until their first request starts one (scaled to zero), the others' replicas are loaded before
"Platform ready" (deferred deployments the second stage waits for)."""

from __future__ import annotations

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments.engines.diffusion import DiffusersEditEngine, DiffusersText2ImgEngine
from deployments.registry import MODEL_DEPLOYMENTS
from deployments.weights.registry import weights_to_build
from serve_app.app import AppArgs
from serve_app.launch import always_running, deferred_deployments
from serve_app.models.catalog import Catalog, load_catalog
from serve_app.settings import PROJECT_ROOT

CONFIGS = PROJECT_ROOT / "configs"


@pytest.fixture(scope="module")
def local() -> dict:
    raw = yaml.safe_load((CONFIGS / "local.yaml").read_text(encoding="utf-8"))
    ServeDeploySchema.model_validate(raw)
    return raw


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(CONFIGS / "models.yaml")


def _served(local: dict) -> set[str]:
    return set(AppArgs.model_validate(local["applications"][0]["args"]).model_deployments)


def _options(local: dict) -> dict[str, dict]:
    return {d["name"]: d for d in local["applications"][0]["deployments"]}


def test_every_catalog_model_with_an_engine_class_is_served_by_make_run(local, catalog):
    servable = {m.deployment for m in catalog.models if m.deployment in MODEL_DEPLOYMENTS}
    assert servable - _served(local) == set()


@pytest.mark.parametrize(("route_model", "engine_class"), [
    (("edit", None), DiffusersEditEngine),          # /image/edit, /image/multi-edit
    (("generate", None), DiffusersText2ImgEngine),  # /image/generate
    (("generate", "dall-e-3"), DiffusersText2ImgEngine),  # /images/generations, openai names
    (("generate", "gpt-image-1"), DiffusersText2ImgEngine),
])
def test_the_image_routes_models_resolve_to_a_deployment_of_the_local_config(
        local, catalog, route_model, engine_class):
    operation, name = route_model
    # as the image routes pick their model: the operation's default, or a name of the catalog
    model = catalog.for_operation(operation)[0] if name is None else catalog.find(name, "image")
    assert model is not None and model.operation == operation
    assert model.deployment in _served(local)
    engines = MODEL_DEPLOYMENTS[model.deployment].func_or_class.ENGINES
    assert engines[model.engine] is engine_class
    # one replica, a bounded queue, on a CPU share
    options = _options(local)[model.deployment]
    assert options["autoscaling_config"]["max_replicas"] == 1
    assert options["max_queued_requests"] > 0
    assert not options["ray_actor_options"].get("num_gpus")


def test_edit_and_generation_share_one_replica(local, catalog):
    deployments = {m.deployment for m in catalog.models if m.operation in ("edit", "generate")
                   and m.engine.startswith("diffusers")}
    assert len(deployments) == 1 and deployments <= _served(local)


def test_image_weights_are_built_before_serve_and_the_replica_starts_on_first_use(
        local, catalog, tmp_path):
    image_models = [m for m in catalog.models if m.deployment == "image-diffusion"]
    # the launcher builds these (with progress) on a fresh DATA_DIR, not a replica
    assert {m.id for m in image_models} <= set(weights_to_build(catalog.models, tmp_path))
    for model in image_models:
        assert str(model.weights_spec(tmp_path)).startswith(str(tmp_path / "models"))
    # deferred to the second stage, which does not wait for it: no replica until a request
    deferred = deferred_deployments(local, catalog)
    assert "image-diffusion" in deferred
    assert "image-diffusion" not in always_running(local, deferred)
    assert "embedding" in always_running(local, deferred)
