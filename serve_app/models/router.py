"""Step 6 of a request: from a model name to the Serve deployment handle that runs it.

A model name may carry service parameters as a suffix, `model:param=value&param=value`; the
catalog resolves ids, compatibility aliases (`gpt-4o-mini`) and traits (`default`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serve_app.errors import ApiError
from serve_app.models.catalog import Catalog, CatalogModel
from serve_app.models.upstream_states import UpstreamStates

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from deployments.protocol import (
        EmbeddingServer,
        ImageServer,
        JobServer,
        SpeechServer,
        TextServer,
        TranscriptionServer,
    )


@dataclass(frozen=True)
class RoutedModel:
    model: CatalogModel
    suffix_params: dict[str, Any] = field(default_factory=dict)
    # How the name was matched, for `x-service-model-router`: `direct` or `alias`.
    router: str = "direct"


def _suffix_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return raw


def split_model_suffix(name: str) -> tuple[str, dict[str, Any]]:
    """`m:a=1&b=true` -> (`m`, {"a": "1", "b": True}). A bare `m:` part without `=` is not a
    suffix (some model ids contain colons), so only `key=value` pairs count."""
    base, sep, tail = name.partition(":")
    if not sep or "=" not in tail:
        return name, {}
    params: dict[str, Any] = {}
    for pair in tail.split("&"):
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ApiError(400, f"Invalid model suffix parameter {pair!r}: use param=value",
                           code="INVALID_MODEL")
        params[key] = _suffix_value(value)
    return base, params


class ModelRouter:
    def __init__(self, catalog: Catalog, handles: dict[str, Any]) -> None:
        self.catalog = catalog
        self._handles = dict(handles)
        # Whether the servers of `engine: openai` models answer (their replicas' word).
        self.upstreams = UpstreamStates(catalog, self.deployment_handle)

    def deployments_of(self, model: CatalogModel) -> list[str]:
        """The deployments that run `model`: its own, or those of the models it chains (a
        voice changer: its transcription and speech models')."""
        spec = model.voice_changer
        if spec is None:
            return [model.deployment]
        return [self.catalog.by_id[stage].deployment
                for stage in (spec.transcription, spec.speech)]

    def deployment_handle(self, deployment: str) -> Any | None:
        """The handle of a deployment by name, None when this application does not run it
        (the readiness probe asks Serve about it)."""
        return self._handles.get(deployment)

    def is_online(self, model: CatalogModel) -> bool:
        return all(d in self._handles for d in self.deployments_of(model))

    def require_online(self, model: CatalogModel) -> None:
        """503 MODEL_OFFLINE unless every deployment that runs `model` is running."""
        for deployment in self.deployments_of(model):
            if deployment not in self._handles:
                raise ApiError(503, f"Model {model.id!r} is offline: its deployment "
                                    f"{deployment!r} is not running", code="MODEL_OFFLINE")

    def resolve(self, name: str, model_type: str | None = None) -> RoutedModel:
        base, params = split_model_suffix(name)
        model = self.catalog.find(base, model_type)
        if model is None:
            raise ApiError(404, f"Model {base!r} not found", code="MODEL_NOT_FOUND")
        if model_type is not None and model.type != model_type:
            raise ApiError(400, f"Model {model.id!r} is a {model.type} model and cannot serve "
                                f"this request", code="INVALID_MODEL")
        return RoutedModel(model=model, suffix_params=params,
                           router="direct" if base == model.id else "alias")

    def _handle(self, model: CatalogModel) -> DeploymentHandle[Any]:
        """The handle of the deployment that runs `model` (503 MODEL_OFFLINE when it is not
        running), untyped: callers take it typed by family, through the accessors below."""
        handle = self._handles.get(model.deployment)
        if handle is None:
            raise ApiError(503, f"Model {model.id!r} is offline: its deployment "
                                f"{model.deployment!r} is not running", code="MODEL_OFFLINE")
        return handle

    # Typed handles, one per deployment family (deployments/protocol.py): what may be called
    # on each. The catalog decides which family a model's deployment is.

    def text(self, model: CatalogModel) -> DeploymentHandle[TextServer]:
        return self._handle(model)

    def embedding(self, model: CatalogModel) -> DeploymentHandle[EmbeddingServer]:
        return self._handle(model)

    def image(self, model: CatalogModel) -> DeploymentHandle[ImageServer]:
        return self._handle(model)

    def speech(self, model: CatalogModel) -> DeploymentHandle[SpeechServer]:
        return self._handle(model)

    def transcription(self, model: CatalogModel) -> DeploymentHandle[TranscriptionServer]:
        return self._handle(model)

    def video(self, model: CatalogModel) -> DeploymentHandle[JobServer]:
        return self._handle(model)
