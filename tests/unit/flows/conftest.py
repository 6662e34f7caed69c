"""The flow tests: every flow in process, admission -> the deployment on a fake engine ->
settlement, on the gateway's own SQLite, with the test catalog beside this file."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session

from serve_app.billing.journal import differing
from serve_app.db.engine import make_engine
from serve_app.settings import Settings
from tests.unit.conftest import make_gateway

CATALOG = Path(__file__).with_name("catalog.yaml")


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture(autouse=True)
def journal_agrees(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """After each flow (its gateway stopped, every settlement written): every account's
    balance is the sum of its journal less its open holds (`inference-admin audit`)."""
    yield
    if "fake_gateway" not in request.fixturenames:
        return
    engine = make_engine(Settings(data_dir=tmp_path).resolved_database_url)
    try:
        with Session(engine) as session:
            accounts = [a.as_dict() for a in differing(session)]
    finally:
        engine.dispose()
    assert accounts == [], "balances that are not their journal's sum"


@pytest.fixture
def redis_gateway(tmp_path, gateway_catalog, fakes):
    """The gateway with Redis configured (background responses keep their events there)."""
    from tests.unit.responses.test_event_logs import REDIS_URL, _redis_unavailable

    reason = _redis_unavailable()
    if reason:
        pytest.skip(reason)
    yield from make_gateway(Settings(data_dir=tmp_path, initial_credit_usd=10,
                                     model_catalog=gateway_catalog, redis_url=REDIS_URL,
                                     redis_prefix=f"test-{uuid.uuid4().hex[:8]}"),
                            handles=fakes)
