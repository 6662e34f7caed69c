"""A client that hangs up stops the engine's work (issue 35, item 4): the replica's call is
cancelled (Serve cancels it when the Gateway's request is), the engine stops at its next
check (a Whisper segment, a diffusion step), and the turn at the engine is held until the
engine is free, so the next tenant's request runs at once, never beside a thread still working
for nobody. Before, the thread ran to its end (30 minutes of Whisper for a request already
released) while the gate had given the slot to the next request. Real engines: Whisper base,
diffusion on test weights."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest

from deployments.audio import TranscriptionDeployment
from deployments.engines.audio import WhisperEngine, encode_audio
from deployments.engines.audio_engines import ENGINES as AUDIO_ENGINES
from deployments.engines.image import ENGINES as IMAGE_ENGINES
from deployments.engines.stop import Stopped, StopSignal
from deployments.image import ImageDeployment
from deployments.protocol import (
    ImageRequest,
    ImageResult,
    Tenant,
    Transcription,
    TranscriptionRequest,
)
from deployments.weights.audio import join_whisper_parts
from deployments.weights.registry import prepare_weights

LEAVER, NEXT = Tenant("leaver"), Tenant("next")
FOX = "The quick brown fox jumps over the lazy dog."
GENERATE = {"prompt": "a lighthouse", "width": 64, "height": 64, "cfg_scale": 7.0, "seed": 7,
            "variants": 1, "safe_mode": False}


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> WhisperEngine:
    folder = join_whisper_parts(tmp_path_factory.mktemp("weights") / "whisper-base")
    return AUDIO_ENGINES["faster-whisper"](str(folder), {"threads": 2})


@pytest.fixture(scope="module")
def speech() -> tuple[bytes, bytes]:
    """A short WAV of one sentence, and a long one: the sentence said a hundred times (about
    five minutes, ten of Whisper's windows)."""
    piper = AUDIO_ENGINES["piper"](None, {})
    said = np.concatenate(list(piper.synthesize(FOX, "joe", 1.0)))
    pause = np.zeros(piper.sample_rate // 2, dtype=said.dtype)
    short = b"".join(encode_audio([said], piper.sample_rate, "wav"))
    long = b"".join(encode_audio([np.concatenate([said, pause] * 100)], piper.sample_rate,
                                 "wav"))
    return short, long


@pytest.fixture(scope="module")
def text2img(tmp_path_factory: pytest.TempPathFactory):
    folder = prepare_weights(str(tmp_path_factory.mktemp("image-weights") / "tiny-sd"),
                             {"build": "tiny-sd"})
    return IMAGE_ENGINES["diffusers-text2img"](str(folder), {"threads": 2})


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for `condition` (a state the work reaches, not a time); fail after 60 s."""
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.002)


def test_a_transcription_whose_call_is_cancelled_stops_and_frees_the_engine(
        whisper: WhisperEngine, speech: tuple[bytes, bytes]) -> None:
    short, long = speech

    async def scenario() -> None:
        deployment = TranscriptionDeployment.func_or_class([])
        deployment.engines["whisper"] = whisper
        leaving = asyncio.create_task(deployment.transcribe(
            "whisper", TranscriptionRequest(long, "en", False, LEAVER)))
        waiting = asyncio.create_task(deployment.transcribe(
            "whisper", TranscriptionRequest(short, "en", False, NEXT)))
        await _until(deployment._busy.locked)  # the engine is at work on the long one

        leaving.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await leaving

        assert deployment.stopped_early == 1  # stopped between segments, not run to the end
        assert not deployment._busy.locked()  # the thread returned before the turn was given
        heard = await waiting
        assert isinstance(heard, Transcription) and "fox" in heard.text.lower()
        assert deployment.gate.stats()["running"] == 0

    asyncio.run(scenario())


def test_a_generation_whose_call_is_cancelled_stops_between_steps(text2img) -> None:
    async def scenario() -> None:
        deployment = ImageDeployment.func_or_class([])
        deployment.engines["gen"] = text2img
        leaving = asyncio.create_task(deployment.run("gen", ImageRequest(
            [], [], {**GENERATE, "steps": 1000}, "png", LEAVER)))
        waiting = asyncio.create_task(deployment.run("gen", ImageRequest(
            [], [], {**GENERATE, "steps": 2}, "png", NEXT)))
        await _until(deployment._busy.locked)

        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving

        assert deployment.stopped_early == 1
        assert not deployment._busy.locked()
        made = await waiting
        assert isinstance(made, ImageResult) and made.width == 64

    asyncio.run(scenario())


def test_engines_check_the_signal_before_their_work(whisper: WhisperEngine,
                                                   speech: tuple[bytes, bytes],
                                                   text2img) -> None:
    stop = StopSignal()
    stop.set()
    with pytest.raises(Stopped):
        whisper.transcribe(speech[0], "en", stop=stop)
    with pytest.raises(Stopped):  # after its first step
        text2img.run([], {**GENERATE, "steps": 4}, stop=stop)
    with pytest.raises(Stopped):
        IMAGE_ENGINES["grabcut"](None, {}).run([], {}, stop=stop)
