"""The model catalog: one YAML file naming, per model id, everything the platform needs (a
file may `include:` others and add to them).

Routing (deployment), engines (engine + weights), pricing, quotes, privacy checks, rate-limit
classes and the public `/models` records all read this one source.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from deployments.catalog_file import read_catalog_file
from serve_app.models.chains import VoiceChangerSpec
from serve_app.models.constraints import (
    EMPTY_AUDIO,
    EMPTY_IMAGE,
    EMPTY_TEXT,
    EMPTY_VIDEO,
    AudioConstraints,
    Constraints,
    ImageConstraints,
    TextConstraints,
    VideoConstraints,
    constraints_of,
)
from serve_app.models.engine_options import EngineOptions
from serve_app.models.upstream import UPSTREAM_ENGINE, upstream_problems
from serve_app.models.vllm_arguments import vllm_arguments

ModelType = Literal["text", "embedding", "image", "upscale", "inpaint", "tts", "asr", "video",
                    "music"]
MODEL_TYPES: tuple[str, ...] = ModelType.__args__  # type: ignore[attr-defined]
SizeClass = Literal["XS", "S", "M", "L"]
# What an image model does; each image endpoint serves the models of one operation.
ImageOperation = Literal["generate", "edit", "upscale", "background-remove"]
# What a queued video or audio model does (`/video/queue`, `/audio/queue`): it decides which
# inputs the model takes and which pricing rules apply to it.
MediaOperation = Literal["text-to-video", "image-to-video", "reference-to-video",
                         "video-upscale", "video-interpolate", "speech", "voice-change"]
# The engine whose `engine_options` beyond the typed ones are vLLM's engine arguments.
VLLM_ENGINE = "vllm"
_DEFAULT_OPERATION: dict[str, ImageOperation] = {"image": "generate", "inpaint": "edit",
                                                 "upscale": "upscale"}


class Deprecation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    date: datetime
    removesAt: datetime | None = None
    autoRemap: bool = False
    replacementModelId: str | None = None


class CatalogModel(BaseModel):
    """One model id. Unknown keys are refused so a typo in the catalog fails at load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    type: ModelType
    name: str
    description: str = ""
    deployment: str
    engine: str
    weights: str | None = None
    engine_options: EngineOptions = Field(default_factory=EngineOptions)
    # Random weights built locally (noise pictures and videos): only a laptop's or the tests'
    # catalog lists such a model, never a cluster's (inference-admin check-config).
    test_weights: bool = False
    size_class: SizeClass | None = None
    privacy: Literal["private", "anonymized"] = "private"
    tee: bool = False
    created: int = 0
    context_length: int | None = None
    max_completion_tokens: int | None = None
    pricing: dict[str, Any]
    capabilities: dict[str, Any] = Field(default_factory=dict)
    # One typed section per model family (serve_app/models/constraints.py), by `type`.
    constraints: Constraints = Field(default_factory=dict, validate_default=True)
    traits: list[str] = Field(default_factory=list)
    model_source: str | None = None
    beta: bool = False
    deprecation: Deprecation | None = None
    # Embedding models: the size of the vectors.
    dimensions: int | None = None
    # Per-model rate-limit overrides: {requests_per_minute, tokens_per_minute}.
    rate_limits: dict[str, int] = Field(default_factory=dict)
    # Image models: the endpoint family that serves them (by default from `type`: image ->
    # generate, inpaint -> edit, upscale -> upscale); video and queued audio models: what
    # they do. Not part of the public record.
    operation: ImageOperation | MediaOperation | None = None
    # Video models: how a finished video reaches the client. `stream`: `/video/retrieve`
    # answers the MP4 (or its JSON COMPLETED status to a client that does not accept video);
    # `download_url`: the queue result carries a signed delivery link and retrieve answers JSON
    # status only, as the reference does for such models (the spec: private models only).
    delivery: Literal["stream", "download_url"] = "stream"
    # Speech models: the voices they offer, the audio formats they answer in, the default.
    voices: list[str] = Field(default_factory=list)
    supported_formats: list[str] = Field(default_factory=list)
    default_format: str | None = None
    # Voice changers (`operation: voice-change`): the models they chain and what they accept.
    voice_changer: VoiceChangerSpec | None = None

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints_of_family(cls, value: Any, info: ValidationInfo) -> Any:
        return constraints_of(info.data.get("type"), value)

    @model_validator(mode="after")
    def _voice_changer_is_whole(self) -> CatalogModel:
        spec = self.voice_changer
        if (spec is not None) != (self.operation == "voice-change"):
            raise ValueError(f"model {self.id!r}: a voice-change model needs `voice_changer:` "
                             "(the models it chains), and only it has one")
        if spec is not None:
            if spec.default_voice not in self.voices:
                raise ValueError(f"voice changer {self.id!r}: default_voice "
                                 f"{spec.default_voice!r} is not one of its voices")
            tiers = self.pricing.get("durations", {})
            minutes = -(-spec.max_source_audio_duration_seconds // 60)
            missing = [m for m in range(1, minutes + 1) if str(m) not in tiers]
            if missing:
                raise ValueError(f"voice changer {self.id!r}: pricing.durations needs a tier "
                                 f"per minute up to {minutes}; missing {missing}")
        return self

    @model_validator(mode="after")
    def _vllm_knows_the_engine_arguments(self) -> CatalogModel:
        """A vLLM model's engine arguments are vLLM's own, by name and type (the engines of
        other models take other options: not checked against vLLM)."""
        arguments = vllm_arguments() if self.engine == VLLM_ENGINE else None
        if arguments is not None:
            problems = arguments.problems(self.id, self.engine_options.engine_arguments)
            if problems:
                raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _upstream_is_whole(self) -> CatalogModel:
        """A model on a server the operator runs names it whole, and its key's variable is
        set (serve_app/models/upstream.py)."""
        if self.engine == UPSTREAM_ENGINE:
            problems = upstream_problems(self.id, self.engine_options.engine_arguments)
            if problems:
                raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _text_needs_size(self) -> CatalogModel:
        if self.type == "text" and self.size_class is None:
            raise ValueError(f"text model {self.id!r} needs a size_class (XS, S, M or L)")
        return self

    @model_validator(mode="after")
    def _delivery_by_link_is_for_private_video(self) -> CatalogModel:
        if self.delivery == "download_url" and (self.type != "video" or not self.is_private):
            raise ValueError(f"model {self.id!r}: delivery download_url is for private video "
                             "models only")
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_operation(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("operation") is None \
                and data.get("type") in _DEFAULT_OPERATION:
            data = {**data, "operation": _DEFAULT_OPERATION[data["type"]]}
        return data

    @property
    def text_constraints(self) -> TextConstraints:
        """The sampling defaults (none for a model of another family)."""
        c = self.constraints
        return c if isinstance(c, TextConstraints) else EMPTY_TEXT

    @property
    def image_constraints(self) -> ImageConstraints:
        c = self.constraints
        return c if isinstance(c, ImageConstraints) else EMPTY_IMAGE

    @property
    def video_constraints(self) -> VideoConstraints:
        c = self.constraints
        return c if isinstance(c, VideoConstraints) else EMPTY_VIDEO

    @property
    def audio_constraints(self) -> AudioConstraints:
        """A queued audio (`music`) model's constraints."""
        c = self.constraints
        return c if isinstance(c, AudioConstraints) else EMPTY_AUDIO

    @property
    def rate_limit_class(self) -> str | None:
        """The row of the spec's default rate-limit table this model falls in, if any."""
        if self.type == "text":
            return self.size_class
        if self.type == "embedding":
            return "XS"
        if self.type in ("image", "upscale", "inpaint"):
            return "IMAGE"
        if self.type in ("tts", "asr"):
            return "SPEECH"
        return None  # video and music jobs are not rate limited

    @property
    def native_tools(self) -> bool:
        """The model's server takes the client's tools as they came (`engine: openai` with
        `engine_options.native_tools`; serve_app/models/upstream.py)."""
        return self.engine == UPSTREAM_ENGINE and bool(
            self.engine_options.engine_arguments.get("native_tools"))

    @property
    def is_private(self) -> bool:
        """Private, TEE or E2EE, as the key privacy tiers count it."""
        return self.privacy == "private" or self.tee or bool(
            self.capabilities.get("supportsE2EE"))

    def weights_spec(self, data_dir: Path) -> str | None:
        """The weights location with `${DATA_DIR}` filled in (a path or `package:...`)."""
        if not self.weights:
            return None
        return os.path.expandvars(self.weights.replace("${DATA_DIR}", str(data_dir)))

    def deprecation_headers(self) -> dict[str, str]:
        if not self.deprecation:
            return {}
        when = self.deprecation.date.astimezone(UTC).isoformat().replace("+00:00", "Z")
        return {
            "x-service-model-deprecation-warning":
                f"Model {self.id} is deprecated and will be removed"
                + (f"; use {self.deprecation.replacementModelId}"
                   if self.deprecation.replacementModelId else ""),
            "x-service-model-deprecation-date": when,
        }


class Catalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: list[CatalogModel]
    traits: dict[str, dict[str, str]] = Field(default_factory=dict)  # type -> trait -> model id
    compatibility_mapping: dict[str, dict[str, str]] = Field(default_factory=dict)
    image_styles: list[str] = Field(default_factory=list)
    # The service's default system prompt, placed before the caller's system prompts unless a
    # request sets `service_parameters.include_service_system_prompt: false`.
    service_system_prompt: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Catalog:
        ids = [m.id for m in self.models]
        duplicates = {i for i in ids if ids.count(i) > 1}
        if duplicates:
            raise ValueError(f"duplicate model ids in catalog: {sorted(duplicates)}")
        known = set(ids)
        for section_name, section in (("traits", self.traits),
                                      ("compatibility_mapping", self.compatibility_mapping)):
            for model_type, mapping in section.items():
                if model_type not in MODEL_TYPES:
                    raise ValueError(f"{section_name}: unknown model type {model_type!r}")
                for alias, target in mapping.items():
                    if target not in known:
                        raise ValueError(f"{section_name}.{model_type}.{alias} names unknown "
                                         f"model {target!r}")
        for model in self.models:
            if model.voice_changer is not None:
                self._check_chain(model, model.voice_changer)
        return self

    def _check_chain(self, model: CatalogModel, spec: VoiceChangerSpec) -> None:
        """A voice changer's models exist, are of the right types, and can do its work."""
        by_id = {m.id: m for m in self.models}
        hearing, speaking = by_id.get(spec.transcription), by_id.get(spec.speech)
        if hearing is None or hearing.type != "asr":
            raise ValueError(f"voice changer {model.id!r}: transcription "
                             f"{spec.transcription!r} is not an asr model of the catalog")
        if speaking is None or speaking.type != "tts":
            raise ValueError(f"voice changer {model.id!r}: speech {spec.speech!r} is not a "
                             "tts model of the catalog")
        unknown = [v for v in model.voices if v not in speaking.voices]
        if unknown:
            raise ValueError(f"voice changer {model.id!r}: voices {unknown} are not voices "
                             f"of {speaking.id}")
        if speaking.supported_formats and spec.output_format not in speaking.supported_formats:
            raise ValueError(f"voice changer {model.id!r}: {speaking.id} does not answer in "
                             f"{spec.output_format}")
        most = hearing.engine_options.max_seconds
        heard = float(1800 if most is None else most)
        if spec.max_source_audio_duration_seconds > heard:
            raise ValueError(f"voice changer {model.id!r}: its sources may be longer than "
                             f"{hearing.id} hears ({heard:g} s)")

    @cached_property
    def by_id(self) -> dict[str, CatalogModel]:
        return {m.id: m for m in self.models}

    def find(self, model_id: str, model_type: str | None = None) -> CatalogModel | None:
        """A model by id, by compatibility alias (`gpt-4o-mini`) or by trait (`default`).

        Aliases of `model_type` win, so `default` on the embeddings route is the default
        embedding model rather than the default chat model.
        """
        model = self.by_id.get(model_id)
        if model is not None:
            return model
        types = [model_type] if model_type else []
        types += [t for t in MODEL_TYPES if t != model_type]
        for t in types:
            for section in (self.compatibility_mapping, self.traits):
                target = section.get(t, {}).get(model_id)
                if target:
                    return self.by_id[target]
        return None

    def default_model(self, model_type: str) -> CatalogModel | None:
        """The model `/models/traits` names `default` for a type, else the type's first
        model; None when the catalog has no model of that type."""
        named = self.traits.get(model_type, {}).get("default")
        if named:
            return self.by_id[named]
        return next((m for m in self.models if m.type == model_type), None)

    def of_type(self, model_type: str | None) -> list[CatalogModel]:
        """The models `/models?type=` lists, in catalog order except that each type's default
        model comes first: clients that take "the first model of this type" get the default
        (the listing's order is otherwise the catalog's, so it is stable)."""
        if model_type in (None, "all"):
            found = list(self.models)
        elif model_type == "code":
            found = [m for m in self.models
                     if m.type == "text" and m.capabilities.get("optimizedForCode")]
        else:
            found = [m for m in self.models if m.type == model_type]
        defaults = {self.traits.get(m.type, {}).get("default") for m in found}
        return sorted(found, key=lambda m: m.id not in defaults)

    def for_operation(self, operation: ImageOperation) -> list[CatalogModel]:
        """The image models of one operation, those with the `default` trait first."""
        found = [m for m in self.models if m.operation == operation]
        return sorted(found, key=lambda m: "default" not in m.traits)

    @property
    def deployments(self) -> set[str]:
        return {m.deployment for m in self.models}


def load_catalog(path: str | Path) -> Catalog:
    return Catalog.model_validate(read_catalog_file(Path(path)))
