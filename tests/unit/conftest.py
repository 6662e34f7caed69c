"""The gateway app in process (no Serve), with its own control plane per test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from deployments.weights.store import PREBUILT_DIR_ENV
from serve_app.accounts.provisioning import bootstrap
from serve_app.cli import run as cli
from serve_app.gateway import create_prefixed_app
from serve_app.models.catalog import load_catalog
from serve_app.services import GatewayServices
from serve_app.settings import PROJECT_ROOT, Settings
from tests.fakes import DeploymentHandle, fake_deployments
from tests.unit.flows.books import Books


@pytest.fixture(scope="session", autouse=True)
def _builders_build() -> Iterator[None]:
    """The weights the tests ask for are built by their builders, not copied from the folders
    `make install` built ahead (tests of that copy name their own folder)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(PREBUILT_DIR_ENV, "")
        yield


@dataclass
class Gateway:
    client: TestClient
    services: GatewayServices
    admin_key: str
    account_id: str
    settings: Settings

    def cli(self, *argv: str):
        """`inference-admin ARGV` on this gateway's database."""
        return cli(list(argv), settings=self.settings)

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}

    def create_key(self, **fields) -> dict:
        body = {"apiKeyType": "INFERENCE", "description": "test key", **fields}
        resp = self.client.post("/api/v1/api_keys", headers=self.auth(), json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]


def account_key(gateway: Gateway, usd: str) -> tuple[str, str]:
    """An INFERENCE key of a new account with `usd` of credit; and that account's id."""
    account = gateway.cli("create-account", "--usd", usd)
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(account["apiKey"]),
                               json={"apiKeyType": "INFERENCE", "description": "other"})
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["apiKey"], account["accountId"]


def sdk_of(gateway: Gateway, key: str) -> OpenAI:
    """The `openai` SDK speaking HTTP to the in-process `gateway` with `key`."""
    return OpenAI(base_url="http://testserver/api/v1", api_key=key, max_retries=0,
                  http_client=gateway.client)


def make_gateway(settings: Settings, handles: dict[str, Any] | None = None
                 ) -> Iterator[Gateway]:
    """The gateway on `settings`; `handles`: its model deployments by name (tests/fakes), none
    by default (every model offline)."""
    result = bootstrap(settings)
    services = GatewayServices.build(settings, handles=handles)
    with TestClient(create_prefixed_app(services)) as client:
        yield Gateway(client, services, result.generated_admin_key or settings.admin_api_key,
                      result.account_id, settings)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10))


@pytest.fixture
def pg_gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway on each database kind (SQLite and PostgreSQL)."""
    yield from make_gateway(Settings(data_dir=tmp_path, database_url=database_url))


@pytest.fixture
def gateway_catalog() -> Path:
    """The catalog of `fake_gateway` (a test module or conftest may override it)."""
    return PROJECT_ROOT / "configs" / "models.yaml"


@pytest.fixture
def fakes(gateway_catalog: Path) -> dict[str, DeploymentHandle]:
    """A handle for each deployment of the catalog, by name: the real deployment class on fake
    engines (tests/fakes)."""
    return fake_deployments(load_catalog(gateway_catalog))


@pytest.fixture
def fake_gateway(tmp_path: Path, gateway_catalog: Path,
                 fakes: dict[str, DeploymentHandle]) -> Iterator[Gateway]:
    """The gateway with its models served by `fakes`: requests run through admission, the
    deployment (its engine a fake) and settlement, in process."""
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     model_catalog=gateway_catalog), handles=fakes)


@pytest.fixture
def key(fake_gateway: Gateway) -> str:
    """An INFERENCE key of the fake gateway's account ($10 of credit)."""
    return fake_gateway.create_key()["apiKey"]


@pytest.fixture
def sdk(fake_gateway: Gateway, key: str) -> OpenAI:
    """The `openai` SDK on the fake gateway, with `key`."""
    return sdk_of(fake_gateway, key)


@pytest.fixture
def books(fake_gateway: Gateway) -> Iterator[Books]:
    """The fake gateway's ledger, balance and holds."""
    books = Books(fake_gateway)
    yield books
    books.close()
