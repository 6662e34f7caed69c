"""`GET /billing/usage-analytics`, computed from the daily rollups (never the ledger), with the
grouping done by the database: a few small grouped queries over at most days x keys x models x
line types rollup rows, whatever the number of requests behind them."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlmodel import Session, col

from serve_app.billing.pricing import ANALYTICS_MODEL_TYPE, LINE_TYPES, unit_type_of
from serve_app.db.tables import ApiKey, UsageDaily
from serve_app.models.catalog import Catalog
from serve_app.money import as_number

TOP = 8


def _ms(day: date) -> int:
    return int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)


def _num(nanos: int | None) -> float | int:
    return as_number(int(nanos or 0)) or 0


def _day(value: date | str) -> date:
    """SQLite hands grouped dates back as text."""
    return value if isinstance(value, date) else date.fromisoformat(value)


def _unique_labels(labels: dict[str, str]) -> dict[str, str]:
    counts: dict[str, int] = defaultdict(int)
    for label in labels.values():
        counts[label] += 1
    return {key: label if counts[label] == 1 else f"{label} ({key[-6:]})"
            for key, label in labels.items()}


def usage_analytics(session: Session, catalog: Catalog, account_id: str, first: date,
                    last: date, label: str) -> dict[str, Any]:
    u = UsageDaily
    in_range = (u.account_id == account_id, u.day >= first, u.day <= last)
    usd, diem, units = func.sum(u.usd_nanos), func.sum(u.diem_nanos), func.sum(u.units)

    def grouped(*columns):
        return session.execute(select(*columns, usd, diem, units).where(*in_range)
                               .group_by(*columns)).all()

    days = [last - timedelta(days=i) for i in range((last - first).days + 1)]
    by_day = {d: (0, 0) for d in days}
    for day, d_usd, d_diem, _ in grouped(u.day):
        by_day[_day(day)] = (d_usd, d_diem)

    models: dict[str, dict[str, Any]] = {}
    for model_id, model_type, line_type, m_usd, m_diem, m_units in grouped(
            u.model_id, u.model_type, u.line_type):
        m = models.setdefault(model_id, {"usd": 0, "diem": 0, "units": 0, "types": {},
                                         "model_type": model_type})
        m["usd"] += m_usd
        m["diem"] += m_diem
        m["units"] += m_units
        m["types"][line_type] = (m_usd, m_diem, m_units)
    ranked_models = sorted(models.items(), key=lambda kv: -(kv[1]["usd"] + kv[1]["diem"]))
    top_models = [model_id for model_id, _ in ranked_models[:TOP]]

    keys = sorted(grouped(u.api_key_id), key=lambda row: -(row[1] + row[2]))
    top_keys = [row[0] for row in keys[:TOP]]
    key_ids = [row[0] for row in keys if row[0]]
    descriptions = dict(session.execute(select(ApiKey.id, ApiKey.description).where(
        col(ApiKey.id).in_(key_ids))).all()) if key_ids else {}

    def daily(column, ids: list[str]) -> dict[date, dict[str, tuple[int, int]]]:
        """day -> id -> (USD, DIEM) of the top models or keys."""
        series: dict[date, dict[str, tuple[int, int]]] = defaultdict(dict)
        if ids:
            for day, item, d_usd, d_diem, _ in session.execute(
                    select(u.day, column, usd, diem, units)
                    .where(*in_range, col(column).in_(ids)).group_by(u.day, column)).all():
                series[_day(day)][item] = (d_usd, d_diem)
        return series

    model_daily = daily(u.model_id, top_models)  # the spec's series: DIEM usage
    key_daily = daily(u.api_key_id, top_keys)  # spend, USD and DIEM

    def name_of(model_id: str) -> str:
        model = catalog.by_id.get(model_id)
        return model.name if model else model_id

    def raw_key_label(key_id: str) -> str:
        if not key_id:
            return "Web App"
        return descriptions.get(key_id) or key_id

    # The daily series are keyed by label: two keys (or models) of one name get their ids.
    key_labels = _unique_labels({k: raw_key_label(k) for k, *_ in keys})
    model_labels = _unique_labels({m: name_of(m) for m in models})

    by_model = []
    for model_id, m in ranked_models:
        entry: dict[str, Any] = {
            # by the model type recorded with the usage: crypto RPC and retired models are not
            # in the catalog
            "modelName": model_labels[model_id], "unitType": unit_type_of(m["model_type"]),
            "modelType": ANALYTICS_MODEL_TYPE.get(m["model_type"]),
            "totalUsd": _num(m["usd"]), "totalDiem": _num(m["diem"]), "totalUnits": m["units"]}
        if len(m["types"]) > 1:
            entry["breakdown"] = [
                {"type": LINE_TYPES[t][3], "usd": _num(v[0]), "diem": _num(v[1]), "units": v[2]}
                for t, v in sorted(m["types"].items(), key=lambda kv: -(kv[1][0] + kv[1][1]))]
        by_model.append(entry)

    return {
        "lookback": label,
        "byDate": [{"date": f"{d.isoformat()}T00:00:00.000Z", "USD": _num(by_day[d][0]),
                    "DIEM": _num(by_day[d][1])} for d in days],
        "byModel": by_model,
        "byModelDaily": [{"date": _ms(d), **{model_labels[m]: _num(model_daily[d].get(m, (0, 0))[1])
                                             for m in top_models}} for d in reversed(days)],
        "topModels": [model_labels[m] for m in top_models],
        "byKey": [{"apiKeyId": key_id or None, "description": key_labels[key_id],
                   "totalUsd": _num(k_usd), "totalDiem": _num(k_diem), "totalUnits": k_units}
                  for key_id, k_usd, k_diem, k_units in keys],
        "byKeyDaily": [{"date": _ms(d), **{key_labels[k]: _num(sum(key_daily[d].get(k, (0, 0))))
                                           for k in top_keys}} for d in reversed(days)],
        "topKeyNames": [key_labels[k] for k in top_keys],
    }
