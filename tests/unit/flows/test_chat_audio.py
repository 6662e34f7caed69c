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

from serve_app.chat.audio_parts import AudioReader
from serve_app.errors import ApiError
from serve_app.models.catalog import load_catalog
from serve_app.models.router import ModelRouter
from serve_app.schemas.chat import ChatCompletionRequest
from serve_app.settings import Settings
from tests.fakes import (
    DeploymentHandle,
    FakeTranscriptionDeployment,
    FakeTranscriptionEngine,
    count_prompt_tokens,
    crashed,
    fake_deployments,
)
from tests.unit.conftest import make_gateway
from tests.unit.flows.books import Books, nanos, per_million
from tests.unit.flows.conftest import CATALOG
from tests.unit.flows.sse import DONE, events
from tests.unit.flows.test_chat_web import Provider

PER_SECOND_USD = "0.001"  # hear-test's price
MAX_SECONDS = 60
RATE = 8000


class WavEngine(FakeTranscriptionEngine):
    """A transcription engine that reads the WAV it is sent and says how long it was; it
    cannot decode anything else (the deployment's 400 INVALID_AUDIO_FORMAT)."""

    def hear(self, audio: bytes) -> tuple[str, float]:
        try:
            with wave.open(io.BytesIO(audio)) as clip:
                seconds = clip.getnframes() / clip.getframerate()
        except (wave.Error, EOFError) as exc:
            raise ValueError("the audio could not be decoded") from exc
        return f" heard {seconds:g} seconds ", seconds


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
    """The flows catalog and a transcription model, the default `asr`."""
    catalog = yaml.safe_load(CATALOG.read_text())
    catalog["models"].append({
        "id": "hear-test", "type": "asr", "name": "Hearing (fake)",
        "deployment": "transcription", "engine": "fake",
        "engine_options": {"max_seconds": MAX_SECONDS},
        "pricing": {"per_audio_second": {"usd": float(PER_SECOND_USD),
                                         "diem": float(PER_SECOND_USD)}}})
    catalog["traits"]["asr"] = {"default": "hear-test"}
    primary = next(m for m in catalog["models"] if m["id"] == "chat-primary")
    primary["capabilities"]["supportsWebSearch"] = True
    catalog["models"].append({**primary, "id": "chat-gone", "deployment": "text-gone",
                              "traits": []})  # no replica runs it (see `fakes`)
    path = tmp_path / "audio-catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    made = fake_deployments(load_catalog(gateway_catalog))
    made["transcription"] = FakeTranscriptionDeployment("transcription", ["hear-test"],
                                                        engine=WavEngine)
    del made["text-gone"]
    return made


def _audio(data: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}


def _chat(gateway, key: str, *data: str, **body):
    return gateway.client.post("/api/v1/chat/completions", headers=gateway.auth(key), json={
        "model": "chat-primary", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What was said?"}, *map(_audio, data)]}], **body})


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
    heard: list[int] = []
    with pytest.raises(ApiError) as refused:
        await reader.inline(req, reader.transcriber(), heard.append)
    assert (refused.value.status, refused.value.code) == (413, "PAYLOAD_TOO_LARGE")
    assert fakes["transcription"].calls == [] and heard == []


# ---- audio heard is charged; nothing is heard for a request refused by a cheap check ----------

def _heard_and_charged(books, request_id: str, seconds: int) -> int:
    """The request's entry holds the seconds heard alone; returns its total."""
    charge = books.only_charge(request_id)
    assert charge.model_id == "chat-primary"
    assert charge.lines == {"audio_seconds": (seconds, nanos(PER_SECOND_USD, seconds))}
    assert books.open_holds() == 0
    return charge.total_nanos


@pytest.mark.parametrize(("body", "status", "code"), [
    ({"service_parameters": {"character_slug": "no-such"}}, 404, "CHARACTER_NOT_FOUND"),
    ({"service_parameters": {"enable_web_search": "on"}}, 400, None),  # no search configured
    ({"model": "chat-gone"}, 503, "MODEL_OFFLINE"),
], ids=["character", "web-search", "model-offline"])
def test_a_request_refused_by_a_cheap_check_hears_nothing(fake_gateway, fakes, key, books,
                                                          body, status, code):
    """The attack: `character_slug: "no-such"` used to be looked up after the audio was heard
    (a free transcription, then 404); likewise web search and the model's replica."""
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(3), **body)

    assert resp.status_code == status, resp.text
    if code:
        assert resp.json()["code"] == code
    assert fakes["transcription"].calls == []
    assert books.entries() == 0 and books.open_holds() == 0
    assert books.balance_nanos() == before


def test_a_failed_web_search_comes_before_the_audio(tmp_path: Path, gateway_catalog: Path,
                                                    fakes):
    """The search provider fails (503 WEB_SEARCH_UNAVAILABLE): the web is read before audio is
    heard, so nothing was heard and nothing is charged."""
    provider = Provider()
    provider.search_status = 500
    try:
        for gateway in make_gateway(Settings(
                data_dir=tmp_path, initial_credit_usd=10, model_catalog=gateway_catalog,
                web_search_url=provider.url("/search"),
                web_fetch_allowed_hosts=provider.host), handles=fakes):
            books = Books(gateway)
            resp = _chat(gateway, gateway.create_key()["apiKey"], _wav(3),
                         service_parameters={"enable_web_search": "on"})
            assert resp.status_code == 503, resp.text
            assert resp.json()["code"] == "WEB_SEARCH_UNAVAILABLE"
            assert len(provider.searches) == 1
            assert fakes["transcription"].calls == []
            assert books.entries() == 0 and books.open_holds() == 0
            books.close()
    finally:
        provider.close()


def test_audio_heard_is_charged_when_the_model_then_fails(fake_gateway, fakes, key, books):
    """The transcription was delivered: its seconds are charged alone, the tokens the failed
    model never delivered are not."""
    fakes["text-xs"].fail_with(crashed())
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(3.2))

    assert resp.status_code == 500, resp.text
    assert len(fakes["transcription"].calls) == 1
    total = _heard_and_charged(books, resp.headers["cf-ray"], math.ceil(3.2))
    assert books.balance_nanos() == before - total


def test_a_stream_that_breaks_charges_the_audio_and_what_it_delivered(fake_gateway, fakes,
                                                                      key, books):
    """The stream breaks after its first piece: the audio heard, the prompt the engine read
    and the tokens sent are charged, nothing more."""
    fakes["text-xs"].fail_with(crashed(), after_pieces=1)
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(3.2), stream=True)

    assert resp.status_code == 200, resp.text
    assert "INFERENCE_FAILED" in resp.text  # the stream's error event
    (request,) = fakes["text-xs"].requests
    prompt = count_prompt_tokens(request.messages)
    sent = [event for event in events(resp.text) if event != DONE and event.get("choices")]
    delivered = len("".join(e["choices"][0]["delta"].get("content") or "" for e in sent).split())
    assert 0 < delivered < fakes["text-xs"].completion_tokens()
    charge = books.only_charge(resp.headers["cf-ray"])
    assert charge.lines == {
        "input": (prompt, per_million(10, prompt)),
        "output": (delivered, per_million(20, delivered)),
        "audio_seconds": (math.ceil(3.2), nanos(PER_SECOND_USD, math.ceil(3.2)))}
    assert books.balance_nanos() == before - charge.total_nanos
    assert books.open_holds() == 0


def test_audio_heard_before_a_part_that_cannot_be_heard_is_charged(fake_gateway, fakes, key,
                                                                   books):
    """Two parts: the first is heard (2 s), the second is not audio (400): the first was
    transcribed, and is charged; the model is never called."""
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(2), base64.b64encode(b"not audio").decode())

    assert resp.status_code == 400, resp.text
    assert resp.json()["code"] == "INVALID_AUDIO_FORMAT"
    assert fakes["text-xs"].calls == []
    total = _heard_and_charged(books, resp.headers["cf-ray"], 2)
    assert books.balance_nanos() == before - total


def test_a_second_part_that_is_not_base64_costs_nothing(fake_gateway, fakes, key, books):
    """Every part's bytes are checked before the first is heard: a client mistake found by
    that check is a 400 that transcribes and charges nothing."""
    before = books.balance_nanos()

    resp = _chat(fake_gateway, key, _wav(2), "not base64 at all!")

    assert resp.status_code == 400, resp.text
    assert fakes["transcription"].calls == [] and fakes["text-xs"].calls == []
    assert books.balance_nanos() == before


# ---- every audio part is checked before the web is read ----------------------------------------

@pytest.mark.parametrize(("format_", "data", "status", "code"), [
    ("exe", _wav(1), 400, "INVALID_AUDIO_FORMAT"),
    ("wav", "not base64 at all!", 400, "INVALID_REQUEST"),
], ids=["format", "base64"])
def test_an_audio_part_refused_by_its_checks_costs_no_search(tmp_path: Path,
                                                              gateway_catalog: Path, fakes,
                                                              format_, data, status, code):
    """The attack: web search and scraping, then an audio part that cannot be heard; before,
    the search and the page ran first and the chat's 400 left them free. Now every part's
    format and bytes are checked first: nothing searched, fetched, heard or charged."""
    provider = Provider()
    try:
        for gateway in make_gateway(Settings(
                data_dir=tmp_path, initial_credit_usd=10, model_catalog=gateway_catalog,
                web_search_url=provider.url("/search"),
                web_fetch_allowed_hosts=provider.host), handles=fakes):
            books = Books(gateway)
            before = books.balance_nanos()
            resp = gateway.client.post(
                "/api/v1/chat/completions", headers=gateway.auth(gateway.create_key()["apiKey"]),
                json={"model": "chat-primary", "messages": [{"role": "user", "content": [
                    {"type": "text", "text": f"Compare {provider.url('/lions')}"},
                    {"type": "input_audio", "input_audio": {"data": data, "format": format_}}]}],
                    "service_parameters": {"enable_web_search": "on",
                                           "enable_web_scraping": True}})
            assert resp.status_code == status, resp.text
            assert resp.json()["code"] == code
            assert provider.searches == [] and provider.pages_served == 0
            assert fakes["transcription"].calls == [] and fakes["text-xs"].calls == []
            assert books.entries() == 0 and books.open_holds() == 0
            assert books.balance_nanos() == before
            books.close()
    finally:
        provider.close()
