"""Discovery routes (no key needed), the catalog, and routing by model id."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.errors import ApiError
from serve_app.models.catalog import Catalog
from serve_app.models.router import ModelRouter, split_model_suffix


def test_models_are_listed_without_a_key_in_the_published_shape(gateway):
    resp = gateway.client.get("/api/v1/models")
    assert resp.status_code == 200
    body = resp.json()
    assert body["object"] == "list"
    assert body["type"] == "all"
    ids = {m["id"] for m in body["data"]}
    assert {"smollm2-135m-instruct", "text-embedding-all-minilm-l6-v2"} <= ids
    for record in body["data"]:
        assert {"id", "type", "object", "owned_by", "created", "model_spec"} <= set(record)
        assert record["object"] == "model"
        spec = record["model_spec"]
        assert {"privacy", "traits", "name"} <= set(spec)
        if record["type"] in ("text", "embedding"):
            assert spec["pricing"]["input"]["usd"] > 0
        elif record["type"] == "video":  # rate tables of no published pricing shape
            assert spec["video_pricing"] and "pricing" not in spec
        else:  # images: per image, per tier
            assert spec["pricing"]


def test_image_models_are_listed_per_type_with_their_prices(gateway):
    images = gateway.client.get("/api/v1/models?type=image").json()["data"]
    assert {m["id"] for m in images} == {"stable-diffusion-test", "background-remover"}
    upscale = gateway.client.get("/api/v1/models?type=upscale").json()["data"]
    assert upscale[0]["model_spec"]["pricing"]["upscale"]["4x"]["usd"] == 0.08
    edit = gateway.client.get("/api/v1/models?type=inpaint").json()["data"][0]
    assert edit["model_spec"]["capabilities"]["maxInputImages"] == 3
    assert "TEST WEIGHTS" in edit["model_spec"]["description"]
    assert "operation" not in edit and "operation" not in edit["model_spec"]


def test_models_type_filter(gateway):
    text = gateway.client.get("/api/v1/models?type=text").json()
    assert text["type"] == "text"
    assert {m["type"] for m in text["data"]} == {"text"}
    caps = text["data"][0]["model_spec"]["capabilities"]
    assert caps["supportsFunctionCalling"] is True and "supportsVision" in caps
    assert {m["type"] for m in gateway.client.get(
        "/api/v1/models?type=embedding").json()["data"]} == {"embedding"}
    bad = gateway.client.get("/api/v1/models?type=spaceship")
    assert bad.status_code == 400
    assert bad.json()["details"]["type"]["_errors"]


def test_models_without_a_running_deployment_are_offline(gateway):
    data = gateway.client.get("/api/v1/models").json()["data"]
    assert all(m["model_spec"]["offline"] is True for m in data)


def test_traits_compatibility_mapping_and_image_styles(gateway):
    traits = gateway.client.get("/api/v1/models/traits").json()
    assert traits["data"]["default"] == "smollm2-135m-instruct"
    emb = gateway.client.get("/api/v1/models/traits?type=embedding").json()
    assert emb["data"]["default"] == "text-embedding-all-minilm-l6-v2"
    compat = gateway.client.get("/api/v1/models/compatibility_mapping").json()
    assert compat["data"]["gpt-4o-mini"] == "smollm2-135m-instruct"
    styles = gateway.client.get("/api/v1/image/styles").json()
    assert styles["object"] == "list" and "Anime" in styles["data"]


def _catalog(**extra) -> dict:
    model = {"id": "m1", "type": "text", "name": "M", "deployment": "text-xs",
             "engine": "vllm", "size_class": "XS", "pricing": {"input": {"usd": 1, "diem": 1}}}
    return {"models": [model], **extra}


def test_catalog_refuses_duplicates_unknown_aliases_and_typos():
    raw = _catalog()
    raw["models"].append(dict(raw["models"][0]))
    with pytest.raises(ValidationError, match="duplicate"):
        Catalog.model_validate(raw)
    with pytest.raises(ValidationError, match="unknown model"):
        Catalog.model_validate(_catalog(traits={"text": {"default": "nope"}}))
    typo = _catalog()
    typo["models"][0]["pricingg"] = {}
    with pytest.raises(ValidationError):
        Catalog.model_validate(typo)
    no_size = _catalog()
    del no_size["models"][0]["size_class"]
    with pytest.raises(ValidationError, match="size_class"):
        Catalog.model_validate(no_size)


def test_model_suffix_parameters():
    assert split_model_suffix("m1") == ("m1", {})
    assert split_model_suffix("m1:enable_web_search=auto&disable_thinking=true") == (
        "m1", {"enable_web_search": "auto", "disable_thinking": True})
    with pytest.raises(ApiError):
        split_model_suffix("m1:a=1&broken")


def test_router_resolves_ids_aliases_and_reports_missing_or_offline_models():
    catalog = Catalog.model_validate(_catalog(compatibility_mapping={"text": {"gpt-4o": "m1"}}))
    handle = object()
    router = ModelRouter(catalog, {"text-xs": handle})
    routed = router.resolve("gpt-4o:character_slug=alan", "text")
    assert routed.model.id == "m1" and routed.suffix_params == {"character_slug": "alan"}
    assert router.text(routed.model) is handle
    with pytest.raises(ApiError) as missing:
        router.resolve("unknown-model")
    assert (missing.value.status, missing.value.code) == (404, "MODEL_NOT_FOUND")
    with pytest.raises(ApiError) as wrong_type:
        router.resolve("m1", "embedding")
    assert wrong_type.value.code == "INVALID_MODEL"
    with pytest.raises(ApiError) as offline:
        ModelRouter(catalog, {}).text(routed.model)
    assert (offline.value.status, offline.value.code) == (503, "MODEL_OFFLINE")


def test_delivery_by_link_is_for_private_video_models_only():
    video = {"id": "v1", "type": "video", "name": "V", "deployment": "video-generation",
             "engine": "wan", "operation": "text-to-video", "pricing": {},
             "delivery": "download_url"}
    assert Catalog.model_validate({"models": [video]}).by_id["v1"].delivery == "download_url"
    with pytest.raises(ValidationError, match="private video models only"):
        Catalog.model_validate({"models": [{**video, "privacy": "anonymized"}]})
    with pytest.raises(ValidationError, match="private video models only"):
        Catalog.model_validate({"models": [{**_catalog()["models"][0],
                                            "delivery": "download_url"}]})
