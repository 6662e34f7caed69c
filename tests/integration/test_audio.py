"""Speech and transcription through the real Serve application: the `openai` SDK speaks with
the Piper voice and transcribes it back with Whisper; each format answers with its audio;
streaming sends audio as it is made; charges per character (a client that leaves a stream pays
for the characters it was sent) and per second of audio; bad input is a clear error that charges
nothing."""

from __future__ import annotations

import io
import re
from decimal import Decimal

import av
import httpx
import pytest

from tests.integration.test_images import Account

pytestmark = pytest.mark.integration

SENTENCE = "The quick brown fox jumps over the lazy dog."
TTS_NANOS_PER_CHAR = 15_000  # the test catalog: 15 USD per million characters
ASR_NANOS_PER_SECOND = 100_000  # 0.0001 USD per second of audio


@pytest.fixture
def account(platform, tmp_path) -> Account:
    return Account(platform, tmp_path)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def _duration(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


def test_openai_sdk_speaks_and_transcribes_back(platform, account):
    from openai import OpenAI

    sdk = OpenAI(base_url=platform.base_url, api_key=account.key, max_retries=0, timeout=300)
    speech = sdk.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE,
                                     response_format="wav")
    audio = speech.content
    assert 1.0 < _duration(audio) < 10.0
    spoken = account.spent()
    assert spoken == len(SENTENCE) * TTS_NANOS_PER_CHAR

    text = sdk.audio.transcriptions.create(model="whisper-1",
                                           file=("speech.wav", audio, "audio/wav"))
    heard = _words(text.text)
    expected = _words(SENTENCE)
    assert len(set(heard) & set(expected)) >= 0.8 * len(set(expected)), text.text
    seconds = -(-_duration(audio) // 1)  # started seconds
    assert account.spent() - spoken == int(seconds) * ASR_NANOS_PER_SECOND


def test_each_format_answers_with_its_audio(account):
    for fmt, media_type in (("mp3", "audio/mpeg"), ("opus", "audio/opus"),
                            ("aac", "audio/aac"), ("flac", "audio/flac"),
                            ("pcm", "audio/pcm")):
        resp = account.post("/audio/speech", json={"input": "Hello there.",
                                                   "response_format": fmt})
        assert resp.status_code == 200, (fmt, resp.text)
        assert resp.headers["content-type"] == media_type
        assert resp.headers["x-service-model-id"] == "tts-piper-joe"
        if fmt == "pcm":  # raw 16-bit mono
            assert len(resp.content) > 0 and len(resp.content) % 2 == 0
        else:
            assert 0.3 < _duration(resp.content) < 5.0, fmt


def test_streamed_speech_arrives_in_pieces_and_is_charged_once(account):
    text = "First sentence here. Second sentence follows. And a third one ends it."
    with httpx.stream("POST", f"{account.url}/audio/speech", headers=account.auth,
                      timeout=300, json={"input": text, "streaming": True,
                                         "response_format": "pcm"}) as resp:
        assert resp.status_code == 200
        pieces = [piece for piece in resp.iter_raw() if piece]
    assert len(pieces) >= 2
    assert account.spent() == len(text) * TTS_NANOS_PER_CHAR


def test_a_client_leaving_a_streamed_speech_early_pays_for_what_it_was_sent(account):
    import time

    text = " ".join(f"Sentence number {i} is here." for i in range(40))
    with httpx.stream("POST", f"{account.url}/audio/speech", headers=account.auth,
                      timeout=300, json={"input": text, "streaming": True,
                                         "response_format": "pcm"}) as resp:
        assert resp.status_code == 200
        next(resp.iter_raw())  # the first sentence, then hang up
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and account.spent() == 0:
        time.sleep(0.5)
    # the characters of the pieces written before the Gateway saw the client go: at least the
    # first sentence, not the whole text
    spent = account.spent()
    assert spent % TTS_NANOS_PER_CHAR == 0
    assert len("Sentence number 0 is here.") <= spent // TTS_NANOS_PER_CHAR < len(text)
    again = account.post("/audio/speech", json={"input": "Still here."})  # no hold left over
    assert again.status_code == 200


def test_transcription_json_timestamps_and_text(account):
    speech = account.post("/audio/speech", json={"input": SENTENCE, "response_format": "mp3",
                                                 "voice": "joe", "speed": 1.2})
    assert speech.status_code == 200
    resp = account.post("/audio/transcriptions", data={"timestamps": "true"},
                        files={"file": ("s.mp3", speech.content, "audio/mpeg")})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["duration"] > 1 and body["text"]
    starts = [w["start"] for w in body["timestamps"]["word"]]
    assert starts == sorted(starts) and len(starts) >= 5
    plain = account.post("/audio/transcriptions", data={"response_format": "text"},
                         files={"file": ("s.mp3", speech.content, "audio/mpeg")})
    assert plain.headers["content-type"].startswith("text/plain") and plain.text.strip()


def test_audio_refusals_are_clear_and_charge_nothing(account):
    cases = [
        (lambda: account.post("/audio/speech", json={"input": ""}), 400, "input"),
        (lambda: account.post("/audio/speech", json={"input": "   "}), 400, "input"),
        (lambda: account.post("/audio/speech", json={"input": "x" * 4097}), 400, "input"),
        (lambda: account.post("/audio/speech", json={"input": "hi", "voice": "nobody"}),
         400, "voice"),
        (lambda: account.post("/audio/speech", json={"input": "hi", "speed": 9}), 400,
         "speed"),
        (lambda: account.post("/audio/speech", json={"input": "hi", "model": "upscaler"}),
         400, "upscaler"),
        (lambda: account.post("/audio/transcriptions", files={
            "file": ("x.wav", b"not audio at all", "audio/wav")}), 400, "decoded"),
        (lambda: account.post("/audio/transcriptions", data={"model": "whisper-1"}), 415,
         "multipart"),
        (lambda: account.post("/audio/transcriptions", files={
            "other": ("x.wav", b"abc", "audio/wav")}), 400, "file"),
        (lambda: account.post("/audio/transcriptions", files={
            "file": ("big.wav", bytes(25 * 1024 * 1024), "audio/wav")}), 413, "25 MB"),
    ]
    for call, status, words in cases:
        resp = call()
        assert resp.status_code == status, (words, resp.text[:300])
        assert words.lower() in resp.text.lower(), resp.text[:300]
    assert account.spent() == 0


def test_voices_and_speech_models_are_listed(platform):
    voices = httpx.get(f"{platform.base_url}/audio/voices").json()
    assert {"id": "joe", "name": "joe", "model": "tts-piper-joe"} in voices["data"]
    tts = httpx.get(f"{platform.base_url}/models", params={"type": "tts"}).json()["data"]
    spec = tts[0]["model_spec"]
    assert spec["voices"] == ["joe"] and "wav" in spec["supported_formats"]
    assert Decimal(str(spec["pricing"]["input"]["usd"])) == Decimal(15)
