"""An image operation (upscale) through admission, the image deployment and settlement."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image

from deployments.protocol import ImageRequest
from tests.fakes import at_capacity, reported
from tests.unit.flows.books import nanos

TIER_USD = {"2x": "0.02", "4x": "0.08"}  # upscaler (catalog.yaml), per image


def _png(width: int = 256, height: int = 256) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def _upscale(gateway, key: str, image: bytes, **body):
    return gateway.client.post("/api/v1/image/upscale", headers=gateway.auth(key), json={
        "image": base64.b64encode(image).decode(), **body})


def test_upscale_answers_the_models_png_with_the_model_headers(fake_gateway, fakes, key):
    source = _png()

    resp = _upscale(fake_gateway, key, source, scale=2)

    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/png"
    made = Image.open(io.BytesIO(resp.content))
    assert (made.format, made.size) == ("PNG", (512, 512))
    assert resp.headers["x-service-model-id"] == "upscaler"
    assert resp.headers["x-service-model-router"] == "direct"
    assert resp.headers["x-service-upscale-factor"] == "2"
    assert resp.headers["x-service-balance-usd"] == "10"
    (call,) = fakes["image-upscale"].calls
    model_id, request = call.args
    assert isinstance(request, ImageRequest)
    assert (model_id, request.images, request.fields, request.format) == (
        "upscaler", [source], ["image"], "png")
    assert request.params["scale"] == 2
    # whose picture it is, for the engine's fair share: the account, hashed
    assert request.tenant.id == hashlib.sha256(
        f"tenant:{fake_gateway.account_id}".encode()).hexdigest()[:24]


@pytest.mark.parametrize(("scale", "tier"), [(2, "2x"), (3, "4x"), (4, "4x")])
def test_upscale_is_charged_the_catalog_price_of_its_tier(fake_gateway, key, books, scale,
                                                          tier):
    before = books.balance_nanos()

    resp = _upscale(fake_gateway, key, _png(), scale=scale)

    assert resp.status_code == 200, resp.text
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "upscaler"
    assert charge.total_nanos == nanos(TIER_USD[tier])
    assert books.balance_nanos() == before - nanos(TIER_USD[tier])
    assert books.open_holds() == 0


@pytest.mark.parametrize(("failure", "status"), [
    (at_capacity(), 503), (reported(503, "out of memory", code="MODEL_AT_CAPACITY"), 503),
    (reported(400, "image data is truncated or corrupt", code="CORRUPTED_IMAGE",
              field="image"), 400)], ids=["at-capacity", "reported-503", "reported-400"])
def test_upscale_that_fails_charges_nothing_and_releases_the_hold(fake_gateway, fakes, key,
                                                                  books, failure, status):
    fakes["image-upscale"].fail_with(failure)
    before = books.balance_nanos()

    resp = _upscale(fake_gateway, key, _png(), scale=2)

    assert resp.status_code == status, resp.text
    assert books.entries() == 0
    assert books.balance_nanos() == before
    assert books.open_holds() == 0


def test_an_image_too_small_to_upscale_is_refused_before_the_model(fake_gateway, fakes, key,
                                                                   books):
    resp = _upscale(fake_gateway, key, _png(64, 64), scale=2)

    assert resp.status_code == 400
    assert fakes["image-upscale"].calls == []
    assert books.entries() == 0
    assert books.open_holds() == 0
