"""The real Piper engine says how many input characters each piece of its speech reads, so a
client that leaves a streamed answer early can be charged for what it was sent: the pieces add
up to the whole text in every format, each sentence's share is close to its own length, and
no piece of audio comes before the characters it reads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from deployments.engines.audio import (
    CONTENT_TYPES,
    PiperSpeechEngine,
    Sentence,
    encode_audio,
    encode_sentences,
)
from deployments.engines.audio_engines import ENGINES

TEXT = ("Hello there. This is a much longer sentence about the speech engine and its voice! "
        "Short one? Yes.")


def _sentences_of(text: str) -> list[str]:
    return [s for s in re.findall(r".+?(?:[.!?]+\s*|$)", text) if s]


@pytest.fixture(scope="module")
def piper() -> PiperSpeechEngine:
    return ENGINES["piper"](None, {})


@pytest.fixture(scope="module")
def spoken(piper: PiperSpeechEngine) -> list[Sentence]:
    return list(piper.sentences(TEXT, "joe", 1.0))


def test_each_sentence_reads_its_share_of_the_characters(spoken: list[Sentence]) -> None:
    written = _sentences_of(TEXT)
    assert len(spoken) == len(written)
    assert sum(s.characters for s in spoken) == len(TEXT)
    for sentence, text in zip(spoken, written, strict=True):
        assert sentence.pcm.dtype == np.int16 and sentence.pcm.size > 0
        assert abs(sentence.characters - len(text)) <= 0.25 * len(text) + 2, (sentence, text)


def test_synthesize_is_the_same_speech_without_the_counts(piper: PiperSpeechEngine,
                                                         spoken: list[Sentence]) -> None:
    plain = list(piper.synthesize(TEXT, "joe", 1.0))  # VITS samples: lengths vary a little
    assert len(plain) == len(spoken)
    assert all(c.dtype == np.int16 and c.size for c in plain)


@pytest.mark.parametrize("fmt", sorted(CONTENT_TYPES))
def test_encoded_pieces_add_up_to_the_text_in_every_format(fmt: str, piper: PiperSpeechEngine,
                                                           spoken: list[Sentence]) -> None:
    pieces = list(encode_sentences(iter(spoken), piper.sample_rate, fmt))
    assert sum(characters for _, characters in pieces) == len(TEXT)
    audio = b"".join(audio for audio, _ in pieces)
    plain = b"".join(encode_audio((s.pcm for s in spoken), piper.sample_rate, fmt))
    if fmt == "opus":  # each Ogg stream has its own random serial number
        assert len(audio) == len(plain)
    else:
        assert audio == plain
    # a piece carrying audio of a sentence carries that sentence's characters: the first piece
    # with audio of the first sentence is charged for it (a WAV header alone reads nothing)
    first_audio = next(i for i, (audio, _) in enumerate(pieces)
                       if audio and not (fmt == "wav" and i == 0))
    assert sum(c for _, c in pieces[:first_audio + 1]) >= spoken[0].characters


def test_a_text_with_a_silent_tail_still_adds_up(piper: PiperSpeechEngine) -> None:
    text = "One sentence. ... !!"
    spoken = list(piper.sentences(text, "joe", 1.0))
    assert sum(s.characters for s in spoken) == len(text)
    assert sum(c for _, c in encode_sentences(iter(spoken), piper.sample_rate, "mp3")) == \
        len(text)
