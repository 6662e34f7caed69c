"""The reference's speech defaults on the platform's own catalog (configs/models.yaml): a client
that sends the reference's default voice `af_sky`, or no voice and no model at all, gets speech
from Kokoro (`tts-kokoro`, the default speech model), not a 400; a voice of another model is
still a clear 400. The speech deployment is the in-process fake; the real Kokoro engine is
tests/unit/audio/test_kokoro.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT
from tests.fakes import FakeSpeechDeployment

CATALOG = PROJECT_ROOT / "configs" / "models.yaml"


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture
def fakes() -> dict[str, FakeSpeechDeployment]:
    speech = [m for m in load_catalog(CATALOG).models if m.deployment == "speech"]
    return {"speech": FakeSpeechDeployment(
        "speech", [m.id for m in speech], voices=[v for m in speech for v in m.voices])}


def _speak(gateway, key: str, **body):
    return gateway.client.post("/api/v1/audio/speech", headers=gateway.auth(key),
                               json={"input": "Hello, welcome to the speech service.", **body})


@pytest.mark.parametrize("body", [{"voice": "af_sky"}, {}, {"model": "tts-kokoro"},
                                  {"model": "tts-kokoro", "voice": "af_sky"}],
                         ids=["af_sky", "no voice", "tts-kokoro", "tts-kokoro af_sky"])
def test_the_references_default_voice_speaks(fake_gateway, fakes, key, books, body):
    resp = _speak(fake_gateway, key, **body)

    assert resp.status_code == 200, resp.text
    assert resp.headers["x-service-model-id"] == "tts-kokoro"
    assert resp.headers["content-type"] == "audio/mpeg" and resp.content
    (call,) = fakes["speech"].calls_to("speak")
    assert call.model_id == "tts-kokoro" and call.args[1].voice == "af_sky"
    assert books.only_charge(resp.headers["cf-ray"]).lines["speech_characters"][0] == \
        len("Hello, welcome to the speech service.")


def test_another_kokoro_voice_and_a_voice_of_another_model(fake_gateway, fakes, key, books):
    resp = _speak(fake_gateway, key, voice="bm_george")
    assert resp.status_code == 200, resp.text
    assert fakes["speech"].calls_to("speak")[0].args[1].voice == "bm_george"

    refused = _speak(fake_gateway, key, model="tts-piper-joe", voice="af_sky")
    assert refused.status_code == 400
    assert "joe" in refused.json()["error"] and books.charges(refused.headers["cf-ray"]) == []


def test_the_voices_list_names_kokoros_voices(fake_gateway):
    resp = fake_gateway.client.get("/api/v1/audio/voices", params={"model": "tts-kokoro"})
    assert resp.status_code == 200
    names = [v["id"] for v in resp.json()["data"]]
    assert names[0] == "af_sky" and {"af_bella", "am_adam", "bf_emma"} <= set(names)
