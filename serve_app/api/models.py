"""Discovery, readable without a key: models, traits, compatibility mapping, image styles."""

from __future__ import annotations

from typing import Literal

from fastapi import Query

from serve_app.api.deps import Services
from serve_app.api.guarded_route import guarded_router
from serve_app.errors import ApiError
from serve_app.models.catalog import CatalogModel
from serve_app.models.records import model_record
from serve_app.services import GatewayServices

router = guarded_router(tags=["Models"])

TypeFilter = Literal["asr", "embedding", "image", "music", "text", "tts", "upscale", "inpaint",
                     "video", "all", "code"]
AliasTypeFilter = Literal["asr", "embedding", "image", "music", "text", "tts", "upscale",
                          "inpaint", "video"]


@router.get("/models", summary="List models")
async def list_models(services: Services, type: TypeFilter = Query("all")) -> dict:
    models = services.catalog.of_type(type)
    return {
        "object": "list",
        "type": type,
        "data": [model_record(m, offline=_offline(services, m)) for m in models],
    }


@router.get("/models/traits", summary="Model traits and the model behind each")
async def list_traits(services: Services, type: AliasTypeFilter = Query("text")) -> dict:
    return {"object": "list", "type": type, "data": services.catalog.traits.get(type, {})}


@router.get("/models/compatibility_mapping", summary="Model names of other APIs we answer to")
async def list_compatibility(services: Services, type: AliasTypeFilter = Query("text")) -> dict:
    return {"object": "list", "type": type,
            "data": services.catalog.compatibility_mapping.get(type, {})}


@router.get("/image/styles", tags=["Image"], summary="Image styles for generation")
async def list_image_styles(services: Services) -> dict:
    return {"object": "list", "data": list(services.catalog.image_styles)}


@router.get("/models/{model_id:path}", summary="One model, as the listing shows it")
async def get_model(model_id: str, services: Services) -> dict:
    """The record `GET /models` lists for this id (a compatibility alias or trait, such as
    `gpt-4o-mini` or `default`, answers its model's record); registered after the
    `/models/...` listings so that their paths are not read as model ids."""
    model = services.catalog.find(model_id)
    if model is None:
        raise ApiError(404, f"Model {model_id!r} not found; GET /models lists the models",
                       code="MODEL_NOT_FOUND")
    return model_record(model, offline=_offline(services, model))


def _offline(services: GatewayServices, model: CatalogModel) -> bool:
    """Its deployment is not running, or its server (`engine: openai`) does not answer."""
    return not services.router.is_online(model) or services.router.upstreams.is_offline(model)
