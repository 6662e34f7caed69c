"""The public model record of `GET /models` and `GET /models/{id}`, in the reference's model
schema (shared/reference/venice/openapi.yaml, `ModelResponse`), so that clients which validate
it (types, required fields, enums) accept every model, test-weight ones included.

The catalog keeps what the platform needs in its own terms; the record places it where the
reference's clients look:

- `owned_by` is the one value the reference's enum allows;
- `capabilities` always carries the reference's required flags (false unless the catalog says
  otherwise) and, beyond the reference's keys, only those our spec names
  (`maxInputImages`, `supportsOptimizePromptThinking`); other catalog capabilities are
  published under `constraints`, where the reference keeps them (`combineImages`);
- an edit model's `constraints` also carry `maxInputImages` and `combineImages`, the
  reference's place for them;
- a video model's constraints always list `aspect_ratios`, `resolutions`, `durations` (empty:
  none to choose), `audio`, `audio_configurable` and a `model_type`; its pricing table is not
  one of the reference's pricing shapes, so it is published as `video_pricing` (the rates
  `/video/quote` applies) instead of `pricing`;
- a queued audio model's settings (speed range, prompt limit) sit on `model_spec` itself, as
  the reference's music fields do; so do a voice changer's (`voice_changer: true`, its
  accepted formats, longest source, options, voices and default voice);
- a deprecation always names `removesAt` (its date when the catalog gives no later one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve_app.models.catalog import CatalogModel

OWNED_BY = "venice.ai"  # the reference's enum for `owned_by` has this one value

# The reference's required capability flags, with the value a model has unless its catalog
# entry says otherwise.
CAPABILITY_DEFAULTS: dict[str, Any] = {
    "optimizedForCode": False,
    "quantization": "not-available",
    "supportsFunctionCalling": False,
    "supportsAudioInput": False,
    "supportsReasoning": False,
    "supportsReasoningEffort": False,
    "supportsResponseSchema": False,
    "supportsMultipleImages": False,
    "supportsVision": False,
    "supportsVideoInput": False,
    "supportsWebSearch": False,
    "supportsLogProbs": False,
    "supportsTeeAttestation": False,
    "supportsE2EE": False,
    "supportsXSearch": False,
}
# Capability keys a record may carry: the reference's, and those our spec names.
PUBLISHED_CAPABILITIES = frozenset(CAPABILITY_DEFAULTS) | {
    "reasoningEffortOptions", "defaultReasoningEffort", "maxImages", "maxVideos",
    "maxInputImages", "supportsOptimizePromptThinking"}
# Edit-model capabilities the reference publishes under `constraints`.
EDIT_CONSTRAINTS_FROM_CAPABILITIES = ("maxInputImages", "combineImages")
# The reference's video model types; other operations (upscale, interpolation, reference
# clips) are `video`.
VIDEO_MODEL_TYPES = frozenset({"text-to-video", "image-to-video"})


def model_record(model: CatalogModel, *, offline: bool) -> dict[str, Any]:
    """The published record of one catalog model."""
    spec: dict[str, Any] = {
        "name": model.name,
        "description": model.description,
        "privacy": model.privacy,
        "traits": list(model.traits),
        "offline": offline,
        "beta": model.beta,
        "modelSource": model.model_source or "",
    }
    if model.type == "video":
        spec["video_pricing"] = model.pricing
    else:
        spec["pricing"] = model.pricing
    capabilities, constraints = _capabilities_and_constraints(model)
    if capabilities:
        spec["capabilities"] = capabilities
    if model.type == "music":
        spec.update(constraints)
    elif constraints:
        spec["constraints"] = constraints
    if model.voices:
        spec["voices"] = list(model.voices)
    if model.voice_changer is not None:  # what it accepts, in the reference's names
        spec.update(model.voice_changer.public_fields(model.voices))
    if model.supported_formats:
        spec["supported_formats"] = list(model.supported_formats)
        spec["default_format"] = model.default_format or model.supported_formats[0]
    if model.context_length:
        spec["availableContextTokens"] = model.context_length
    if model.max_completion_tokens:
        spec["maxCompletionTokens"] = model.max_completion_tokens
    if model.dimensions:
        spec["embeddingDimensions"] = model.dimensions
    if model.deprecation:
        deprecation = model.deprecation.model_dump(mode="json", exclude_none=True)
        deprecation.setdefault("removesAt", deprecation["date"])
        spec["deprecation"] = deprecation
    record: dict[str, Any] = {
        "id": model.id,
        "type": model.type,
        "object": "model",
        "owned_by": OWNED_BY,
        "created": model.created,
        "model_spec": spec,
    }
    if model.context_length:
        record["context_length"] = model.context_length
    return record


def _capabilities_and_constraints(model: CatalogModel
                                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    constraints = model.constraints.given()
    capabilities: dict[str, Any] = {}
    if model.type == "text" or model.capabilities:
        capabilities = {**CAPABILITY_DEFAULTS}
        for key, value in model.capabilities.items():
            if key in PUBLISHED_CAPABILITIES:
                capabilities[key] = value
            else:
                constraints.setdefault(key, value)
    if model.type == "inpaint":
        for key in EDIT_CONSTRAINTS_FROM_CAPABILITIES:
            if key in model.capabilities:
                constraints.setdefault(key, model.capabilities[key])
    if model.type == "video":
        for key in ("aspect_ratios", "resolutions", "durations"):
            constraints.setdefault(key, [])
        constraints.setdefault("audio", False)
        constraints.setdefault("audio_configurable", False)
        constraints.setdefault("model_type", model.operation if model.operation
                               in VIDEO_MODEL_TYPES else "video")
    return capabilities, constraints
