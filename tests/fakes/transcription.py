"""The transcription family in process: the real `TranscriptionDeployment`
(deployments/audio.py), its one-at-a-time gate and its conversion of what the engine raises
(an input it cannot decode: 400 INVALID_AUDIO_FORMAT), with a fake engine behind it.

The fake engine hears `said` in any audio (`heard`: what it was sent, in order); a subclass
changes `hear` to read the audio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deployments.audio import TranscriptionDeployment
from deployments.engines.stop import StopSignal
from tests.fakes.served import FakeEngine, ModelOptions, ServedDeployment, class_of

DEFAULT_SAID = "Hello there, how are you?"


class FakeTranscriptionEngine(FakeEngine):
    """A transcription engine (deployments/engines/audio.py `WhisperEngine`'s `transcribe`); a
    failure set on it is raised (a ValueError is what the deployment reports as a 400)."""

    def __init__(self, weights: str | None = None, options: dict[str, Any] | None = None
                 ) -> None:
        super().__init__(weights, options)
        self.said = DEFAULT_SAID
        self.heard: list[bytes] = []
        self.bounds: list[tuple[str | None, float | None]] = []  # (demuxer, max_seconds)

    def hear(self, audio: bytes) -> tuple[str, float]:
        """The text of `audio` and its seconds."""
        return self.said, 1.0

    def transcribe(self, audio: bytes, language: str | None, timestamps: bool,
                   stop: StopSignal | None = None, *, demuxer: str | None = None,
                   max_seconds: float | None = None) -> dict[str, Any]:
        if isinstance(self.failure, BaseException):
            raise self.failure
        assert self.failure is None, "a transcription engine reports a failure by raising"
        self.heard.append(audio)
        self.bounds.append((demuxer, max_seconds))
        text, seconds = self.hear(audio)
        if max_seconds is not None and seconds > max_seconds:  # as the real engine refuses
            raise ValueError(f"audio is too long: over {max_seconds:.0f} s")
        return {"text": text, "duration": seconds, "language": language or "en",
                "segments": []}


class FakeTranscriptionDeployment(ServedDeployment):
    """The transcription deployment: the real `TranscriptionDeployment`, its models on
    `FakeTranscriptionEngine`s (or the `engine` given); `said` and `heard` are theirs."""

    METHODS = ("transcribe",)
    DEPLOYMENT = class_of(TranscriptionDeployment)
    ENGINE = FakeTranscriptionEngine

    def __init__(self, deployment_name: str = "transcription",
                 models: Sequence[str | ModelOptions] = ("hearing",), *,
                 engine: type[FakeTranscriptionEngine] | None = None) -> None:
        super().__init__(deployment_name, models, engine=engine)

    @property
    def said(self) -> str:
        return next(iter(self.engines.values())).said

    @said.setter
    def said(self, text: str) -> None:
        for engine in self.engines.values():
            engine.said = text

    @property
    def heard(self) -> list[bytes]:
        return [audio for engine in self.engines.values() for audio in engine.heard]
