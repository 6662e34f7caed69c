"""What the account's books say after a request: its ledger entry and lines (keyed by the
answer's `CF-RAY`, the request id), the balance, and the holds still open."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from sqlalchemy import func
from sqlmodel import Session, select

from serve_app.db.engine import make_engine
from serve_app.db.tables import Account, LedgerEntry, LedgerLine, Reservation

NANOS = 10**9


def nanos(usd: str | int | Decimal, units: int = 1, per: int = 1) -> int:
    """`units` at `usd` per `per` units, in nano-USD rounded up as the ledger does."""
    return int((Decimal(str(usd)) * units * NANOS / per).to_integral_value(ROUND_CEILING))


def per_million(usd: str | int, tokens: int) -> int:
    return nanos(usd, tokens, 1_000_000)


@dataclass(frozen=True)
class Charged:
    """One request's settlement: its model, its total, and each line's units and amount."""

    model_id: str
    total_nanos: int
    lines: dict[str, tuple[int, int]]  # line type -> (units, nano-USD)


class Books:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self._engine = make_engine(gateway.settings.resolved_database_url)

    def _session(self) -> Session:
        return Session(self._engine)

    def charges(self, request_id: str) -> list[Charged]:
        """The settled charges of a request (at most one ever: settling is keyed by it)."""
        with self._session() as s:
            entries = s.exec(select(LedgerEntry).where(LedgerEntry.request_id == request_id)
                             ).all()
            out = []
            for entry in entries:
                lines = s.exec(select(LedgerLine).where(LedgerLine.request_id == request_id)
                               ).all()
                out.append(Charged(entry.model_id, entry.usd_nanos + entry.diem_nanos,
                                   {line.line_type: (line.units, line.amount_nanos)
                                    for line in lines}))
            return out

    def only_charge(self, request_id: str) -> Charged:
        charges = self.charges(request_id)
        assert len(charges) == 1, f"request {request_id}: {len(charges)} charges"
        return charges[0]

    def entries(self) -> int:
        with self._session() as s:
            return s.exec(select(func.count()).select_from(LedgerEntry)).one()

    def balance_nanos(self, account_id: str | None = None) -> int:
        with self._session() as s:
            account = s.get(Account, account_id or self.gateway.account_id)
            return account.usd_balance_nanos + account.diem_balance_nanos

    def held(self, request_id: str) -> int | None:
        """What the open hold of a request holds (None: it has none)."""
        with self._session() as s:
            hold = s.get(Reservation, request_id)
            return None if hold is None else hold.usd_nanos + hold.diem_nanos

    def open_holds(self) -> int:
        with self._session() as s:
            return s.exec(select(func.count()).select_from(Reservation)).one()

    def close(self) -> None:
        self._engine.dispose()

    def usage_history(self, request_id: str) -> list[dict]:
        """The account's usage-history lines of a request, as the billing API lists them."""
        resp = self.gateway.client.get("/api/v1/billing/usage-history",
                                       headers=self.gateway.auth())
        assert resp.status_code == 200, resp.text
        return [line for line in resp.json()["data"]
                if (line["inferenceDetails"] or {}).get("requestId") == request_id]
