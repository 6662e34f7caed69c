"""The transcription engine decodes no more audio than the Gateway billed (issue 48, attack
2): a voice change tells it the measured seconds (plus a tolerance) and the format it judged
the source to be. Before, Whisper decoded every chain of a chained Ogg file (30 chains of
59 s: 1,770 s decoded for 59 s billed); now decoding stops at the bound and the request is a
400 before Whisper hears anything. Real engine: Whisper base behind the real deployment."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from deployments.audio import TranscriptionDeployment
from deployments.engines.audio import WhisperEngine, encode_audio
from deployments.engines.audio_engines import ENGINES
from deployments.protocol import EngineError, Tenant, Transcription, TranscriptionRequest
from deployments.weights.audio import join_whisper_parts

CALLER = Tenant("caller")
FOX = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> TranscriptionDeployment:
    folder = join_whisper_parts(tmp_path_factory.mktemp("weights") / "whisper-base")
    whisper: WhisperEngine = ENGINES["faster-whisper"](str(folder), {"threads": 2})
    served = TranscriptionDeployment.func_or_class([])
    served.engines["whisper"] = whisper
    return served


def _tone(seconds: float, fmt: str, rate: int = 16000) -> bytes:
    pcm = (np.sin(np.arange(round(seconds * rate)) / 5) * 800).astype(np.int16)
    return b"".join(encode_audio([pcm], rate, fmt))


def _transcribe(deployment: TranscriptionDeployment,
                request: TranscriptionRequest) -> Transcription | EngineError:
    return asyncio.run(deployment.transcribe("whisper", request))


def test_thirty_chains_billed_59_s_are_decoded_no_further_than_the_bound(deployment):
    chained = _tone(59, "opus") * 30  # 1,770 s a decoder would play

    out = _transcribe(deployment, TranscriptionRequest(chained, None, False, CALLER,
                                                       demuxer="ogg", max_seconds=61))

    assert isinstance(out, EngineError), out
    assert (out.status, out.code) == (400, "INVALID_AUDIO_FORMAT")
    assert "over 61 s (at most 61 s)" in out.message  # stopped at the bound, not at 1,770 s


def test_audio_within_the_bound_is_heard(deployment):
    piper = ENGINES["piper"](None, {})
    said = np.concatenate(list(piper.synthesize(FOX, "joe", 1.0)))
    speech = b"".join(encode_audio([said], piper.sample_rate, "wav"))
    seconds = said.size / piper.sample_rate

    out = _transcribe(deployment, TranscriptionRequest(speech, "en", False, CALLER,
                                                       demuxer="wav",
                                                       max_seconds=seconds + 2))

    assert isinstance(out, Transcription), out
    assert "fox" in out.text.lower()
    assert out.duration <= seconds + 2


def test_the_source_is_opened_as_the_format_named_and_nothing_else(deployment):
    ogg = _tone(3, "opus")

    named_wrong = _transcribe(deployment, TranscriptionRequest(ogg, None, False, CALLER,
                                                               demuxer="wav",
                                                               max_seconds=5))

    assert isinstance(named_wrong, EngineError), named_wrong
    assert named_wrong.code == "INVALID_AUDIO_FORMAT"
    assert "[Errno" not in named_wrong.message  # FFmpeg's own words stay in the log
    assert isinstance(_transcribe(deployment, TranscriptionRequest(
        ogg, None, False, CALLER, demuxer="ogg", max_seconds=5)), Transcription)
