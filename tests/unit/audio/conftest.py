"""The voice-changer tests: the gateway in process with a voice changer whose transcription and
speech models run on the real deployment classes with fake engines (what they heard and were
asked to say is recorded), a media server on loopback for `audio_url`s (let through the
private-address guard), and the books of the gateway's database."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from serve_app.models.catalog import load_catalog
from serve_app.settings import Settings
from tests.fakes import DeploymentHandle, FakeSpeechDeployment, FakeTranscriptionDeployment
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.books import Books
from tests.unit.video.media_server import MediaServer

CATALOG = Path(__file__).with_name("voice_catalog.yaml")
RATE = 8000


@pytest.fixture
def media() -> Iterator[MediaServer]:
    server = MediaServer()
    yield server
    server.close()


@pytest.fixture
def fakes() -> dict[str, DeploymentHandle]:
    """The real transcription and speech deployments on fake engines (the transcription
    hears `said`; the speech reads silence in the catalog's voices)."""
    catalog = load_catalog(CATALOG)
    return {"transcription": FakeTranscriptionDeployment("transcription", ["hearing"]),
            "speech": FakeSpeechDeployment("speech", [catalog.by_id["speaking"],
                                                      catalog.by_id["narrator"]])}


def asked(speech: DeploymentHandle) -> list[dict]:
    """The params of each queued speech job the speech deployment was called with."""
    return [dict(call.args[1].params) for call in speech.calls_to("synthesize")]


@pytest.fixture
def gateway(tmp_path: Path, media: MediaServer, fakes) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     model_catalog=CATALOG,
                                     web_fetch_allowed_hosts=media.host), handles=fakes)


@pytest.fixture
def key(gateway: Gateway) -> str:
    """An INFERENCE key of the gateway's account ($10 of credit)."""
    return gateway.create_key()["apiKey"]


@pytest.fixture
def books(gateway: Gateway) -> Iterator[Books]:
    books = Books(gateway)
    yield books
    books.close()



def wav(seconds: float, rate: int = RATE) -> bytes:
    """A mono 16-bit WAV of a quiet tone lasting `seconds`."""
    samples = (np.sin(np.arange(round(seconds * rate)) / 5) * 800).astype("<i2").tobytes()
    return (b"RIFF" + struct.pack("<I", 36 + len(samples)) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", len(samples)) + samples)


def encoded(seconds: float, fmt: str) -> bytes:
    """A tone of `seconds` in `fmt` (mp3, flac, opus: an Ogg file)."""
    from deployments.engines.audio import encode_audio

    pcm = (np.sin(np.arange(round(seconds * 16000)) / 5) * 800).astype(np.int16)
    return b"".join(encode_audio([pcm], 16000, fmt))


def mp4_clip() -> bytes:
    """A short MP4 with a video track."""
    from tests.fakes import plain_mp4

    return plain_mp4(64, 64, 4, 8.0)

