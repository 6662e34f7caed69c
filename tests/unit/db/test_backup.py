"""Backup, restore and migrate (`inference-admin backup|restore|migrate`), on SQLite and
PostgreSQL: a backup taken while charges settle restores into books that pass the audit with
the balance the backup point had; a restore never goes into a database that has tables; a
schema behind this version's migrations is reported."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func
from sqlmodel import Session, select

from serve_app.billing import journal
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import price
from serve_app.billing.service import Billing
from serve_app.cli import main as cli_main
from serve_app.cli import run as cli
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, EntryKind, LedgerEntry, Reservation
from serve_app.errors import ApiError
from serve_app.models.catalog import load_catalog
from serve_app.money import to_nanos
from serve_app.settings import PROJECT_ROOT, Settings
from tests.conftest import drop_postgres_schema

MODEL = load_catalog(PROJECT_ROOT / "configs" / "models.yaml").by_id["smollm2-135m-instruct"]
WAIT_S = 120.0  # the most a condition below may take on a loaded machine (not a speed bound)


def _settings(url: str, data_dir: Path) -> Settings:
    return Settings(database_url=url, data_dir=data_dir)


def _count_charges(url: str) -> int:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return session.exec(select(func.count()).select_from(LedgerEntry)).one()
    finally:
        engine.dispose()


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT_S} s for {what}"
        time.sleep(0.05)


class ChargesUnderWay:
    """Requests held and settled without pause on two billing services (two replicas), in a
    thread of their own, until stopped."""

    def __init__(self, url: str, account_id: str) -> None:
        self.url, self.payer = url, Payer(account_id)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ChargesUnderWay:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            asyncio.run(self._load())
        except BaseException as exc:
            self.error = exc

    async def _load(self) -> None:
        replicas = [Billing(self.url), Billing(self.url)]
        most = price(MODEL, {"input": 2048, "output": 1024}).nanos

        async def client(n: int) -> None:
            i = 0
            while not self.stop.is_set():
                i += 1
                try:
                    hold = await replicas[n % 2].hold(f"c{n}-{i}", self.payer, most)
                except ApiError:
                    return
                await hold.settle(price(MODEL, {"input": 100 + i % 900, "output": 1 + i % 300}))
        try:
            await asyncio.gather(*(client(n) for n in range(4)))
        finally:
            for replica in replicas:
                replica.close()


def _books(url: str) -> dict[str, tuple]:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return {e.request_id: (e.account_id, e.usd_nanos, e.diem_nanos)
                    for e in session.exec(select(LedgerEntry)).all()}
    finally:
        engine.dispose()


def test_a_backup_under_concurrent_charges_restores_books_that_pass_the_audit(
        database_url, tmp_path):
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = Account()
        session.add(account)
        session.flush()
        journal.add_entry(session, account.id, EntryKind.GRANT, usd_nanos=to_nanos("1000"),
                          reason="load", actor="test")
        session.commit()
        account_id = account.id
    engine.dispose()
    backup_file = tmp_path / "platform.backup"
    with ChargesUnderWay(database_url, account_id):
        _wait_for(lambda: _count_charges(database_url) >= 20, "the first charges")
        done = cli(["backup", str(backup_file)], settings=_settings(database_url, tmp_path))
        settled_by_then = _count_charges(database_url)
        # the audit reads one snapshot too: it agrees while requests settle
        assert cli(["audit"], settings=_settings(database_url, tmp_path))["ok"]
        # charges kept settling after the backup was taken
        _wait_for(lambda: _count_charges(database_url) > settled_by_then + 10,
                  "charges after the backup")
    assert done["database"] == ("sqlite" if database_url.startswith("sqlite") else
                                "postgresql")
    assert done["schemaRevision"] and done["bytes"] > 0
    original = _books(database_url)

    if database_url.startswith("sqlite"):  # into a new DATA_DIR
        restored_dir = tmp_path / "restored"
        restored_url = Settings(data_dir=restored_dir, database_url=None
                                ).resolved_database_url
        settings = Settings(data_dir=restored_dir, database_url=None)
    else:  # the database lost, then restored where it was
        drop_postgres_schema(database_url)
        restored_url, settings = database_url, _settings(database_url, tmp_path)
    assert cli(["restore", str(backup_file)], settings=settings)["schemaRevision"] == \
        done["schemaRevision"]

    restored = _books(restored_url)
    assert 20 <= len(restored) <= settled_by_then < len(original)
    # the backup is the books at one point: each charge as it was written
    assert all(original[request_id] == entry for request_id, entry in restored.items())
    audit = cli(["audit"], settings=settings)
    assert audit == {"ok": True, "accounts": 1, "differing": []}
    engine = make_engine(restored_url)
    with Session(engine) as session:
        balance = session.get(Account, account_id).usd_balance_nanos
        held = session.exec(select(func.coalesce(func.sum(Reservation.usd_nanos), 0))).one()
    engine.dispose()
    # the balance the backup point had: the credit less the charges in it and its open holds
    assert balance == to_nanos("1000") - sum(usd for _, usd, _ in restored.values()) - held


def test_a_restore_refuses_a_database_that_has_tables(database_url, tmp_path, capsys):
    settings = _settings(database_url, tmp_path)
    cli(["accounts"], settings=settings)  # the first start's account
    backup_file = tmp_path / "b"
    cli(["backup", str(backup_file)], settings=settings)
    with pytest.raises(SystemExit, match="restore goes into an empty database"):
        cli(["restore", str(backup_file)], settings=settings)
    assert len(cli(["accounts"], settings=settings)) == 1


def test_a_backup_never_overwrites_a_file(tmp_path):
    settings = _settings(f"sqlite:///{tmp_path / 'p.db'}", tmp_path)
    cli(["accounts"], settings=settings)
    existing = tmp_path / "b"
    existing.write_text("kept")
    with pytest.raises(SystemExit, match="never overwrites"):
        cli(["backup", str(existing)], settings=settings)
    assert existing.read_text() == "kept"


def test_a_restore_refuses_what_is_not_a_backup_of_its_kind(tmp_path):
    settings = _settings(f"sqlite:///{tmp_path / 'new' / 'p.db'}", tmp_path)
    junk = tmp_path / "junk"
    junk.write_bytes(b"PGDMP\x01\x0e")
    with pytest.raises(SystemExit, match="is a postgresql backup"):
        cli(["restore", str(junk)], settings=settings)
    junk.write_text("hello")
    with pytest.raises(SystemExit, match="neither a SQLite backup nor a pg_dump archive"):
        cli(["restore", str(junk)], settings=settings)


def test_migrate_check_exits_non_zero_while_migrations_are_pending(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as pending:
        cli_main(["migrate", "--check"])
    assert pending.value.code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["schemaRevision"] is None and report["pending"][0] == "0001"
    cli_main(["migrate"])
    applied = json.loads(capsys.readouterr().out)
    assert applied["applied"] == report["pending"]
    assert applied["schemaRevision"] == report["pending"][-1]
    cli_main(["migrate", "--check"])  # nothing pending: exits normally
    assert json.loads(capsys.readouterr().out)["pending"] == []
