"""After a load run: does the ledger agree, to the nano-unit, with what clients were told and
with the money that moved?

- every request a client saw succeed has exactly one ledger entry, and no entry exists for a
  request the client saw fail;
- for token routes, the entry's units are the usage the client was shown;
- the account's balance moved by exactly the ledger's total, the ledger's lines and daily
  rollups add up to its entries;
- no hold is left open (after the grace time in-flight work needs);
- no key spent past its consumption limit;
- a background response or resumable chat stream is charged once, under the request that
  created it, whether its stream was read, cut and resumed, or polled; reading it (polls,
  resumes, cancel, delete) is charged nothing. One the client cut short (cancelled, failed)
  may have no entry: the model may have made nothing before it stopped;
- and, over every account, `inference-admin audit`: each balance is the sum of its journal
  (credits, top-ups, charges, DIEM) less its open holds (`audit_books`).

    python loadtest/reconcile.py ACCOUNT_ID RECORD.jsonl START_BALANCE_NANOS [WALLET]
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from sqlalchemy import func, select
from sqlmodel import Session

from serve_app.billing.journal import differing
from serve_app.db.engine import make_engine
from serve_app.db.tables import (
    Account,
    ApiKey,
    KeySpendWindow,
    LedgerEntry,
    LedgerLine,
    Reservation,
    UsageDaily,
)
from serve_app.settings import Settings

TOKEN_ROUTES = {"chat", "embeddings", "responses"}


def reconcile(account_id: str, record_path: str, start_nanos: int,
              wallet: str | None = None, payer: str | None = None) -> dict[str, Any]:
    """The answers of one payer: the account's keys (`wallet` None), or one wallet, whose
    credit lives in an account of its own (`account_id`); `payer`: the label of another
    account's answers (the heavy tenant of the two-tenant mix)."""
    with open(record_path, encoding="utf-8") as lines:
        seen = [answer for answer in map(json.loads, filter(str.strip, lines))
                if answer.get("wallet") == wallet and answer.get("payer") == payer]
    # a stream is recorded when it starts and again, with its usage, when it ends: the last
    # line of a request is what its client saw
    reads = {r["cf_ray"] for r in seen if r.get("read") and r["cf_ray"]}
    seen = list({r["cf_ray"] or f"no-id-{i}": r for i, r in enumerate(seen)
                 if not r.get("read")}.values())
    ok = {r["cf_ray"]: r for r in seen if r["status"] == 200 and r["cf_ray"]}
    failed = {r["cf_ray"] for r in seen if r["status"] != 200 and r["cf_ray"]}
    maybe = {request_id for request_id, r in ok.items() if r.get("charge") == "maybe"}
    engine = make_engine(Settings().resolved_database_url)
    with Session(engine) as s:
        entries = {e.request_id: e for e in s.exec(
            select(LedgerEntry).where(LedgerEntry.account_id == account_id)).scalars()}
        total = sum(e.usd_nanos + e.diem_nanos for e in entries.values())
        lines = s.exec(select(func.coalesce(func.sum(LedgerLine.amount_nanos), 0))
                       .where(LedgerLine.account_id == account_id)).one()[0]
        rollups = s.exec(select(func.coalesce(func.sum(UsageDaily.usd_nanos
                                                       + UsageDaily.diem_nanos), 0))
                         .where(UsageDaily.account_id == account_id)).one()[0]
        account = s.get(Account, account_id)
        holds = s.exec(select(func.count()).select_from(Reservation)
                       .where(Reservation.account_id == account_id)).one()[0]
        over_limit = []
        for key, window in s.exec(select(ApiKey, KeySpendWindow).join(
                KeySpendWindow, KeySpendWindow.api_key_id == ApiKey.id).where(
                ApiKey.account_id == account_id)).all():
            if key.limit_usd_nanos is not None and window.usd_nanos > key.limit_usd_nanos:
                over_limit.append(key.id)
    engine.dispose()
    missing = sorted(set(ok) - set(entries) - maybe)
    unexpected = sorted(set(entries) - set(ok))
    charged_after_failure = sorted(set(entries) & failed)
    charged_reads = sorted(set(entries) & reads)
    wrong_units = []
    for request_id, answer in ok.items():
        entry = entries.get(request_id)
        if entry is None or answer["route"] not in TOKEN_ROUTES or not answer["usage"]:
            continue
        units = entry.units if isinstance(entry.units, dict) else json.loads(entry.units)
        if units.get("input", 0) != answer["usage"].get("prompt_tokens", 0) or \
                units.get("output", 0) != answer["usage"].get("completion_tokens", 0):
            wrong_units.append(request_id)
    moved = start_nanos - (account.usd_balance_nanos + account.diem_balance_nanos)
    result = {
        "requests_seen": len(seen), "succeeded": len(ok), "ledger_entries": len(entries),
        "statuses": dict(Counter(r["status"] for r in seen)),
        "ledger_usd": total / 1e9, "balance_moved_usd": moved / 1e9,
        "missing_entries": len(missing), "entries_without_success": len(unexpected),
        "charged_after_failure": len(charged_after_failure), "wrong_units": len(wrong_units),
        "lines_match": lines == total, "rollups_match": rollups == total,
        "balance_matches": moved == total, "open_holds": holds,
        "keys_over_limit": len(over_limit),
    }
    background = {request_id: r for request_id, r in ok.items() if r.get("response_id")}
    if background or reads:
        result["background"] = {
            "created": len(background),
            "ended": dict(Counter(r.get("final", "-") for r in background.values())),
            "charged": len(set(background) & set(entries)),
            "cut_short_uncharged": len(maybe - set(entries)),
            "reads": len(reads), "charged_reads": len(charged_reads),
        }
    result["reconciled"] = (not missing and not unexpected and not wrong_units
                            and lines == total and rollups == total and moved == total
                            and holds == 0 and not over_limit and not charged_reads)
    return result


def audit_books() -> dict[str, Any]:
    """`inference-admin audit` of the run's database: the accounts whose balance is not their
    journal's sum less their open holds."""
    engine = make_engine(Settings().resolved_database_url)
    try:
        with Session(engine) as s:
            wrong = [account.as_dict() for account in differing(s)]
    finally:
        engine.dispose()
    return {"ok": not wrong, "differing": wrong}


if __name__ == "__main__":
    print(json.dumps(reconcile(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                               *(sys.argv[4:5])), indent=2))
