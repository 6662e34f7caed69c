"""The flow tests: every flow in process, admission -> the deployment on a fake engine ->
settlement, on the gateway's own SQLite, with the test catalog beside this file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.flows.books import Books

CATALOG = Path(__file__).with_name("catalog.yaml")


@pytest.fixture
def gateway_catalog() -> Path:
    return CATALOG


@pytest.fixture
def key(fake_gateway) -> str:
    """An INFERENCE key of the gateway's account ($10 of credit)."""
    return fake_gateway.create_key()["apiKey"]


@pytest.fixture
def books(fake_gateway) -> Iterator[Books]:
    """The gateway's ledger, balance and holds."""
    books = Books(fake_gateway)
    yield books
    books.close()
