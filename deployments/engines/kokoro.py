"""Text to speech with Kokoro-82M (StyleTTS 2, the int8 ONNX export) on CPU through
onnxruntime, in its English voices (`af_sky`, `af_bella`, `am_adam`, ...).

The weights are one folder (deployments/weights/audio.py `join_kokoro` builds it): `model.onnx`,
`vocab.json` (phoneme -> token id) and `voices.npz` (name -> 510 x 1 x 256 style vectors, one
per input length). Text becomes IPA phonemes through espeak-ng, the build Piper ships
(American English for the `a*` voices, British for the `b*` ones), with the few respellings
Kokoro's own espeak front ends make; each sentence is one call of the model.

Heavy imports (onnxruntime, Piper's espeak) happen inside the functions that need them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from deployments.engines.audio import MAX_SPEED, MIN_SPEED, CharacterShares, Sentence

SAMPLE_RATE = 24_000
MAX_TOKENS = 510  # a call's phonemes (the style vectors are indexed by their count)
# espeak's IPA -> the symbols Kokoro was trained on
_RESPELL = str.maketrans({"ʲ": "j", "r": "ɹ", "x": "k", "ɬ": "l"})
_ESPEAK = threading.Lock()  # espeak-ng is one global state per process


def espeak_language(voice: str) -> str:
    """The espeak language of a Kokoro voice: `b*` British English, else American."""
    return "en" if voice.startswith("b") else "en-us"


class KokoroSpeechEngine:
    """options: `threads` (onnxruntime intra-op threads, default 1), `sentence_silence`
    (seconds between sentences, default 0), `aliases` ({name: voice})."""

    sample_rate = SAMPLE_RATE

    def __init__(self, weights: str | None, options: dict[str, Any] | None = None) -> None:
        import onnxruntime

        options = options or {}
        if not weights:
            raise FileNotFoundError("a kokoro engine needs its model folder "
                                    "(deployments.weights.audio.default_kokoro_model())")
        path = Path(weights)
        for name in ("model.onnx", "vocab.json", "voices.npz"):
            if not (path / name).is_file():
                raise FileNotFoundError(f"no Kokoro {name} in {path}")
        session_options = onnxruntime.SessionOptions()
        session_options.intra_op_num_threads = int(options.get("threads", 1))
        session_options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(path / "model.onnx"), sess_options=session_options,
            providers=["CPUExecutionProvider"])
        self._vocab: dict[str, int] = json.loads(
            (path / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with np.load(path / "voices.npz") as packs:
            self._voices = {name: packs[name].reshape(-1, packs[name].shape[-1])
                            for name in packs.files}
        self._silence = max(0.0, float(options.get("sentence_silence", 0.0)))
        self._aliases: dict[str, str] = dict(options.get("aliases") or {})
        for alias, target in self._aliases.items():
            if target not in self._voices:
                raise ValueError(f"alias {alias!r} names unknown voice {target!r}")
            self._voices.setdefault(alias, self._voices[target])
        self._phonemizer: Any = None

    def voices(self) -> list[str]:
        return list(self._voices)

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        """int16 mono PCM at 24 kHz, one array per sentence as each is synthesized."""
        return (sentence.pcm for sentence in self.sentences(text, voice, speed))

    def sentences(self, text: str, voice: str, speed: float = 1.0) -> Iterator[Sentence]:
        """`synthesize`, each sentence with its share of the text's characters (by its
        phonemes' share of all of them). `speed` 0.25..4 is the model's own speed input."""
        if voice not in self._voices:
            raise ValueError(f"unknown voice {voice!r}; voices: {', '.join(self._voices)}")
        if not MIN_SPEED <= speed <= MAX_SPEED:
            raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}, not {speed}")
        if not text.strip():
            raise ValueError("text is empty")
        language = espeak_language(self._aliases.get(voice, voice))
        calls = [call for phonemes in self.phonemize(text, language)
                 for call in _fit(self.tokens(phonemes), self._vocab.get(" "))]
        if not calls:
            raise ValueError("text has nothing to read aloud")
        shares = CharacterShares(len(text), sum(map(len, calls)))
        style = self._voices[voice]
        gap = np.zeros(round(self._silence * SAMPLE_RATE), np.int16)
        for index, tokens in enumerate(calls):
            audio = self._session.run(None, {
                "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
                "style": style[min(len(tokens), len(style)) - 1].reshape(1, -1),
                "speed": np.array([speed], dtype=np.float32),
            })[0]
            pcm = (np.clip(np.asarray(audio, np.float32).reshape(-1), -1, 1)
                   * 32767).astype(np.int16)
            yield Sentence(np.concatenate([gap, pcm]) if index and gap.size else pcm,
                           shares.take(len(tokens)))
        if rest := shares.rest():
            yield Sentence(np.zeros(0, np.int16), rest)

    def phonemize(self, text: str, language: str) -> list[str]:
        """IPA phonemes of each sentence of `text`, as Kokoro reads them."""
        from piper.phonemize_espeak import ESPEAK_DATA_DIR, EspeakPhonemizer

        with _ESPEAK:
            if self._phonemizer is None:
                self._phonemizer = EspeakPhonemizer(ESPEAK_DATA_DIR)
            sentences = self._phonemizer.phonemize(language, text)
        return [out for s in sentences if (out := "".join(s).translate(_RESPELL).strip())]

    def tokens(self, phonemes: str) -> list[int]:
        """Token ids of the phonemes the model knows (the others are left out)."""
        return [self._vocab[p] for p in phonemes if p in self._vocab]


def _fit(tokens: list[int], space: int | None) -> list[list[int]]:
    """A sentence's tokens in calls of at most MAX_TOKENS: an overlong sentence (some 400
    characters without a full stop) is cut after its last space within the limit."""
    calls = []
    while len(tokens) > MAX_TOKENS:
        cut = max((i + 1 for i in range(MAX_TOKENS // 2, MAX_TOKENS) if tokens[i] == space),
                  default=MAX_TOKENS)
        calls.append(tokens[:cut])
        tokens = tokens[cut:]
    return [*calls, tokens] if tokens else calls
