"""SQLite engines: which URLs name a file that several engines share, and the pragmas each
kind of engine sets on its connections."""

from __future__ import annotations

from sqlalchemy import text

from serve_app.db.engine import is_sqlite_file, make_engine


def test_only_a_file_database_is_shared_between_engines(tmp_path):
    assert is_sqlite_file(f"sqlite:///{tmp_path / 'ledger.db'}")
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true",
                "postgresql://127.0.0.1/test"):
        assert not is_sqlite_file(url), url


def test_an_engine_without_checkpoints_leaves_the_log_to_the_others(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"

    def pragmas(engine) -> tuple[int, int]:
        with engine.connect() as conn:
            return (conn.execute(text("PRAGMA wal_autocheckpoint")).scalar(),
                    conn.execute(text("PRAGMA busy_timeout")).scalar())

    assert pragmas(make_engine(url)) == (1000, 30_000)
    assert pragmas(make_engine(url, lock_wait_s=0, checkpoints=False)) == (0, 0)
