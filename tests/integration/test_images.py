"""The image endpoints through the real Serve application: Real-ESRGAN upscaling, GrabCut
background removal, diffusers edits and generation on test weights; JSON and multipart
bodies, URLs through the private-address guard, every refusal a clear error that charges
nothing, and each success charged the catalog's price to the nano-unit."""

from __future__ import annotations

import base64
import io
from urllib.parse import unquote

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from tests.integration.accounts import Account
from tests.integration.accounts import nanos as _nanos

pytestmark = pytest.mark.integration


def _png(size: tuple[int, int], color=(40, 120, 200), mode: str = "RGB") -> bytes:
    image = Image.new(mode, size, color)
    draw = ImageDraw.Draw(image)
    w, h = size
    draw.ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4), fill=(230, 200, 40))
    draw.line((0, 0, w, h), fill=(10, 10, 10), width=3)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _scene() -> tuple[bytes, np.ndarray]:
    """A red, textured disc in the middle of a plain blue-grey background, and its mask."""
    rng = np.random.default_rng(7)
    h, w = 240, 320
    yy, xx = np.mgrid[0:h, 0:w]
    mask = (yy - h / 2) ** 2 / (h / 3.2) ** 2 + (xx - w / 2) ** 2 / (w / 4) ** 2 <= 1
    pixels = np.empty((h, w, 3), np.uint8)
    pixels[:] = (90, 110, 140)
    pixels += rng.integers(0, 8, (h, w, 3), dtype=np.uint8)
    subject = np.clip(np.stack([200 + 30 * np.sin(xx / 5), 60 + 20 * np.cos(yy / 7),
                                40 + 0 * xx], -1), 0, 255).astype(np.uint8)
    pixels[mask] = subject[mask]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue(), mask


@pytest.fixture
def account(platform, tmp_path) -> Account:
    return Account(platform, tmp_path)


def _open(resp: httpx.Response) -> Image.Image:
    return Image.open(io.BytesIO(resp.content))


# ---- upscale -----------------------------------------------------------------------------

def test_upscale_json_and_multipart_give_the_scaled_png_and_charge_its_tier(account):
    resp = account.post("/image/upscale", json={"image": _b64(_png((256, 256))), "scale": 2})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/png"
    assert resp.headers["x-service-model-id"] == "upscaler"
    assert _open(resp).size == (512, 512)
    assert account.spent() == _nanos("0.02")

    resp = account.post("/image/upscale", files={"image": ("a.png", _png((300, 240)))},
                        data={"scale": "3", "creativity": "0.5"})  # clamped to 0.02
    assert resp.status_code == 200, resp.text
    assert _open(resp).size == (900, 720)
    assert account.spent() == _nanos("0.02") + _nanos("0.08")  # 3x pays the 4x tier


def test_upscale_refusals_are_clear_and_charge_nothing(account, platform):
    cases = [
        ({"json": {"image": _b64(_png((200, 200)))}}, 400, "65536"),
        ({"json": {"image": _b64(_png((2100, 2100))), "scale": 2}}, 400, "16777216"),
        ({"json": {"image": _b64(_png((256, 256))), "scale": 5}}, 400, "scale"),
        ({"json": {"image": ""}}, 400, "image"),
        ({"json": {"image": "not base64 at all!"}}, 400, "base64"),
        ({"json": {"image": "https://example.com/a.png"}}, 400, "image"),
        ({"json": {"scale": 2}}, 400, "image"),
        ({"content": b"hello", "headers": {"content-type": "text/plain"}}, 415, "content type"),
    ]
    for kwargs, status, words in cases:
        headers = {**account.auth, **kwargs.pop("headers", {})}
        resp = httpx.post(f"{account.url}/image/upscale", headers=headers, timeout=60,
                          **kwargs)
        assert resp.status_code == status, (kwargs.keys(), resp.text)
        assert words.lower() in resp.text.lower(), resp.text
    assert account.spent() == 0


def test_files_of_25_mb_are_payload_too_large(account):
    big = b"\x89PNG" + bytes(25 * 1024 * 1024)
    resp = account.post("/image/upscale", files={"image": ("big.png", big)})
    assert resp.status_code == 413
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"
    resp = account.post("/image/upscale", json={"image": _b64(big)})
    assert resp.status_code == 413 and resp.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert account.spent() == 0


def test_a_decompression_bomb_is_refused_from_its_header(account):
    bomb = io.BytesIO()
    Image.new("1", (30000, 30000)).save(bomb, "PNG")  # 900 M pixels, ~110 kB of file
    resp = account.post("/image/background-remove", json={"image": _b64(bomb.getvalue())})
    assert resp.status_code == 400, resp.text
    assert "pixels" in resp.json()["error"]
    assert account.spent() == 0


def test_a_truncated_image_is_a_400_from_the_model_replica_and_released(account):
    whole = _png((400, 300))
    resp = account.post("/image/upscale", json={"image": _b64(whole[: len(whole) // 2])})
    assert resp.status_code == 400, resp.text
    assert "truncated" in resp.json()["error"] or "corrupt" in resp.json()["error"]
    assert account.spent() == 0


# ---- background removal ------------------------------------------------------------------

def test_background_removal_from_a_url_gives_a_transparent_png(account, platform):
    scene, mask = _scene()
    url = platform.web.publish("scene.png", scene, "image/png")
    resp = account.post("/image/background-remove",
                        json={"image_url": url, "anon_user_id": "user-42"})
    assert resp.status_code == 200, resp.text
    out = _open(resp)
    assert out.mode == "RGBA" and out.size == (320, 240)
    alpha = np.asarray(out)[..., 3] > 127
    iou = (alpha & mask).sum() / (alpha | mask).sum()
    assert iou >= 0.8, iou
    assert account.spent() == _nanos("0.005")


def test_background_removal_refuses_private_urls_and_bad_user_ids(account):
    cases = [
        ({"image_url": "http://10.0.0.1/a.png"}, "image_url"),
        ({"image": "http://127.0.0.1:9/a.png"}, "image"),
        ({"image": _b64(_png((256, 256))), "anon_user_id": "a||b"}, "anon_user_id"),
        ({"image": _b64(_png((256, 256))), "anon_user_id": "x" * 129}, "anon_user_id"),
    ]
    for body, field in cases:
        resp = account.post("/image/background-remove", json=body)
        assert resp.status_code == 400, resp.text
        assert field in resp.json().get("details", {}) or field in resp.text
    assert account.spent() == 0


def test_background_removal_takes_a_multipart_upload(account):
    scene, _ = _scene()
    resp = account.post("/image/background-remove", files={"image": ("s.png", scene)})
    assert resp.status_code == 200, resp.text
    assert _open(resp).mode == "RGBA"


# ---- multi-edit --------------------------------------------------------------------------

def test_multi_edit_with_layers_charges_extra_inputs_and_reports_blur(account, platform):
    base = _png((640, 360))
    layer = platform.web.publish("layer.png", _png((400, 240), mode="RGBA",
                                                   color=(0, 0, 0, 0)), "image/png")
    resp = account.post("/image/multi-edit", json={
        "prompt": "make the sky orange", "images": [_b64(base), layer],
        "safe_mode": True})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/png"  # 1K default: PNG
    assert _open(resp).size == (1024, 576)  # auto: 16:9 from the base image
    assert resp.headers["x-service-is-blurred"] == "true"  # the test weights flag all
    assert resp.headers["x-service-model-id"] == "instruct-pix2pix-test"
    assert account.spent() == _nanos("0.04") + _nanos("0.005")


def test_multi_edit_fields_shape_the_output(account):
    base = _png((400, 400))
    resp = account.post("/image/multi-edit", files=[("images", ("b.png", base))],
                        data={"prompt": "add a hat", "aspect_ratio": "9:16",
                              "output_format": "jpg", "resolution": "2K"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/jpeg"
    assert _open(resp).size == (1152, 2048)
    assert resp.headers["x-service-is-blurred"] == "false"
    assert account.spent() == _nanos("0.06")


def test_multi_edit_quality_tier_sets_the_price(account):
    resp = account.post("/image/multi-edit", json={
        "prompt": "sepia", "images": [_b64(_png((300, 300)))], "modelId": "tiered-edit-test",
        "quality": "low", "output_format": "webp"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/webp"
    assert account.spent() == _nanos("0.03")


def test_multi_edit_enhanced_prompt_comes_back_url_encoded_and_is_charged(account):
    resp = account.post("/image/multi-edit", json={
        "prompt": "brighter", "images": [_b64(_png((256, 256)))], "enhance_prompt": True})
    assert resp.status_code == 200, resp.text
    enhanced = unquote(resp.headers["x-service-enhanced-prompt"])
    assert enhanced.strip()
    assert account.spent() == _nanos("0.04") + _nanos("0.002")


def test_multi_edit_refusals_charge_nothing(account):
    one = _b64(_png((256, 256)))
    cases = [
        ({"prompt": "x" * 101, "images": [one]}, "prompt"),  # the model's promptCharacterLimit
        ({"prompt": "x", "images": [one] * 4}, "images"),     # maxInputImages 3
        ({"prompt": "x", "images": []}, "images"),
        ({"prompt": "", "images": [one]}, "prompt"),
        ({"prompt": "x", "images": [one], "aspect_ratio": "5:4"}, "aspect_ratio"),
        ({"prompt": "x", "images": [one], "resolution": "4K"}, "resolution"),
        ({"prompt": "x", "images": [one], "modelId": "upscaler"}, "model"),
        ({"prompt": "x", "images": [_b64(_png((100, 100)))]}, "images[0]"),
    ]
    for body, field in cases:
        resp = account.post("/image/multi-edit", json=body)
        assert resp.status_code == 400, (body.get("prompt", "")[:5], resp.text)
        assert field in resp.text
    resp = account.post("/image/multi-edit", files={"prompt": (None, "x"),
                                                    "images": (None, one)})
    assert resp.status_code == 400 and "file" in resp.text  # multipart takes files only
    assert account.spent() == 0


# ---- generation and discovery ------------------------------------------------------------

def test_openai_sdk_images_generate_works_unchanged(platform, account):
    from openai import OpenAI

    sdk = OpenAI(base_url=platform.base_url, api_key=account.key, max_retries=0, timeout=300)
    result = sdk.images.generate(model="dall-e-3", prompt="a lighthouse at dusk",
                                 size="256x256")
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.size == (256, 256) and image.format == "PNG"
    assert account.spent() == _nanos("0.01")


def test_image_generate_variants_styles_and_binary(account):
    resp = account.post("/image/generate", json={
        "model": "stable-diffusion-test", "prompt": "a fox", "width": 128, "height": 96,
        "variants": 2, "style_preset": "Anime", "seed": 5, "format": "png",
        "safe_mode": False})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert len(body["images"]) == 2 and set(body["timing"]) >= {"inferenceDuration", "total"}
    assert Image.open(io.BytesIO(base64.b64decode(body["images"][0]))).size == (128, 96)
    assert resp.headers["x-service-is-blurred"] == "false"
    assert account.spent() == 2 * _nanos("0.01")

    binary = account.post("/image/generate", json={
        "prompt": "a fox", "width": 64, "height": 64, "return_binary": True, "format": "webp"})
    assert binary.status_code == 200 and binary.headers["content-type"] == "image/webp"
    bad = account.post("/image/generate", json={"prompt": "a fox", "style_preset": "Nope"})
    assert bad.status_code == 400 and "style_preset" in bad.text
    assert account.spent() == 3 * _nanos("0.01")


def test_image_models_and_styles_are_listed(platform):
    listed = httpx.get(f"{platform.base_url}/models", params={"type": "image"}).json()
    ids = {m["id"] for m in listed["data"]}
    assert {"stable-diffusion-test", "background-remover"} <= ids
    edits = httpx.get(f"{platform.base_url}/models", params={"type": "inpaint"}).json()
    pix = next(m for m in edits["data"] if m["id"] == "instruct-pix2pix-test")
    assert pix["model_spec"]["capabilities"]["maxInputImages"] == 3
    assert pix["model_spec"]["pricing"]["inputImages"]["included"] == 1
    styles = httpx.get(f"{platform.base_url}/image/styles").json()
    assert styles == {"object": "list", "data": ["Anime", "Line Art", "Watercolor"]}


def test_images_without_credentials_answer_the_wallet_discovery_402(platform):
    resp = httpx.post(f"{platform.base_url}/image/upscale",
                      json={"image": _b64(_png((256, 256)))})
    assert resp.status_code == 402
    assert resp.json()["x402Version"] and "PAYMENT-REQUIRED" in resp.headers


def test_a_wallet_pays_for_an_upscale_with_its_credit(platform):
    import asyncio

    from tests.integration.test_wallets import sign_in, top_up_with_the_x402_client
    from tests.wallets import Wallet

    first, second = platform.replica_urls
    wallet = Wallet()
    paid = asyncio.run(top_up_with_the_x402_client(wallet, f"{first}/x402/top-up"))
    assert paid.status_code == 200, paid.text
    body = {"image": _b64(_png((256, 256))), "scale": 2}
    asked = httpx.post(f"{second}/image/upscale", json=body)
    assert asked.status_code == 402
    resp = httpx.post(f"{second}/image/upscale", json=body, headers=sign_in(wallet, asked),
                      timeout=120)
    assert resp.status_code == 200, resp.text
    assert _open(resp).size == (512, 512)
    assert resp.headers["X-Balance-Remaining"] == "4.980000"  # 5 USD less the 2x price


def test_image_requests_are_rate_limited_per_key_at_the_image_class(account):
    tiny = _b64(_png((64, 64)))
    answers = [account.post("/image/background-remove", json={"image": tiny})
               for _ in range(21)]
    assert [r.status_code for r in answers[:20]] == [200] * 20
    refused = answers[20]
    assert refused.status_code == 429, refused.text
    assert refused.headers["x-ratelimit-limit-requests"] == "20"
    assert account.spent() == 20 * _nanos("0.005")  # the refused one charged nothing
