"""The gateway app in process (no Serve), with its own control plane per test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serve_app.cli import run as cli
from serve_app.db.bootstrap import bootstrap
from serve_app.gateway import create_prefixed_app
from serve_app.settings import Settings
from serve_app.state import GatewayState


@dataclass
class Gateway:
    client: TestClient
    state: GatewayState
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


def make_gateway(settings: Settings) -> Iterator[Gateway]:
    result = bootstrap(settings)
    state = GatewayState.create(settings)
    with TestClient(create_prefixed_app(state)) as client:
        yield Gateway(client, state, result.generated_admin_key or settings.admin_api_key,
                      result.account_id, settings)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10))


@pytest.fixture
def pg_gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """The gateway on each database kind (SQLite and PostgreSQL)."""
    yield from make_gateway(Settings(data_dir=tmp_path, database_url=database_url))
