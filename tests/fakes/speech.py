"""The speech family in process: the real `SpeechDeployment` (deployments/audio.py), its voice
check, its one-at-a-time gate and its encoding of each sentence in the asked format, with a
fake engine behind it.

The fake engine reads a text one sentence at a time (`pieces_for`): 16-bit silence,
`SAMPLES_PER_CHARACTER` samples per character. In the `pcm` format a piece's audio is that
silence as it is, so a test can compare the bytes streamed with `pieces_for`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from deployments.audio import SpeechDeployment
from deployments.engines.audio import Sentence
from deployments.protocol import SpeechPiece
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of

SAMPLE_RATE = 16_000
SAMPLES_PER_CHARACTER = 40


def sentences_of(text: str) -> list[str]:
    return [s for s in re.findall(r".+?(?:[.!?]+\s*|$)", text, re.S) if s]


class FakeSpeechEngine(FakeEngine):
    """A speech engine (deployments/engines/audio.py `SpeechEngine`) offering `offered`. A
    failure set on it is raised after `after_pieces` pieces of the deployment's stream, its
    `SpeechStart` counted as the first."""

    sample_rate = SAMPLE_RATE

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(weights, options)
        self.offered: list[str] = ["narrator"]

    def voices(self) -> list[str]:
        return list(self.offered)

    def sentences(self, text: str, voice: str, speed: float = 1.0) -> Iterator[Sentence]:
        read = sentences_of(text)
        if self.failure is not None:
            read = read[:max(0, self.after_pieces - 1)]
        for sentence in read:
            yield Sentence(np.zeros(SAMPLES_PER_CHARACTER * len(sentence), np.int16),
                           len(sentence))
        if isinstance(self.failure, BaseException):
            raise self.failure
        assert self.failure is None, "a speech engine reports a failure by raising"

    def synthesize(self, text: str, voice: str, speed: float = 1.0) -> Iterator[np.ndarray]:
        """The whole text (a queued job's), one array per sentence, as the real engine."""
        return (sentence.pcm for sentence in self.sentences(text, voice, speed))


class FakeSpeechDeployment(ServedDeployment):
    """The speech deployment: the real `SpeechDeployment` (a stream's `speak`, a queued job's
    `synthesize`), its models on `FakeSpeechEngine`s each offering `voices` (or, for a catalog
    model, the voices the catalog lists for it)."""

    METHODS = ("speak", "synthesize")
    DEPLOYMENT = class_of(SpeechDeployment)
    ENGINE = FakeSpeechEngine
    SAMPLE_RATE = SAMPLE_RATE

    def __init__(self, deployment_name: str = "speech",
                 models: Sequence[str | ModelOptions] = ("speaker",), *,
                 voices: Sequence[str] = ("narrator",)) -> None:
        super().__init__(deployment_name, models)
        listed = {m.id: list(offered) for m in models
                  if not isinstance(m, str) and (offered := getattr(m, "voices", None))}
        for model_id, engine in self.engines.items():
            engine.offered = listed.get(model_id, list(voices))

    @staticmethod
    def pieces_for(text: str) -> list[SpeechPiece]:
        """The pieces of `text` in the `pcm` format: one per sentence."""
        return [SpeechPiece(bytes(2 * SAMPLES_PER_CHARACTER * len(sentence)), len(sentence))
                for sentence in sentences_of(text)]
