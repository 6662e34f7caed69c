"""Shared fixtures: databases (SQLite always, PostgreSQL when reachable) and an in-process
gateway with a fresh control plane."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _postgres_unavailable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), connect_timeout=3):
            return None
    except Exception as exc:  # any failure means: skip with the reason
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {exc}"


_PG_REASON = _postgres_unavailable()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each kind; PostgreSQL gets a schema of its own."""
    from serve_app.db.engine import migrate

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'test.db'}"
        migrate(url)
        yield url
        return
    if _PG_REASON:
        pytest.skip(_PG_REASON)
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    plain = POSTGRES_URL.replace("+psycopg", "")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    try:
        migrate(url)
        yield url
    finally:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
