"""A wallet's account row is written at its first top-up or charge: the hold of a wallet with
no row refuses any amount (402, nothing written) and writes the row only for a charge that
costs nothing; the id it gets is the one its sign-ins used."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from eth_account import Account as EthAccount
from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.billing import ledger
from serve_app.billing.ledger import InsufficientBalance, Payer
from serve_app.billing.wallet_accounts import (
    find_or_create_wallet_account,
    find_wallet_account,
    wallet_account_id,
)
from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, Reservation

NOW = datetime(2025, 1, 2, 12, tzinfo=UTC)


@pytest.fixture
def engine(database_url: str):
    engine = make_engine(database_url, write_transactions=True)
    yield engine
    engine.dispose()


def _count(engine, table) -> int:
    with Session(engine) as session:
        return session.execute(select(func.count()).select_from(table)).scalar_one()


def test_a_hold_for_a_wallet_without_a_row_refuses_and_writes_nothing(engine) -> None:
    address = EthAccount.create().address
    payer = Payer(wallet_account_id(address), wallet_address=address)
    with Session(engine) as session:
        with pytest.raises(InsufficientBalance) as refused:
            ledger.hold(session, "req-1", payer, 1, NOW)
        session.commit()
    assert (refused.value.available_nanos, refused.value.needed_nanos) == (0, 1)
    assert _count(engine, Account) == 0 and _count(engine, Reservation) == 0


def test_a_charge_of_nothing_writes_the_row_its_sign_ins_named(engine) -> None:
    address = EthAccount.create().address
    with Session(engine) as session:
        unwritten = find_wallet_account(session, address)
    assert not unwritten.exists
    with Session(engine) as session:
        held = ledger.hold(session, "req-1", Payer(unwritten.account_id,
                                                   wallet_address=address), 0, NOW)
        session.commit()
    assert (held.before.usd_nanos, held.before.diem_nanos) == (0, 0)
    with Session(engine) as session:
        written = find_wallet_account(session, address)
    assert written.exists and written.account_id == unwritten.account_id


def test_a_key_account_that_is_gone_is_still_a_401(engine) -> None:
    with Session(engine) as session, pytest.raises(ledger.AccountNotFound):
        ledger.hold(session, "req-1", Payer("no-such-account", api_key_id="k"), 1, NOW)


def test_find_or_create_writes_one_row_however_often_it_runs(engine) -> None:
    address = EthAccount.create().address
    for _ in range(2):
        with Session(engine) as session:
            found = find_or_create_wallet_account(session, address)
            session.commit()
        assert found.exists and found.account_id == wallet_account_id(address)
    assert _count(engine, Account) == 1
