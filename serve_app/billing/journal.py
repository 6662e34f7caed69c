"""The journal of every balance change, and the audit that recomputes balances from it.

Every change to an account's balance is an immutable entry with a kind and a source (Stripe's
balance transactions): the charges are the ledger's own rows (`ledger_entries`, one per
settled request, with the USD and DIEM it took); every other kind (the opening balance,
operator grants, x402 top-ups, each epoch's DIEM allocation and the DIEM that expired unspent)
is a row of `balance_entries`, written in the transaction that changes the balance columns.
The columns are a cache: an account's USD (and DIEM) is the sum of its journal less what its
open holds (`reservations`) keep aside for requests in flight. A hold and its release are not
entries: they move money between the balance and the holds, and a settlement turns what it
charges into the charge's entry.

Why the charges are not copied here: they settle through the group-commit writer
(billing/writer.py), hundreds a second per replica, and their ledger row already says what
each moved; a second row per charge would add an insert (and an index write) to the hottest
transaction for nothing an auditor could not read from the ledger. The other kinds are rare
(an operator's grant, a payment, one allocation per account and UTC day), so they cost the
request path nothing but one insert on an account's first request of a day.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text, update
from sqlmodel import Session

from serve_app.billing.ledger import Balances
from serve_app.db.tables import Account, BalanceEntry, EntryKind, utcnow


def operator_name() -> str:
    """Who runs `inference-admin` (the OS user): the actor of a grant without `--actor`."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's user without a passwd entry
        return f"uid:{os.getuid()}"


def add_entry(session: Session, account_id: str, kind: EntryKind, *, usd_nanos: int = 0,
              diem_nanos: int = 0, source: str | None = None, reason: str | None = None,
              actor: str | None = None, now: datetime | None = None) -> Balances:
    """Write an entry and move the account's balance by it, in the caller's transaction (the
    caller commits); the balance after it."""
    moved = session.execute(
        update(Account).where(Account.id == account_id)
        .values(usd_balance_nanos=Account.usd_balance_nanos + usd_nanos,
                diem_balance_nanos=Account.diem_balance_nanos + diem_nanos)
        .returning(Account.usd_balance_nanos, Account.diem_balance_nanos)).first()
    if moved is None:
        raise LookupError(f"no account {account_id!r}")
    session.add(BalanceEntry(account_id=account_id, kind=kind.value, usd_nanos=usd_nanos,
                             diem_nanos=diem_nanos, source=source, reason=reason, actor=actor,
                             created_at=now or utcnow()))
    session.flush()
    return Balances(int(moved[0]), int(moved[1]))


@dataclass(frozen=True, slots=True)
class AccountAudit:
    """One account's balance columns beside what its journal and open holds say they are."""

    account_id: str
    usd_balance_nanos: int
    diem_balance_nanos: int
    usd_journal_nanos: int  # entries plus charges (negative)
    diem_journal_nanos: int
    usd_held_nanos: int
    diem_held_nanos: int

    @property
    def usd_expected_nanos(self) -> int:
        return self.usd_journal_nanos - self.usd_held_nanos

    @property
    def diem_expected_nanos(self) -> int:
        return self.diem_journal_nanos - self.diem_held_nanos

    @property
    def agrees(self) -> bool:
        return (self.usd_balance_nanos == self.usd_expected_nanos
                and self.diem_balance_nanos == self.diem_expected_nanos)

    def as_dict(self) -> dict:
        return {"account": self.account_id,
                "usdBalanceNanos": self.usd_balance_nanos,
                "usdFromJournalNanos": self.usd_expected_nanos,
                "diemBalanceNanos": self.diem_balance_nanos,
                "diemFromJournalNanos": self.diem_expected_nanos,
                "usdHeldNanos": self.usd_held_nanos, "diemHeldNanos": self.diem_held_nanos}


# One statement, so that it reads one snapshot of the database (both SQLite and PostgreSQL
# give a statement a consistent view) while requests keep settling.
_AUDIT = text("""
SELECT a.id, a.usd_balance_nanos, a.diem_balance_nanos,
       COALESCE(j.usd, 0) - COALESCE(c.usd, 0), COALESCE(j.diem, 0) - COALESCE(c.diem, 0),
       COALESCE(h.usd, 0), COALESCE(h.diem, 0)
FROM accounts a
LEFT JOIN (SELECT account_id, SUM(usd_nanos) AS usd, SUM(diem_nanos) AS diem
           FROM balance_entries GROUP BY account_id) j ON j.account_id = a.id
LEFT JOIN (SELECT account_id, SUM(usd_nanos) AS usd, SUM(diem_nanos) AS diem
           FROM ledger_entries GROUP BY account_id) c ON c.account_id = a.id
LEFT JOIN (SELECT account_id, SUM(usd_nanos) AS usd, SUM(diem_nanos) AS diem
           FROM reservations GROUP BY account_id) h ON h.account_id = a.id
ORDER BY a.created_at, a.id
""")


def audit(session: Session) -> list[AccountAudit]:
    """Every account's balances recomputed from its journal and open holds."""
    return [AccountAudit(row[0], *(int(value) for value in row[1:]))
            for row in session.execute(_AUDIT)]


def differing(session: Session) -> list[AccountAudit]:
    """The accounts whose balance columns are not what their journal says."""
    return [account for account in audit(session) if not account.agrees]
