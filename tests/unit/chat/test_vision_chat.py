"""Image and video parts of a chat, through admission, the media checks, a vision model's
deployment and settlement, in process: the model receives the checked bytes (never a URL) in
the typed request, with placeholders where the parts were; it is charged at its catalog price
for the tokens it counted; the hold covers every part before any URL is fetched; a model
without vision, and a bad part, are refused with nothing charged."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from PIL import Image
from sqlmodel import Session, select

from deployments.engines.video import encode_mp4
from deployments.protocol import TextEvent, TextRequest, Usage
from serve_app.chat.vision import VisionSpec
from serve_app.db.engine import make_engine
from serve_app.db.tables import Reservation
from serve_app.models.catalog import load_catalog
from serve_app.settings import Settings
from tests.fakes import (
    DeploymentHandle,
    FakeTextDeployment,
    FakeTextEngine,
    fake_deployments,
    offline,
)
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.books import Books, per_million
from tests.unit.flows.conftest import CATALOG

INPUT_USD, OUTPUT_USD = 10, 20
VISION = {"layout": "patches", "images": 3, "videos": 1, "video_frames": 4,
          "video_seconds": 10, "max_pixels": 28 * 28 * 256}


class FakeVisionEngine(FakeTextEngine):
    """A vision model's text engine: its prompt counts the fake's text tokens and, as a
    vision model's processor does, each image's and video frame's tokens."""

    def chunks(self, request: TextRequest) -> list[TextEvent]:
        chunks = super().chunks(request)
        spec = VisionSpec(**VISION)
        extra = sum(spec.image_tokens(i.width, i.height) for i in request.images) + sum(
            spec.video_tokens(v.width, v.height, v.frames) for v in request.videos)
        out: list[TextEvent] = []
        for chunk in chunks:
            if isinstance(chunk, Usage):
                chunk = Usage(chunk.prompt_tokens + extra, chunk.completion_tokens,
                              chunk.cached_tokens)
            elif chunk.prompt_tokens is not None:
                chunk = type(chunk)(**{**{f: getattr(chunk, f) for f in chunk.__slots__},
                                       "prompt_tokens": chunk.prompt_tokens + extra})
            out.append(chunk)
        return out


class MediaServer:
    """Images and a clip over a real socket; each GET notes the holds open at that moment."""

    def __init__(self, database_url: str, files: dict[str, tuple[bytes, str]]) -> None:
        self.gets: list[tuple[str, list[int]]] = []  # path, the holds open (nano-USD)
        engine = make_engine(database_url)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with Session(engine) as session:
                    holds = [r.usd_nanos + r.diem_nanos
                             for r in session.exec(select(Reservation))]
                server.gets.append((self.path, holds))
                body, kind = files.get(self.path, (b"missing", "text/plain"))
                self.send_response(200 if self.path in files else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.engine = engine
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def url(self, path: str) -> str:
        return f"http://{self.host}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.engine.dispose()


def _png(width: int, height: int, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def _clip(seconds: float = 3.0, fps: float = 8.0) -> bytes:
    frames = [np.full((64, 96, 3), 20 * (i % 10), np.uint8) for i in range(int(seconds * fps))]
    return encode_mp4(frames, fps)


def _data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The flows catalog and look-test, a vision model on its own deployment."""
    catalog = yaml.safe_load(CATALOG.read_text())
    catalog["models"].append({
        "id": "look-test", "type": "text", "name": "Vision chat (fake)",
        "deployment": "text-m", "engine": "fake", "size_class": "M",
        "context_length": 8192, "max_completion_tokens": 256,
        "engine_options": {"vision": VISION},
        # a tokens-per-minute limit that a megabyte of image data would pass if it counted
        "rate_limits": {"tokens_per_minute": 20_000},
        "pricing": {"input": {"usd": INPUT_USD, "diem": INPUT_USD},
                    "output": {"usd": OUTPUT_USD, "diem": OUTPUT_USD}},
        "capabilities": {"supportsVision": True, "supportsVideoInput": True}})
    path = tmp_path / "vision-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    made = fake_deployments(load_catalog(gateway_catalog))
    made["text-m"] = FakeTextDeployment("text-m", ["look-test"], engine=FakeVisionEngine)
    return made


@pytest.fixture
def media(tmp_path: Path) -> Iterator[MediaServer]:
    settings = Settings(data_dir=tmp_path)
    server = MediaServer(settings.resolved_database_url, {
        "/cat.png": (_png(300, 200), "image/png"), "/clip.mp4": (_clip(), "video/mp4"),
        "/big.png": (_png(8, 8) + bytes(26 * 1024 * 1024), "image/png")})
    yield server
    server.close()


@pytest.fixture
def gateway(tmp_path: Path, gateway_catalog: Path, fakes, media: MediaServer
            ) -> Iterator[Gateway]:
    yield from make_gateway(Settings(
        data_dir=tmp_path, initial_credit_usd=10, model_catalog=gateway_catalog,
        web_fetch_allowed_hosts=media.host), handles=fakes)


@pytest.fixture
def key(gateway: Gateway) -> str:
    return gateway.create_key()["apiKey"]


@pytest.fixture
def books(gateway: Gateway) -> Iterator[Books]:
    books = Books(gateway)
    yield books
    books.close()


def _chat(gateway: Gateway, key: str, parts: list[dict], model: str = "look-test", **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": model, "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": parts}], **body})


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def test_the_model_receives_the_checked_image_and_video_and_the_tokens_are_charged(
        gateway, fakes, key, books):
    picture, clip = _png(120, 90), _clip(seconds=3.0)
    before = books.balance_nanos()

    resp = _chat(gateway, key, [{"type": "text", "text": "What changes?"},
                                _image(_data_url(picture, "image/png")),
                                _video(_data_url(clip, "video/mp4"))])

    assert resp.status_code == 200, resp.text
    (request,) = fakes["text-m"].requests
    assert [(i.data, i.width, i.height) for i in request.images] == [(picture, 120, 90)]
    (video,) = request.videos
    assert (video.data, video.width, video.height, video.frames) == (clip, 96, 64, 3)
    assert video.seconds == pytest.approx(3.0, abs=0.2)
    assert request.messages[-1] == {"role": "user", "content": [
        {"type": "text", "text": "What changes?"}, {"type": "image"}, {"type": "video"}]}
    assert "data:" not in repr(request.messages)
    usage = resp.json()["usage"]
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "look-test"
    assert charge.lines == {
        "input": (usage["prompt_tokens"], per_million(INPUT_USD, usage["prompt_tokens"])),
        "output": (usage["completion_tokens"],
                   per_million(OUTPUT_USD, usage["completion_tokens"]))}
    spec = VisionSpec(**VISION)
    assert usage["prompt_tokens"] > spec.image_tokens(120, 90) + spec.video_tokens(96, 64, 3)
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_image_data_does_not_count_as_prompt_tokens_for_the_rate_limit(gateway, key):
    noise = (np.random.default_rng(0).random((600, 600, 3)) * 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(noise).save(out, "PNG")  # about a megabyte: 270,000 tokens as text
    assert len(out.getvalue()) > 1_000_000

    resp = _chat(gateway, key, [_image(_data_url(out.getvalue(), "image/png"))])

    assert resp.status_code == 200, resp.text


def test_url_media_is_fetched_only_once_the_caller_is_counted_and_held(
        gateway, fakes, key, books, media):
    resp = _chat(gateway, key, [{"type": "text", "text": "Describe."},
                                _image(media.url("/cat.png")), _video(media.url("/clip.mp4"))])

    assert resp.status_code == 200, resp.text
    # each fetched with the request's hold open
    assert [(path, len(holds)) for path, holds in media.gets] == [("/cat.png", 1),
                                                                 ("/clip.mp4", 1)]
    (request,) = fakes["text-m"].requests
    assert (request.images[0].width, request.images[0].height) == (300, 200)
    assert request.images[0].data == _png(300, 200)
    assert request.videos[0].frames == 3
    assert books.open_holds() == 0


def test_an_account_that_cannot_pay_gets_402_and_no_url_is_fetched(gateway, fakes, media):
    account = gateway.cli("create-account", "--usd", "0")
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(account["apiKey"]),
                               json={"apiKeyType": "INFERENCE", "description": "broke"})
    broke = resp.json()["data"]["apiKey"]

    resp = _chat(gateway, broke, [_image(media.url("/cat.png"))])

    assert resp.status_code == 402, resp.text
    assert media.gets == []
    assert fakes["text-m"].calls == []


def test_the_hold_covers_an_image_not_yet_fetched_at_the_models_most(gateway, key, media,
                                                                      books):
    resp = _chat(gateway, key, [_image(media.url("/cat.png"))])

    assert resp.status_code == 200, resp.text
    [(_, [hold])] = media.gets
    most = VisionSpec(**VISION).most_image_tokens()
    assert hold >= per_million(INPUT_USD, most)
    assert hold >= books.only_charge(resp.headers["cf-ray"]).total_nanos


def test_a_model_without_vision_refuses_images_and_videos(gateway, fakes, key, books):
    image = _chat(gateway, key, [_image(_data_url(_png(8, 8), "image/png"))],
                  model="chat-primary")
    video = _chat(gateway, key, [_video(_data_url(_clip(1.0), "video/mp4"))],
                  model="chat-primary")

    for resp in (image, video):
        assert resp.status_code == 400, resp.text
        assert resp.json()["code"] == "INVALID_MODEL"
    assert "image inputs" in image.json()["error"]
    assert "video inputs" in video.json()["error"]
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0


def test_an_oversized_image_is_refused_before_any_url_is_fetched(gateway, fakes, key, books,
                                                                  media):
    huge = _png(5000, 4000)  # 20 megapixels in a few kilobytes

    resp = _chat(gateway, key, [_image(media.url("/cat.png")),
                                _image(_data_url(huge, "image/png"))])

    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["code"] == "IMAGE_TOO_LARGE"
    assert body["error"].startswith("messages[1].content[1].image_url: ")
    assert media.gets == []
    assert fakes["text-m"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0


@pytest.mark.parametrize(("parts", "status", "code", "says"), [
    ([_image("data:image/png;base64,bm90IGFuIGltYWdl")], 400, "CORRUPTED_IMAGE",
     "not a PNG, JPEG or WebP"),
    ([_image("ftp://example.org/cat.png")], 400, "INVALID_REQUEST", "only http and https"),
    ([_image(_data_url(_png(8, 8), "image/png"))] * 4, 400, "INVALID_REQUEST", "at most 3"),
    ([_video(_data_url(_clip(12.0, 2.0), "video/mp4"))], 400, "INVALID_REQUEST",
     "at most 10 s"),
    ([_video(_data_url(_png(8, 8), "image/png"))], 400, "INVALID_REQUEST", "not a video"),
])
def test_bad_parts_are_refused_with_nothing_charged(gateway, fakes, key, books, parts, status,
                                                    code, says):
    resp = _chat(gateway, key, parts)

    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body.get("code") == code
    assert says in body["error"]
    assert fakes["text-m"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0


def test_a_url_over_25_mb_is_a_413_and_costs_nothing(gateway, fakes, key, books, media):
    resp = _chat(gateway, key, [_image(media.url("/big.png"))])

    assert resp.status_code == 413, resp.text
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert fakes["text-m"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0


def test_a_private_url_is_refused_and_costs_nothing(tmp_path, gateway_catalog, fakes, media):
    gateways = make_gateway(Settings(data_dir=tmp_path / "other", initial_credit_usd=10,
                                     model_catalog=gateway_catalog), handles=fakes)
    strict = next(gateways)
    try:
        key = strict.create_key()["apiKey"]
        resp = _chat(strict, key, [_image(media.url("/cat.png"))])

        assert resp.status_code == 400, resp.text
        assert "not reachable" in resp.json()["error"]
        assert media.gets == []
        books = Books(strict)
        assert books.entries() == 0 and books.open_holds() == 0
        books.close()
    finally:
        gateways.close()


def test_media_parts_outside_user_messages_are_refused(gateway, fakes, key):
    resp = gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "look-test", "messages": [
            {"role": "system", "content": [_image(_data_url(_png(8, 8), "image/png"))]},
            {"role": "user", "content": "What is it?"}]})

    assert resp.status_code == 400, resp.text
    assert "user messages only" in resp.json()["error"]
    assert fakes["text-m"].calls == []


def test_a_streamed_answer_carries_the_media_too(gateway, fakes, key, books):
    resp = _chat(gateway, key, [_image(_data_url(_png(64, 48), "image/png"))], stream=True)

    assert resp.status_code == 200, resp.text
    assert resp.text.rstrip().endswith("data: [DONE]")
    (request,) = fakes["text-m"].requests
    assert [(i.width, i.height) for i in request.images] == [(64, 48)]
    assert books.open_holds() == 0


def test_a_fallback_without_vision_is_passed_over(gateway, fakes, key, books):
    fakes["text-m"].fail_with(offline())

    resp = _chat(gateway, key, [_image(_data_url(_png(8, 8), "image/png"))],
                 fallbacks=[{"model": "chat-primary"}])

    assert resp.status_code == 503, resp.text
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
