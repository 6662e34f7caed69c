"""Backup and restore of the control plane's database (`inference-admin backup|restore`).

A backup is one consistent snapshot taken while requests settle: SQLite's online backup API
copies the database in one read transaction (writers, in WAL mode, do not wait for it), and
`pg_dump` reads one snapshot of PostgreSQL. Every charge a backup holds has its balance and
its journal with it, so `inference-admin audit` passes on a restored copy. A restore goes only
into an empty database: it never merges into, or overwrites, live books.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from serve_app.db.engine import is_sqlite_file, make_engine, normalise_url, schema_revision

SQLITE_MAGIC = b"SQLite format 3\x00"
PG_DUMP_MAGIC = b"PGDMP"  # pg_dump's custom format
LOCK_WAIT_S = 30.0


class BackupError(Exception):
    """A backup or restore that cannot be done, with what the operator can do about it."""


@dataclass(frozen=True, slots=True)
class Done:
    path: Path
    database: str  # sqlite | postgresql
    bytes: int
    revision: str | None  # the migration the database is (was) at

    def as_dict(self) -> dict:
        return {"path": str(self.path), "database": self.database, "bytes": self.bytes,
                "schemaRevision": self.revision}


def _kind(url: str) -> str:
    url = normalise_url(url)
    if url.startswith("postgresql"):
        return "postgresql"
    if is_sqlite_file(url):
        return "sqlite"
    raise BackupError(f"cannot back up or restore {make_url(url).drivername} databases: "
                      "only a SQLite file or PostgreSQL")


def _sqlite_path(url: str) -> Path:
    return Path(normalise_url(url).split("///", 1)[1])


def _new_file(path: Path) -> Path:
    """Where a backup is written before it is moved to `path` (never a half-written backup
    under the name asked for); `path` must not exist yet."""
    if path.exists():
        raise BackupError(f"{path} exists: a backup never overwrites a file, give a new path")
    if not path.parent.is_dir():
        raise BackupError(f"{path.parent} is not a directory")
    return path.with_name(path.name + ".partial")


def backup(url: str, path: Path) -> Done:
    """Write a consistent copy of the database at `url` to `path`."""
    kind = _kind(url)
    partial = _new_file(path)
    revision = schema_revision(url)
    try:
        if kind == "sqlite":
            _sqlite_backup(_sqlite_path(url), partial)
        else:
            _pg_dump(url, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return Done(path, kind, path.stat().st_size, revision)


def _sqlite_backup(source: Path, target: Path) -> None:
    if not source.is_file():
        raise BackupError(f"no database at {source}")
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
    dst = sqlite3.connect(target)
    try:
        src.backup(dst)  # all pages in one step: one read transaction, one snapshot
        # a file that stands alone (the source's WAL mode would want a -wal beside it)
        dst.execute("PRAGMA journal_mode=DELETE")
        if dst.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise BackupError(f"the copy of {source} does not pass SQLite's quick_check")
    finally:
        dst.close()
        src.close()


def _pg_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise BackupError(
            f"{name} is not installed: install PostgreSQL's client tools (the server's major "
            f"version or newer; Debian: apt-get install postgresql-client), or run {name} "
            "yourself as docs/operators/upgrade-and-backup.md shows")
    return found


def _pg_connection(url: str) -> tuple[str, dict[str, str]]:
    """The libpq connection string of `url` without its password, and the environment that
    carries the password (so it never shows in the process list)."""
    parsed = make_url(normalise_url(url))
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    plain = parsed.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _pg_schema(url: str) -> str | None:
    """The schema the settings' connection uses (its search_path), None if it does not exist."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT current_schema()")).scalar()
    finally:
        engine.dispose()


def _run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BackupError(f"{Path(command[0]).name} failed ({done.returncode}): "
                          f"{done.stderr.strip() or done.stdout.strip()}")


def _pg_dump(url: str, target: Path) -> None:
    tool = _pg_tool("pg_dump")
    schema = _pg_schema(url)
    if schema is None:
        raise BackupError("the database's search_path names no schema that exists")
    conninfo, env = _pg_connection(url)
    # The custom format, restored by pg_restore; only the schema the platform uses, so a
    # database shared with other schemas is not copied whole.
    _run([tool, "--format=custom", "--no-owner", "--no-privileges", f"--schema={schema}",
          f"--file={target}", f"--dbname={conninfo}"], env)


def tables(url: str) -> list[str]:
    """The tables of the database the settings use (on PostgreSQL, of its schema)."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return sorted(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def _backup_kind(path: Path) -> str:
    if not path.is_file():
        raise BackupError(f"no backup at {path}")
    with path.open("rb") as file:
        head = file.read(len(SQLITE_MAGIC))
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head.startswith(PG_DUMP_MAGIC):
        return "postgresql"
    raise BackupError(f"{path} is neither a SQLite backup nor a pg_dump archive "
                      "(custom format)")


def restore(url: str, path: Path) -> Done:
    """Restore the backup at `path` into the empty database at `url`."""
    kind, made_by = _kind(url), _backup_kind(path)
    if kind != made_by:
        raise BackupError(f"{path} is a {made_by} backup; the settings' database is "
                          f"{kind} (DATABASE_URL)")
    if kind == "sqlite":
        target = _sqlite_path(url)
        if target.exists() and tables(url):
            raise BackupError(f"{target} is not empty: a restore goes into an empty "
                              "database (point DATA_DIR or DATABASE_URL at a new one)")
        target.parent.mkdir(parents=True, exist_ok=True)
        _sqlite_restore(path, target)
    else:
        found = tables(url) if _pg_schema(url) is not None else []
        if found:
            raise BackupError(f"the database has {len(found)} tables already: a restore goes "
                              "into an empty database (point DATABASE_URL at a new one)")
        _pg_restore(url, path)
        if "accounts" not in tables(url):
            raise BackupError("the backup was restored into a schema that DATABASE_URL's "
                              "search_path does not name: it keeps the schema it was taken "
                              f"from (pg_restore --list {path} shows it)")
    return Done(path, kind, path.stat().st_size, schema_revision(url))


def _pg_restore(url: str, path: Path) -> None:
    """pg_restore in one transaction (all of it or nothing), without creating the schemas the
    database has already: a backup of `public` names it, and every database has one."""
    tool = _pg_tool("pg_restore")
    conninfo, env = _pg_connection(url)
    listed = subprocess.run([tool, "--list", str(path)], env=env, capture_output=True,
                            text=True, check=False)
    if listed.returncode != 0:
        raise BackupError(f"pg_restore cannot read {path}: {listed.stderr.strip()}")
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            existing = set(connection.execute(
                text("SELECT nspname FROM pg_namespace")).scalars())
    finally:
        engine.dispose()
    kept = [line for line in listed.stdout.splitlines()
            if _schema_entry(line) not in existing]
    with tempfile.NamedTemporaryFile("w", suffix=".list", delete=False) as contents:
        contents.write("\n".join(kept) + "\n")
    try:
        _run([tool, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
              f"--use-list={contents.name}", f"--dbname={conninfo}", str(path)], env)
    finally:
        os.unlink(contents.name)


def _schema_entry(line: str) -> str | None:
    """The schema a line of `pg_restore --list` creates or comments on ("12; 2615 2200
    SCHEMA - public postgres", "3370; 0 0 COMMENT - SCHEMA public postgres"), None for any
    other line."""
    fields = line.split()
    if line.startswith(";") or len(fields) < 6:
        return None
    if fields[3:5] == ["SCHEMA", "-"]:
        return fields[5]
    if fields[3:6] == ["COMMENT", "-", "SCHEMA"] and len(fields) > 6:
        return fields[6]
    return None


def _sqlite_restore(source: Path, target: Path) -> None:
    src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        if src.execute("PRAGMA quick_check").fetchone()[0] != "ok":
            raise BackupError(f"{source} does not pass SQLite's quick_check")
        dst = sqlite3.connect(target, timeout=LOCK_WAIT_S)
        try:
            src.backup(dst)  # through SQLite itself: the target's journal stays whole
            dst.execute("PRAGMA journal_mode=WAL")  # as the platform opens it
        finally:
            dst.close()
    finally:
        src.close()
