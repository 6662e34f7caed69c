"""The journal of balance changes, on SQLite and PostgreSQL: every credit and debit is an
entry (grants with their reason and actor, charges, DIEM allocations and expiries), the
balance columns stay their sum less the open holds through charges, refunds of unused holds,
sweeps and epoch changes, and `inference-admin audit` names each account that differs."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text, update
from sqlmodel import Session, select

from serve_app.billing import journal, ledger
from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import price
from serve_app.billing.service import Billing
from serve_app.cli import main as cli_main
from serve_app.cli import run as cli
from serve_app.db.engine import alembic_config, make_engine
from serve_app.db.tables import Account, BalanceEntry, EntryKind, X402Payment
from serve_app.errors import ApiError
from serve_app.models.catalog import load_catalog
from serve_app.money import to_nanos
from serve_app.settings import PROJECT_ROOT, Settings

MODEL = load_catalog(PROJECT_ROOT / "configs" / "models.yaml").by_id["smollm2-135m-instruct"]
DAY_ONE = datetime(2026, 11, 20, 23, 0, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _differing(url: str) -> list[journal.AccountAudit]:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return journal.differing(session)
    finally:
        engine.dispose()


def _entries(url: str, account_id: str) -> list[BalanceEntry]:
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return list(session.exec(select(BalanceEntry).where(
                BalanceEntry.account_id == account_id).order_by(BalanceEntry.id)).all())
    finally:
        engine.dispose()


def _settings(url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=url, data_dir=tmp_path, initial_credit_usd=10)


def test_admin_credit_is_an_entry_with_its_reason_and_actor(database_url, tmp_path):
    settings = _settings(database_url, tmp_path)
    first = cli(["accounts"], settings=settings)[0]
    after = cli(["credit", "--account", first["id"], "--usd", "2.5", "--reason",
                 "refund of ticket 41", "--actor", "ana"], settings=settings)
    assert after["usd"] == 12.5
    grants = [(e.kind, e.usd_nanos, e.reason, e.actor)
              for e in _entries(database_url, first["id"])]
    assert grants == [("GRANT", to_nanos("10"), "INITIAL_CREDIT_USD", "first start"),
                      ("GRANT", to_nanos("2.5"), "refund of ticket 41", "ana")]
    # without --actor the OS user is recorded
    cli(["credit", "--account", first["id"], "--usd", "1", "--reason", "goodwill"],
        settings=settings)
    assert _entries(database_url, first["id"])[-1].actor == journal.operator_name()
    assert cli(["audit"], settings=settings) == {"ok": True, "accounts": 1, "differing": []}


@pytest.mark.parametrize("reason", [None, "  "])
def test_a_credit_without_a_reason_is_refused(tmp_path, capsys, reason):
    settings = _settings(f"sqlite:///{tmp_path / 'p.db'}", tmp_path)
    argv = ["credit", "--usd", "5"] + ([] if reason is None else ["--reason", reason])
    with pytest.raises(SystemExit) as refused:
        cli(argv, settings=settings)
    assert refused.value.code == 2
    assert "--reason" in capsys.readouterr().err


def test_audit_exits_non_zero_naming_each_account_that_differs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    settings = Settings()
    made = cli(["create-account", "--usd", "3"], settings=settings)
    cli_main(["audit"])  # every account agrees: exits normally
    capsys.readouterr()
    engine = make_engine(settings.resolved_database_url)
    with Session(engine) as session:  # a balance written behind the journal's back
        session.execute(update(Account).where(Account.id == made["accountId"])
                        .values(usd_balance_nanos=Account.usd_balance_nanos + 7))
        session.commit()
    engine.dispose()
    with pytest.raises(SystemExit) as failed:
        cli_main(["audit"])
    assert failed.value.code == 1
    report = json.loads(capsys.readouterr().out)
    assert [a["account"] for a in report["differing"]] == [made["accountId"]]
    assert report["differing"][0]["usdBalanceNanos"] - \
        report["differing"][0]["usdFromJournalNanos"] == 7


def test_charges_refunds_and_released_holds_keep_the_balance_the_journals_sum(database_url):
    """Two replicas, concurrent requests: holds, settlements below the hold (the rest
    refunded), releases, a settlement after its hold was swept, and the audit in between."""
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = Account()
        session.add(account)
        session.flush()
        journal.add_entry(session, account.id, EntryKind.GRANT, usd_nanos=to_nanos("3"),
                          reason="test", actor="test")
        session.commit()
        account_id = account.id
    engine.dispose()
    payer = Payer(account_id)
    most = price(MODEL, {"input": 2048, "output": 1024}).nanos

    async def main() -> None:
        replicas = [Billing(database_url), Billing(database_url)]
        rng = random.Random(3)

        async def request(i: int) -> None:
            billing = replicas[i % 2]
            try:
                hold = await billing.hold(f"r-{i}", payer, most)
            except ApiError:
                return
            if i % 5 == 0:
                await hold.release()
            else:
                await hold.settle(price(MODEL, {"input": rng.randint(1, 2000),
                                                "output": rng.randint(1, 900)}))
        try:
            await asyncio.gather(*(request(i) for i in range(60)))
            assert _differing(database_url) == []
            held = await replicas[0].hold("swept", payer, most)
            assert _differing(database_url) == []  # a hold is aside, not spent
            # the sweeper releases it, then its request settles after all
            await replicas[1].writer.run(lambda s: ledger.release(s, "swept"))
            await held.settle(price(MODEL, {"input": 100, "output": 100}))
        finally:
            for replica in replicas:
                replica.close()

    asyncio.run(main())
    assert _differing(database_url) == []


def test_each_epochs_diem_is_allocated_and_what_is_left_expires(database_url):
    engine = make_engine(database_url)
    with Session(engine) as session:
        account = Account(staked_tokens=2)
        session.add(account)
        session.commit()
        account_id = account.id
    engine.dispose()
    clock = Clock(DAY_ONE)
    payer = Payer(account_id)
    cost = price(MODEL, {"input": 1000, "output": 1000})

    async def main() -> None:
        billing = Billing(database_url, clock=clock)
        try:
            first = await billing.hold("day-one", payer, to_nanos("0.5"))  # all DIEM
            await first.settle(cost)
            late = await billing.hold("across-midnight", payer, to_nanos("0.25"))
            clock.now = DAY_ONE + timedelta(hours=2)  # the next UTC day
            second = await billing.hold("day-two", payer, to_nanos("0.1"))
            await second.settle(cost)
            # the hold of day one comes back after its epoch ended: its unused DIEM expires
            await late.settle(cost)
        finally:
            billing.close()

    asyncio.run(main())
    kinds = [(e.kind, e.diem_nanos, e.source) for e in _entries(database_url, account_id)]
    day_one, day_two = "2026-11-20", "2026-11-21"
    left_day_one = to_nanos("2") - cost.nanos - to_nanos("0.25")
    assert kinds == [
        ("DIEM_ALLOCATION", to_nanos("2"), day_one),
        ("DIEM_EXPIRY", -left_day_one, day_one),
        ("DIEM_ALLOCATION", to_nanos("2"), day_two),
        ("DIEM_EXPIRY", -(to_nanos("0.25") - cost.nanos), "across-midnight"),
    ]
    assert _differing(database_url) == []


def test_the_migration_opens_each_account_with_the_balance_it_has(tmp_path):
    from alembic import command

    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = alembic_config(url)
    command.upgrade(config, "0012")
    engine = make_engine(url)
    now = datetime.now(UTC).isoformat()
    with engine.begin() as db:
        db.execute(text("INSERT INTO accounts (id, kind, usd_balance_nanos, "
                        "diem_balance_nanos, is_partner, rate_limit_tier, is_operator, "
                        "staked_tokens, created_at) VALUES "
                        "('a', 'API', 700, 30, 0, 'default', 1, 0, :now), "
                        "('b', 'API', 0, 0, 0, 'default', 0, 0, :now)"), {"now": now})
        db.execute(text("INSERT INTO ledger_entries (request_id, account_id, model_id, "
                        "model_type, unit_type, units, usd_nanos, diem_nanos, started_at, "
                        "created_at) VALUES ('r1', 'a', 'm', 'text', 'tokens', '{}', 200, 5, "
                        ":now, :now)"), {"now": now})
        db.execute(text("INSERT INTO reservations (request_id, account_id, usd_nanos, "
                        "diem_nanos, created_at) VALUES ('r2', 'a', 100, 0, :now)"),
                   {"now": now})
    engine.dispose()
    command.upgrade(config, "head")
    assert [(e.kind, e.usd_nanos, e.diem_nanos) for e in _entries(url, "a")] == \
        [("OPENING", 1000, 35)]
    assert [(e.kind, e.usd_nanos) for e in _entries(url, "b")] == [("OPENING", 0)]
    assert _differing(url) == []


def test_a_new_accounts_credit_and_a_resolved_payment_are_entries(database_url, tmp_path):
    settings = _settings(database_url, tmp_path)
    made = cli(["create-account", "--usd", "4", "--actor", "bob"], settings=settings)
    assert [(e.kind, e.usd_nanos, e.actor) for e in _entries(database_url, made["accountId"])] \
        == [("GRANT", to_nanos("4"), "bob")]
    wallet = "0x" + "ab" * 20
    engine = make_engine(database_url)
    with Session(engine) as session:  # a top-up whose settlement was never confirmed
        session.add(X402Payment(payment_id="p-1", wallet_address=wallet, network="eip155:8453",
                                amount_nanos=to_nanos("6")))
        session.commit()
    engine.dispose()
    done = cli(["resolve-payment", "p-1", "--settled-as", "0xfeed"], settings=settings)
    assert done["credited"] == 6
    account = next(a for a in cli(["accounts"], settings=settings)
                   if a["walletAddress"] == wallet)
    assert [(e.kind, e.usd_nanos, e.source) for e in _entries(database_url, account["id"])] \
        == [("TOP_UP", to_nanos("6"), "p-1")]
    assert cli(["audit"], settings=settings)["ok"]
