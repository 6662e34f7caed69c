"""A wallet's money in the journal: each x402 top-up is an entry of kind TOP_UP naming its
payment, each paid call a charge, and the audit agrees with the wallet's balance, on SQLite
and PostgreSQL."""

from __future__ import annotations

from sqlmodel import Session, select

from serve_app.db.engine import make_engine
from serve_app.db.tables import BalanceEntry, X402Payment
from tests.unit.conftest import Gateway
from tests.unit.wallets.wallet_gateway import rpc_call, top_up
from tests.wallets import Wallet


def test_top_ups_and_charges_are_the_wallets_journal(each_db_gw: Gateway) -> None:
    gw = each_db_gw
    wallet = Wallet()
    assert top_up(gw, wallet, "5").status_code == 200
    assert top_up(gw, wallet, "7.5").status_code == 200
    for _ in range(3):
        assert rpc_call(gw, wallet).status_code == 200
    engine = make_engine(gw.settings.resolved_database_url)
    with Session(engine) as session:
        payments = {p.payment_id: p.account_id for p in session.exec(select(X402Payment))}
        entries = session.exec(select(BalanceEntry).where(
            BalanceEntry.kind == "TOP_UP").order_by(BalanceEntry.id)).all()
    engine.dispose()
    assert [e.usd_nanos for e in entries] == [5 * 10**9, 7_500_000_000]
    assert {e.source: e.account_id for e in entries} == payments
    audit = gw.cli("audit")
    assert audit["ok"] and audit["differing"] == []
    wallet_account = next(a for a in gw.cli("accounts") if a["walletAddress"] == wallet.address)
    assert wallet_account["usd"] < 12.5  # the three calls were charged
