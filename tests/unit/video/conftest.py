"""The video tests: the gateway in process with its video models served by fakes, a media
server on loopback for the inputs clients name by URL (let through the private-address guard),
and the books of the gateway's database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.models.catalog import load_catalog
from serve_app.settings import Settings
from tests.fakes import DeploymentHandle, FakeSpeechDeployment, fake_deployments
from tests.unit.conftest import Gateway, make_gateway
from tests.unit.flows.books import Books
from tests.unit.video.media_server import MediaServer

CATALOG = Path(__file__).with_name("catalog.yaml")


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture
def media() -> Iterator[MediaServer]:
    server = MediaServer()
    yield server
    server.close()


@pytest.fixture
def gateway_settings(request: pytest.FixtureRequest, tmp_path: Path,
                     media: MediaServer) -> dict:
    """What the video gateway runs with; a test changes it by parametrizing this fixture
    (indirect) with the settings to override."""
    return {"data_dir": tmp_path, "initial_credit_usd": 10, "model_catalog": CATALOG,
            "web_fetch_allowed_hosts": media.host, "media_fetches_per_account": 1,
            **getattr(request, "param", {})}


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    """The video deployments of the catalog, and the speech deployment of queued audio: the
    real classes on fake engines."""
    catalog = load_catalog(gateway_catalog)
    fleet = fake_deployments(catalog)
    fleet["speech"] = FakeSpeechDeployment("speech", catalog.of_type("music"))
    return fleet


@pytest.fixture
def gateway(gateway_settings: dict, fakes) -> Iterator[Gateway]:
    yield from make_gateway(Settings(**gateway_settings), handles=fakes)


@pytest.fixture
def key(gateway: Gateway) -> str:
    """An INFERENCE key of the gateway's account ($10 of credit)."""
    return gateway.create_key()["apiKey"]


@pytest.fixture
def books(gateway: Gateway) -> Iterator[Books]:
    books = Books(gateway)
    yield books
    books.close()

