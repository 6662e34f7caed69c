"""The gateway of the reference-contract sweep: every model of configs/models.yaml served by its
real deployment class on fake engines (queued speech and transcription too), a fake JSON-RPC
node for the crypto route, and the development x402 facilitator for wallet top-ups and
sign-ins."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployments.engines.stop import StopSignal
from serve_app.models.catalog import load_catalog
from serve_app.settings import PROJECT_ROOT
from serve_app.wallets.x402 import dev_facilitator
from tests.fakes import DeploymentHandle, fake_deployments
from tests.fakes.speech import FakeSpeechDeployment
from tests.fakes.transcription import FakeTranscriptionDeployment, FakeTranscriptionEngine
from tests.rpc_node import RpcNode
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.http.reference_contract.calls import Caller
from tests.unit.wallets.wallet_gateway import wallet_settings

CATALOG = PROJECT_ROOT / "configs" / "models.yaml"


class SentenceHeard(FakeTranscriptionEngine):
    """Hears one sentence in every file, with its segment and (when asked) its words."""

    def transcribe(self, audio: bytes, language: str | None, timestamps: bool,
                   stop: StopSignal | None = None) -> dict[str, Any]:
        heard = super().transcribe(audio, language, timestamps, stop)
        heard["segments"] = [{"text": heard["text"], "start": 0.0, "end": 1.0}]
        if timestamps:
            heard["words"] = [{"word": "Hello", "start": 0.0, "end": 0.5},
                              {"word": "there.", "start": 0.5, "end": 1.0}]
        return heard


@pytest.fixture(scope="module")
def facilitator() -> Iterator[str]:
    url, stop = dev_facilitator.start_in_thread()
    yield url
    stop()


def _fleet() -> dict[str, DeploymentHandle]:
    """Every deployment of the catalog: the real classes on fake engines, speech (streamed and
    queued) and transcription included."""
    catalog = load_catalog(CATALOG)
    fleet = fake_deployments(catalog)
    of = {d: [m for m in catalog.models if m.deployment == d]
          for d in ("speech", "transcription")}
    fleet["speech"] = FakeSpeechDeployment("speech", of["speech"])
    fleet["transcription"] = FakeTranscriptionDeployment("transcription", of["transcription"],
                                                         engine=SentenceHeard)
    return fleet


def _gateway(data_dir: Path, facilitator: str, handles: dict[str, DeploymentHandle]
             ) -> Iterator[Gateway]:
    with RpcNode() as node:
        yield from make_gateway(wallet_settings(data_dir, node, facilitator,
                                                model_catalog=CATALOG), handles=handles)


@pytest.fixture(scope="module")
def contract_gateway(tmp_path_factory: pytest.TempPathFactory, facilitator: str
                     ) -> Iterator[tuple[Gateway, dict[str, DeploymentHandle]]]:
    """One gateway for a module, and its fake deployments by name; each test is a client of
    an account of its own on it (`caller`)."""
    fleet = _fleet()
    for gateway in _gateway(tmp_path_factory.mktemp("contract"), facilitator, fleet):
        yield gateway, fleet


@pytest.fixture
def caller(contract_gateway: tuple[Gateway, dict[str, DeploymentHandle]]) -> Caller:
    return Caller.of_new_account(*contract_gateway)
