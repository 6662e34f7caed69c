"""The gateway of the reference-contract sweep: every model of configs/models.yaml served by a
fake deployment (queued speech and transcription too), a fake JSON-RPC node for the crypto
route, and the development x402 facilitator for wallet top-ups and sign-ins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.protocol import MediaJob, MediaResult, Transcription, TranscriptionRequest
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT
from serve_app.wallets.x402 import dev_facilitator
from tests.fakes import FakeDeployment, fake_deployments
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.http.reference_contract.calls import Caller
from tests.unit.wallets.wallet_gateway import wallet_settings

CATALOG = PROJECT_ROOT / "configs" / "models.yaml"


class FakeSpeech(FakeDeployment):
    """The speech deployment as queued audio calls it: an MP3-typed file of the prompt."""

    METHODS = ("synthesize",)

    async def _synthesize(self, model_id: str, job: MediaJob) -> MediaResult:
        return MediaResult(b"ID3" + job.params["prompt"].encode(), "audio/mpeg", 1.0)


class FakeTranscription(FakeDeployment):
    """The transcription deployment: hears one sentence in every file."""

    METHODS = ("transcribe",)

    async def _transcribe(self, model_id: str, request: TranscriptionRequest) -> Transcription:
        segment = {"text": "Hello there.", "start": 0.0, "end": 1.0}
        words = ([{"word": "Hello", "start": 0.0, "end": 0.5},
                  {"word": "there.", "start": 0.5, "end": 1.0}] if request.timestamps else None)
        return Transcription("Hello there.", 1.0, "en", [segment], words, 1.0)


@pytest.fixture(scope="module")
def facilitator() -> Iterator[str]:
    url, stop = dev_facilitator.start_in_thread()
    yield url
    stop()


def _fleet() -> dict[str, FakeDeployment]:
    fleet = fake_deployments(load_catalog(CATALOG))
    fleet["speech"] = FakeSpeech("speech", None)
    fleet["transcription"] = FakeTranscription("transcription", None)
    return fleet


def _gateway(data_dir: Path, facilitator: str, handles: dict[str, FakeDeployment]
             ) -> Iterator[Gateway]:
    with RpcNode() as node:
        yield from make_gateway(wallet_settings(data_dir, node, facilitator,
                                                model_catalog=CATALOG), handles=handles)


@pytest.fixture(scope="module")
def contract_gateway(tmp_path_factory: pytest.TempPathFactory, facilitator: str
                     ) -> Iterator[tuple[Gateway, dict[str, FakeDeployment]]]:
    """One gateway for a module, and its fake deployments by name; each test is a client of
    an account of its own on it (`caller`)."""
    fleet = _fleet()
    for gateway in _gateway(tmp_path_factory.mktemp("contract"), facilitator, fleet):
        yield gateway, fleet


@pytest.fixture
def caller(contract_gateway: tuple[Gateway, dict[str, FakeDeployment]]) -> Caller:
    return Caller.of_new_account(*contract_gateway)
