"""`GET /billing/usage-analytics`, computed from the daily rollups (never the ledger): 90 days
of a busy account are at most days x keys x models x line types rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlmodel import Session, select

from serve_app.billing.pricing import ANALYTICS_MODEL_TYPE, LINE_TYPES, unit_type
from serve_app.catalog import Catalog
from serve_app.db.tables import ApiKey, UsageDaily
from serve_app.money import as_number

TOP = 8


def _ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


def _num(nanos: int) -> float | int:
    return as_number(nanos) or 0


def usage_analytics(session: Session, catalog: Catalog, account_id: str, first: date,
                    last: date, label: str) -> dict[str, Any]:
    rows = session.exec(select(UsageDaily).where(
        UsageDaily.account_id == account_id, UsageDaily.day >= first,
        UsageDaily.day <= last)).all()
    key_ids = {r.api_key_id for r in rows if r.api_key_id}
    descriptions = {k.id: k.description for k in session.exec(
        select(ApiKey).where(ApiKey.id.in_(key_ids))).all()} if key_ids else {}

    days = [last - timedelta(days=i) for i in range((last - first).days + 1)]
    by_day: dict[date, list[int]] = {d: [0, 0] for d in days}
    models: dict[str, dict[str, Any]] = {}
    keys: dict[str, dict[str, Any]] = {}
    model_daily: dict[date, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    key_daily: dict[date, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        by_day[r.day][0] += r.usd_nanos
        by_day[r.day][1] += r.diem_nanos
        m = models.setdefault(r.model_id, {"usd": 0, "diem": 0, "units": 0, "types": {},
                                           "model_type": r.model_type})
        m["usd"] += r.usd_nanos
        m["diem"] += r.diem_nanos
        m["units"] += r.units
        t = m["types"].setdefault(r.line_type, [0, 0, 0])
        t[0] += r.usd_nanos
        t[1] += r.diem_nanos
        t[2] += r.units
        k = keys.setdefault(r.api_key_id, {"usd": 0, "diem": 0, "units": 0})
        k["usd"] += r.usd_nanos
        k["diem"] += r.diem_nanos
        k["units"] += r.units
        model_daily[r.day][r.model_id] += r.diem_nanos
        key_daily[r.day][r.api_key_id] += r.usd_nanos + r.diem_nanos

    def name_of(model_id: str) -> str:
        model = catalog.by_id.get(model_id)
        return model.name if model else model_id

    def unit_of(model_id: str) -> str:
        model = catalog.by_id.get(model_id)
        return unit_type(model) if model is not None else "tokens"

    by_model = []
    for model_id, m in sorted(models.items(), key=lambda kv: -(kv[1]["usd"] + kv[1]["diem"])):
        entry: dict[str, Any] = {
            "modelName": name_of(model_id), "unitType": unit_of(model_id),
            "modelType": ANALYTICS_MODEL_TYPE.get(m["model_type"]),
            "totalUsd": _num(m["usd"]), "totalDiem": _num(m["diem"]), "totalUnits": m["units"]}
        if len(m["types"]) > 1:
            entry["breakdown"] = [
                {"type": LINE_TYPES[t][3], "usd": _num(v[0]), "diem": _num(v[1]), "units": v[2]}
                for t, v in sorted(m["types"].items(), key=lambda kv: -(kv[1][0] + kv[1][1]))]
        by_model.append((model_id, entry))
    top_models = [model_id for model_id, _ in by_model[:TOP]]

    def key_label(key_id: str) -> str:
        return descriptions.get(key_id) or key_id if key_id else "Web App"

    by_key = [({"apiKeyId": key_id or None, "description": key_label(key_id),
                "totalUsd": _num(k["usd"]), "totalDiem": _num(k["diem"]),
                "totalUnits": k["units"]}, key_id)
              for key_id, k in sorted(keys.items(), key=lambda kv: -(kv[1]["usd"] + kv[1]["diem"]))]
    top_keys = [key_id for _, key_id in by_key[:TOP]]

    return {
        "lookback": label,
        "byDate": [{"date": f"{d.isoformat()}T00:00:00.000Z", "USD": _num(by_day[d][0]),
                    "DIEM": _num(by_day[d][1])} for d in days],
        "byModel": [entry for _, entry in by_model],
        "byModelDaily": [{"date": _ms(d), **{name_of(m): _num(model_daily[d].get(m, 0))
                                             for m in top_models}} for d in reversed(days)],
        "topModels": [name_of(m) for m in top_models],
        "byKey": [entry for entry, _ in by_key],
        "byKeyDaily": [{"date": _ms(d), **{key_label(k): _num(key_daily[d].get(k, 0))
                                           for k in top_keys}} for d in reversed(days)],
        "topKeyNames": [key_label(k) for k in top_keys],
    }
