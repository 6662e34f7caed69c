"""Audio parts of a chat on a text model, through admission, the transcription deployment, the
text deployment and settlement: the transcript reaches the model, the seconds heard are
charged on the chat's own entry at the transcription model's price, the hold covers them, and
audio that cannot be heard (or is too large) costs nothing."""

from __future__ import annotations

import base64
import io
import math
import wave
from pathlib import Path

import pytest
import yaml

from deployments.protocol import EngineError, Transcription, TranscriptionRequest
from serve_app.chat.audio_parts import AudioReader
from serve_app.errors import ApiError
from serve_app.models.catalog import load_catalog
from serve_app.models.router import ModelRouter
from serve_app.schemas.chat import ChatCompletionRequest
from tests.fakes import FakeDeployment, fake_deployments, reported
from tests.unit.pipeline.books import nanos, per_million
from tests.unit.pipeline.conftest import CATALOG

PER_SECOND_USD = "0.001"  # hear-test's price
MAX_SECONDS = 60
RATE = 8000


class FakeTranscriptionDeployment(FakeDeployment):
    """The transcription deployment (deployments/audio.py): `transcribe(model_id, request)`
    reads the WAV it is sent and says how long it was; anything else is the replica's
    INVALID_AUDIO_FORMAT."""

    METHODS = ("transcribe",)

    async def _transcribe(self, model_id: str, request: TranscriptionRequest
                          ) -> Transcription | EngineError:
        try:
            with wave.open(io.BytesIO(request.audio)) as clip:
                seconds = clip.getnframes() / clip.getframerate()
        except (wave.Error, EOFError):
            return reported(400, "the audio could not be decoded", code="INVALID_AUDIO_FORMAT")
        return Transcription(text=f" heard {seconds:g} seconds ", duration=seconds,
                             language="en", segments=[], words=None, replica_ms=1.0)


def _wav(seconds: float) -> str:
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(RATE)
        clip.writeframes(b"\0\0" * int(seconds * RATE))
    return base64.b64encode(out.getvalue()).decode()


@pytest.fixture
def gateway_catalog(tmp_path: Path) -> Path:
    """The pipeline catalog and a transcription model, the default `asr`."""
    catalog = yaml.safe_load(CATALOG.read_text())
    catalog["models"].append({
        "id": "hear-test", "type": "asr", "name": "Hearing (fake)",
        "deployment": "transcription", "engine": "fake",
        "engine_options": {"max_seconds": MAX_SECONDS},
        "pricing": {"per_audio_second": {"usd": float(PER_SECOND_USD),
                                         "diem": float(PER_SECOND_USD)}}})
    catalog["traits"]["asr"] = {"default": "hear-test"}
    path = tmp_path / "audio-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, FakeDeployment]:
    made = fake_deployments(load_catalog(gateway_catalog))
    made["transcription"] = FakeTranscriptionDeployment("transcription", ["hear-test"])
    return made


def _chat(gateway, key: str, data: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What was said?"},
            {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}]}],
        **body})


def test_audio_is_heard_before_the_model_and_charged_with_the_chat(fake_gateway, fakes, key,
                                                                   books):
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(3.2))

    assert resp.status_code == 200, resp.text
    (call,) = fakes["transcription"].calls
    assert call.model_id == "hear-test"
    seen = fakes["text-xs"].requests[-1].messages[-1]["content"]
    assert seen == "What was said?\n\n[Audio]\nheard 3.2 seconds"
    usage = resp.json()["usage"]
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.model_id == "chat-primary"
    assert charge.lines == {
        "input": (usage["prompt_tokens"], per_million(10, usage["prompt_tokens"])),
        "output": (usage["completion_tokens"], per_million(20, usage["completion_tokens"])),
        "audio_seconds": (math.ceil(3.2), nanos(PER_SECOND_USD, math.ceil(3.2)))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_audio_that_cannot_be_heard_is_a_400_and_costs_nothing(fake_gateway, fakes, key,
                                                               books):
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, base64.b64encode(b"not audio at all").decode())

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_AUDIO_FORMAT"
    assert fakes["text-xs"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
    assert books.balance_nanos() == before


def test_the_hold_covers_the_most_audio_a_part_may_hold(fake_gateway, fakes, books):
    """A key whose limit covers the chat's tokens but not a part's longest audio is refused
    before anything is heard."""
    tokens = per_million(10, 4096) + per_million(20, 256)  # the whole context, the cap
    limit_usd = (tokens + nanos(PER_SECOND_USD, MAX_SECONDS) // 2) / 1e9
    limited = fake_gateway.create_key(consumptionLimit={"usd": limit_usd})["apiKey"]

    resp = _chat(fake_gateway, limited, _wav(1))

    assert resp.status_code == 402, resp.text
    assert fakes["transcription"].calls == []
    assert books.entries() == 0


async def test_audio_over_25_mb_is_refused_before_it_is_decoded(gateway_catalog: Path,
                                                                fakes):
    catalog = load_catalog(gateway_catalog)
    reader = AudioReader(ModelRouter(catalog, fakes))
    req = ChatCompletionRequest.model_validate({"model": "chat-primary", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": "A" * (34 * 1024 * 1024), "format": "wav"}}]}]})
    with pytest.raises(ApiError) as refused:
        await reader.inline(req, reader.transcriber())
    assert (refused.value.status, refused.value.code) == (413, "PAYLOAD_TOO_LARGE")
    assert fakes["transcription"].calls == []
