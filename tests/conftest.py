"""Shared fixtures: databases (SQLite always, PostgreSQL when reachable) and an in-process
gateway with a fresh control plane."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Loggers that redis-py creates on first use, from the gateway's event loop thread (a Redis
# connection's setup, a pub/sub message), made here first: pytest's log capture iterates every
# logger as each test phase starts, and a logger added by that thread meanwhile failed the
# test ("dictionary changed size during iteration").
for _name in ("redis.asyncio.connection", "push_response"):
    logging.getLogger(_name)

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _postgres_unavailable() -> str | None:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), connect_timeout=3):
            return None
    except Exception as exc:  # any failure means: skip with the reason
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {exc}"


_PG_REASON = _postgres_unavailable()


def new_postgres_schema(prefix: str) -> str:
    """A fresh, empty schema of the test database; the URL that uses it."""
    import psycopg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"


def drop_postgres_schema(url: str) -> None:
    import psycopg

    schema = url.rsplit("%3D", 1)[-1]
    with psycopg.connect(POSTGRES_URL.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


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
    url = new_postgres_schema("t")
    try:
        migrate(url)
        yield url
    finally:
        drop_postgres_schema(url)
