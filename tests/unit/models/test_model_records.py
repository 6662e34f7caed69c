"""`/models` as the reference's clients parse it: every record of every type of the shipped
catalogs (test-weight models included) validates against the reference's model schema, each
type's default model comes first, and `GET /models/{id}` (the `openai` SDK's
`models.retrieve`) answers the listing's record, or the spec's error for an unknown id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import NotFoundError, OpenAI

from serve_app.settings import PROJECT_ROOT, Settings
from tests.reference_api import response_schema, schema_errors, with_spec_model_capabilities
from tests.unit.conftest import Gateway, make_gateway

SHIPPED_CATALOGS = ["models.yaml", "models.production.yaml"]
# The `type` values the reference's `GET /models` takes.
LISTING_TYPES = ["asr", "embedding", "image", "music", "text", "tts", "upscale", "inpaint",
                 "video", "all", "code"]


def reference_listing_schema() -> dict[str, Any]:
    """The reference's `GET /models` answer, with the two capabilities our spec adds."""
    return with_spec_model_capabilities(response_schema("/models"))


@pytest.fixture(params=SHIPPED_CATALOGS)
def shipped(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway on a shipped catalog (every model offline: no deployment runs)."""
    yield from make_gateway(Settings(data_dir=tmp_path,
                                     model_catalog=PROJECT_ROOT / "configs" / request.param))


@pytest.fixture
def sdk(gateway: Gateway) -> OpenAI:
    return OpenAI(base_url="http://testserver/api/v1", api_key="no key needed", max_retries=0,
                  http_client=gateway.client)


def test_every_record_of_every_type_validates_against_the_reference_schema(shipped):
    schema = reference_listing_schema()
    listed = 0
    for model_type in LISTING_TYPES:
        resp = shipped.client.get("/api/v1/models", params={"type": model_type})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert schema_errors(schema, body) == [], model_type
        listed += len(body["data"])
    all_models = shipped.client.get("/api/v1/models").json()["data"]
    assert listed >= 2 * len(all_models)  # each model once by its type, once in `all`


def test_the_local_catalog_lists_every_type_its_test_weights_marked(gateway):
    """configs/models.yaml (the laptop's): every modality, on test weights where no real
    weights come without a download (the cluster's catalog has none of them)."""
    all_models = gateway.client.get("/api/v1/models").json()["data"]
    assert {m["type"] for m in all_models} >= {"text", "embedding", "image", "inpaint", "upscale",
                                               "tts", "asr", "video", "music"}
    assert any("TEST WEIGHTS" in m["model_spec"]["description"] for m in all_models)


def test_records_carry_the_fields_the_reference_keeps_them_in(gateway):
    edit = gateway.client.get("/api/v1/models/instruct-pix2pix-test").json()["model_spec"]
    assert edit["capabilities"]["maxInputImages"] == 3  # the spec's place
    assert edit["constraints"]["maxInputImages"] == 3  # the reference's
    assert edit["constraints"]["combineImages"] is True
    assert edit["capabilities"]["supportsVision"] is False
    video = gateway.client.get("/api/v1/models/video-upscaler").json()["model_spec"]
    assert video["constraints"]["model_type"] == "video"
    assert video["constraints"]["aspect_ratios"] == [] and video["constraints"]["resolutions"] == []
    assert "pricing" not in video and video["video_pricing"]["per_second_by_output_tier"]
    narrator = gateway.client.get("/api/v1/models/piper-narrator").json()
    assert narrator["owned_by"] == "venice.ai"
    assert narrator["model_spec"]["max_speed"] == 4 and "constraints" not in narrator["model_spec"]


def test_each_types_default_is_listed_first_and_the_order_is_stable(gateway):
    for model_type in ("tts", "image", "text", "embedding", "inpaint", "video", "music"):
        default = gateway.client.get("/api/v1/models/traits",
                                     params={"type": model_type}).json()["data"]["default"]
        listed = gateway.client.get("/api/v1/models", params={"type": model_type}).json()
        ids = [m["id"] for m in listed["data"]]
        assert ids[0] == default, model_type
        again = gateway.client.get("/api/v1/models", params={"type": model_type}).json()
        assert [m["id"] for m in again["data"]] == ids
    speech = [m["id"] for m in gateway.client.get("/api/v1/models",
                                                  params={"type": "tts"}).json()["data"]]
    assert speech == ["tts-kokoro", "tts-piper-joe"]  # not tts-piper-joe first any more
    images = [m["id"] for m in gateway.client.get("/api/v1/models",
                                                  params={"type": "image"}).json()["data"]]
    assert images == ["stable-diffusion-test", "background-remover"]


def test_in_the_whole_listing_each_default_comes_before_the_other_models_of_its_type(gateway):
    listed = gateway.client.get("/api/v1/models").json()["data"]
    first_of_type: dict[str, str] = {}
    for record in listed:
        first_of_type.setdefault(record["type"], record["id"])
    for model_type, first in first_of_type.items():
        default = gateway.client.get("/api/v1/models/traits",
                                     params={"type": model_type}).json()["data"]["default"]
        assert first == default, model_type


def test_the_sdk_retrieves_one_model_as_the_listing_shows_it(gateway, sdk):
    listed = {m["id"]: m for m in gateway.client.get("/api/v1/models").json()["data"]}

    model = sdk.models.retrieve("smollm2-135m-instruct")

    assert (model.id, model.object, model.owned_by) == ("smollm2-135m-instruct", "model",
                                                        "venice.ai")
    assert model.model_dump(exclude_unset=True) == listed["smollm2-135m-instruct"]
    for model_id, record in listed.items():
        assert gateway.client.get(f"/api/v1/models/{model_id}").json() == record


def test_a_model_id_with_a_dot_is_retrieved(tmp_path):
    catalog = PROJECT_ROOT / "configs" / "models.production.yaml"
    for gateway in make_gateway(Settings(data_dir=tmp_path, model_catalog=catalog)):
        resp = gateway.client.get("/api/v1/models/qwen2.5-vl-7b-instruct")
        assert resp.status_code == 200, resp.text
        assert resp.json()["id"] == "qwen2.5-vl-7b-instruct"
        assert schema_errors(reference_listing_schema(), {
            "object": "list", "type": "text", "data": [resp.json()]}) == []


def test_an_alias_answers_its_models_record(gateway):
    resp = gateway.client.get("/api/v1/models/gpt-4o-mini")
    assert resp.status_code == 200
    assert resp.json()["id"] == "smollm2-135m-instruct"


@pytest.mark.parametrize("unknown", ["no-such-model", "org:model-v1.5", "org%3Amodel",
                                     "org/model"])
def test_an_unknown_model_is_a_404_in_the_spec_error_shape(gateway, sdk, unknown):
    resp = gateway.client.get(f"/api/v1/models/{unknown}")

    assert resp.status_code == 404
    body = resp.json()
    assert body["code"] == "MODEL_NOT_FOUND" and isinstance(body["error"], str)
    assert set(body) == {"error", "code"}


def test_the_sdk_sees_an_unknown_model_as_not_found(sdk):
    with pytest.raises(NotFoundError) as missing:
        sdk.models.retrieve("gpt-17-ultra:preview")
    assert missing.value.status_code == 404
    assert missing.value.response.json()["code"] == "MODEL_NOT_FOUND"
