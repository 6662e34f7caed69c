"""`GET /billing/usage-history`: the ledger lines of an account, walked with signed cursors.

A cursor carries the walk's position and filters, the account it was issued to and its issue
time, signed with a server secret: a cursor that was tampered with, issued to another account
or older than a day is refused (400). Lines are walked in (timestamp, id) order, so pages stay
stable while new usage is recorded.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import hmac
import io
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_
from sqlmodel import Session, select

from serve_app.billing.pricing import LINE_TYPES
from serve_app.db.tables import LedgerLine, as_utc, iso_z
from serve_app.errors import invalid_request
from serve_app.money import as_number

CURSOR_MAX_AGE = timedelta(days=1)
_SIG_BYTES = 16
CSV_COLUMNS = ["timestamp", "sku", "units", "pricePerUnitUsd", "amount", "currency", "notes",
               "requestId", "promptTokens", "completionTokens", "inferenceExecutionTime"]


@dataclass(frozen=True)
class Walk:
    """Filters of a walk and where it stands."""

    page_size: int
    start: datetime | None = None
    end: datetime | None = None
    currency: str | None = None
    after: tuple[datetime, int] | None = None  # the last line returned


def encode_cursor(secret: bytes, account_id: str, walk: Walk, now: datetime) -> str:
    assert walk.after is not None
    payload = {"a": account_id, "t": int(now.timestamp()), "n": walk.page_size,
               "s": iso_z(walk.start) if walk.start else None,
               "e": iso_z(walk.end) if walk.end else None, "c": walk.currency,
               # The position keeps microseconds: the ledger's times have them.
               "p": [as_utc(walk.after[0]).isoformat(), walk.after[1]]}
    raw = json.dumps(payload, separators=(",", ":")).encode()
    sig = hmac.new(secret, raw, hashlib.sha256).digest()[:_SIG_BYTES]
    return base64.urlsafe_b64encode(sig + raw).decode().rstrip("=")


def decode_cursor(secret: bytes, account_id: str, cursor: str, now: datetime) -> Walk:
    refused = invalid_request("Invalid or expired cursor: restart the walk from the first page",
                              "cursor")
    try:
        blob = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        sig, raw = blob[:_SIG_BYTES], blob[_SIG_BYTES:]
        if not hmac.compare_digest(sig, hmac.new(secret, raw, hashlib.sha256).digest()[
                :_SIG_BYTES]):
            raise refused
        payload = json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise refused from exc
    issued = datetime.fromtimestamp(payload["t"], tz=now.tzinfo)
    if payload["a"] != account_id or now - issued > CURSOR_MAX_AGE:
        raise refused
    parse = datetime.fromisoformat
    return Walk(page_size=payload["n"],
                start=parse(payload["s"]) if payload["s"] else None,
                end=parse(payload["e"]) if payload["e"] else None,
                currency=payload["c"],
                after=(parse(payload["p"][0]), int(payload["p"][1])))


def page(session: Session, account_id: str, walk: Walk) -> tuple[list[LedgerLine], bool]:
    """One page of lines and whether more follow."""
    query = select(LedgerLine).where(LedgerLine.account_id == account_id)
    if walk.start is not None:
        query = query.where(LedgerLine.created_at >= walk.start)
    if walk.end is not None:
        query = query.where(LedgerLine.created_at < walk.end)
    if walk.currency is not None:
        query = query.where(LedgerLine.currency == walk.currency)
    if walk.after is not None:
        at, line_id = walk.after
        query = query.where(or_(LedgerLine.created_at > at,
                                and_(LedgerLine.created_at == at, LedgerLine.id > line_id)))
    rows = session.exec(query.order_by(LedgerLine.created_at, LedgerLine.id)
                        .limit(walk.page_size + 1)).all()
    return list(rows[:walk.page_size]), len(rows) > walk.page_size


def line_record(line: LedgerLine) -> dict[str, Any]:
    scale = LINE_TYPES[line.line_type][1]
    tokens = line.prompt_tokens is not None or line.completion_tokens is not None
    return {
        "amount": -(as_number(line.amount_nanos) or 0),
        "currency": line.currency,
        "inferenceDetails": {
            "completionTokens": line.completion_tokens,
            "inferenceExecutionTime": line.execution_ms,
            "promptTokens": line.prompt_tokens,
            "requestId": line.request_id,
        } if tokens else None,
        "notes": "API Inference",
        "pricePerUnitUsd": line.price_per_unit_usd,
        "sku": line.sku,
        "timestamp": iso_z(line.created_at),
        "units": line.units / scale,
    }


def to_csv(records: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for r in records:
        details = r["inferenceDetails"] or {}
        writer.writerow([r["timestamp"], r["sku"], r["units"], r["pricePerUnitUsd"],
                         r["amount"], r["currency"], r["notes"], details.get("requestId", ""),
                         details.get("promptTokens", ""), details.get("completionTokens", ""),
                         details.get("inferenceExecutionTime", "")])
    return out.getvalue()
