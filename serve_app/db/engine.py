"""Database engine for SQLite (the embedded default) or PostgreSQL, and schema migration."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlmodel import Session, create_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
ALEMBIC_INI = Path(__file__).resolve().parent / "alembic.ini"

T = TypeVar("T")


def normalise_url(url: str) -> str:
    """Accept the usual `postgresql://` / `postgres://` forms and use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def is_database_outage(exc: BaseException) -> bool:
    """The database cannot be reached (down, restarting, connection cut, SQLite's file locked
    or gone), as opposed to a statement that failed on a live server (a deadlock, a missing
    table): waiting may help, retrying at once will not."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    if isinstance(exc.orig, sqlite3.Error):
        return any(sign in str(exc.orig) for sign in _SQLITE_OUTAGE_SIGNS)
    # psycopg gives connection failures no SQLSTATE; deadlocks and serialization failures,
    # also OperationalErrors, carry theirs
    return getattr(exc.orig, "sqlstate", None) is None


_SQLITE_OUTAGE_SIGNS = ("database is locked", "unable to open database", "disk I/O error")


def is_sqlite_file(url: str) -> bool:
    """A SQLite database in a file (which several engines may open), not in memory."""
    url = normalise_url(url)
    if not url.startswith("sqlite") or "///" not in url:
        return False
    path = url.split("///", 1)[1]
    return path not in ("", ":memory:") and "mode=memory" not in path


def make_engine(url: str, *, write_transactions: bool = False,
                lock_wait_s: float = 30.0, checkpoints: bool = True) -> Engine:
    """An engine for the URL. `write_transactions`: every SQLite transaction takes the write lock
    when it begins (BEGIN IMMEDIATE), so a read-then-write cannot race another writer; the
    money operations use such an engine (on PostgreSQL they lock rows instead).
    `lock_wait_s`: how long a SQLite statement waits for a lock another connection holds.
    `checkpoints`: its commits copy the write-ahead log back into the database once it has
    grown (SQLite's automatic checkpoint, a write and an fsync); without them, another
    engine's commits do it."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        if is_sqlite_file(url):
            Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False,
                                                  "timeout": lock_wait_s})
        busy_timeout_ms = int(lock_wait_s * 1000)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
            if not checkpoints:
                cur.execute("PRAGMA wal_autocheckpoint=0")
            cur.close()
            if write_transactions:
                dbapi_conn.isolation_level = None  # SQLAlchemy emits BEGIN itself, below

        if write_transactions:
            @event.listens_for(engine, "begin")
            def _begin_immediate(conn) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def alembic_config(url: str) -> Config:
    """The packaged alembic.ini, pointed at `url`."""
    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def migrate(url: str) -> None:
    """Bring the schema to the newest migration (idempotent)."""
    command.upgrade(alembic_config(url), "head")


def schema_revision(url: str) -> str | None:
    """The migration the database is at (None: never migrated)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def pending_migrations(url: str) -> list[str]:
    """The migrations `migrate` would run, oldest first."""
    scripts = ScriptDirectory.from_config(alembic_config(url))
    current = schema_revision(url)
    pending = [script.revision for script in scripts.iterate_revisions("heads", current)]
    return pending[::-1]


async def run_in_session(engine: Engine, work: Callable[[Session], T]) -> T:
    """Run blocking database work off the event loop, in a session of its own."""

    def run() -> T:
        with Session(engine, expire_on_commit=False) as session:
            return work(session)

    return await asyncio.to_thread(run)


def dialect_insert(session: Session):
    """`insert` of the session's dialect, for `ON CONFLICT` (upserts, claims)."""
    dialect = session.get_bind().dialect.name
    return postgresql.insert if dialect == "postgresql" else sqlite.insert
