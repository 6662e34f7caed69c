"""`/billing/*`: balance, usage history (JSON or CSV), usage analytics; ADMIN keys only."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Literal

from fastapi import Query, Request, Response
from sqlmodel import Session

from serve_app.accounts.provisioning import CURSOR_SECRET, ensure_secret
from serve_app.api.deps import AdminKey, Context, Services, run_db
from serve_app.api.guarded_route import guarded_router
from serve_app.billing import ledger
from serve_app.billing.analytics import usage_analytics
from serve_app.billing.history import Walk, decode_cursor, encode_cursor, line_record, page, to_csv
from serve_app.errors import ApiError, invalid_request
from serve_app.http.render import json_response
from serve_app.money import as_number
from serve_app.pipeline import respond

router = guarded_router(prefix="/billing", tags=["Billing"])

MAX_LOOKBACK_DAYS = 90


@router.get("/balance", summary="Current balances")
async def get_balance(ctx: Context, key: AdminKey, services: Services) -> Response:
    now = services.billing.clock()
    found, staked = await run_db(services, lambda s: ledger.balances(s, key.account_id, now))
    usd, diem = found.usd_nanos, found.diem_nanos
    currency = "DIEM" if diem > 0 else "USD" if usd > 0 else None
    return json_response(ctx, {
        "canConsume": usd + diem > 0,
        "consumptionCurrency": currency,
        "balances": {"diem": as_number(diem) if staked else None, "usd": as_number(usd)},
        "diemEpochAllocation": staked,
    })


@router.get("/usage", summary="Sunset: use GET /billing/usage-history")
async def usage_sunset() -> Response:
    raise ApiError(410, "GET /api/v1/billing/usage was sunset on 2026-09-16: use GET "
                        "/api/v1/billing/usage-history, with pageSize and the nextCursor of "
                        "each response in place of page and limit, and startTimestamp and "
                        "endTimestamp in place of startDate and endDate",
                   headers={"Deprecation": "@1783555200",
                            "Link": '</api/v1/billing/usage-history>; rel="successor-version"',
                            "Sunset": "Wed, 16 Sep 2026 00:00:00 GMT"})


@router.get("/usage-history", summary="Usage history, cursor-paged (JSON or CSV)")
async def usage_history(
    request: Request, ctx: Context, key: AdminKey, services: Services,
    cursor: Annotated[str | None, Query(max_length=512, pattern=r"^[A-Za-z0-9_-]+$")] = None,
    pageSize: Annotated[int | None, Query(ge=10, le=1000)] = None,
    startTimestamp: datetime | None = None,
    endTimestamp: datetime | None = None,
    currency: Literal["USD", "DIEM", "BUNDLED_CREDITS"] | None = None,
) -> Response:
    now = services.billing.clock()
    secret = (await run_db(services, lambda s: ensure_secret(s, CURSOR_SECRET))).encode()
    if cursor is not None:
        given = [n for n, v in (("pageSize", pageSize), ("startTimestamp", startTimestamp),
                                ("endTimestamp", endTimestamp), ("currency", currency))
                 if v is not None]
        if given:
            raise invalid_request("A cursor carries the filters of its walk: send it alone",
                                  given[0])
        walk = decode_cursor(secret, key.account_id, cursor, now)
    else:
        start = _utc(startTimestamp, "startTimestamp")
        end = _utc(endTimestamp, "endTimestamp")
        if start and end and end <= start:
            raise invalid_request("endTimestamp must be later than startTimestamp",
                                  "endTimestamp")
        walk = Walk(page_size=pageSize or 1000, start=start, end=end, currency=currency)
    lines, more = await run_db(services, lambda s: page(s, key.account_id, walk))
    next_cursor = None
    if more:
        last = lines[-1]
        next_cursor = encode_cursor(secret, key.account_id, Walk(
            walk.page_size, walk.start, walk.end, walk.currency,
            after=(last.created_at, last.id)), now)
    records = [line_record(line) for line in lines]
    if "text/csv" in request.headers.get("accept", ""):
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")[:-3] + "Z"
        headers = {"Content-Disposition":
                   f"attachment; filename=billing-usage-history-{stamp}.csv"}
        respond.next_cursor_header(ctx, next_cursor)
        return Response(to_csv(records), media_type="text/csv", headers=headers)
    return json_response(ctx, {"data": records, "nextCursor": next_cursor}, compress=True)


def _utc(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        raise invalid_request(f"{field} must be an ISO 8601 UTC time with a Z suffix", field)
    return value.astimezone(UTC)


_LOOKBACK = re.compile(r"^[1-9]\d*d$")


def _analytics_range(lookback: str | None, start: str | None, end: str | None,
                     today: date) -> tuple[date, date, str]:
    if start is not None or end is not None:
        if start is None or end is None:
            missing = "startDate" if start is None else "endDate"
            raise invalid_request("startDate and endDate must be given together", missing)
        try:
            first, last = date.fromisoformat(start), date.fromisoformat(end)
        except ValueError as exc:
            raise invalid_request("Dates must be YYYY-MM-DD",
                                  "startDate" if "start" in str(exc) else "endDate") from exc
        if last < first:
            raise invalid_request("endDate must not be before startDate", "endDate")
        if (last - first).days + 1 > MAX_LOOKBACK_DAYS:
            raise invalid_request(f"The range may span at most {MAX_LOOKBACK_DAYS} days",
                                  "startDate")
        return first, last, f"{start}:{end}"
    lookback = lookback or "7d"
    if not _LOOKBACK.fullmatch(lookback):
        raise invalid_request("lookback must be a positive number of days such as '7d'",
                              "lookback")
    days = int(lookback[:-1])
    if days > MAX_LOOKBACK_DAYS:
        raise invalid_request(f"lookback may be at most {MAX_LOOKBACK_DAYS}d", "lookback")
    return today - timedelta(days=days - 1), today, lookback


@router.get("/usage-analytics", summary="Usage analytics (beta; cached 10 minutes)")
async def get_usage_analytics(
    ctx: Context, key: AdminKey, services: Services,
    lookback: Annotated[str | None, Query(max_length=8)] = None,
    startDate: Annotated[str | None, Query(pattern=r"^\d{4}-\d{2}-\d{2}$")] = None,
    endDate: Annotated[str | None, Query(pattern=r"^\d{4}-\d{2}-\d{2}$")] = None,
) -> Response:
    today = services.billing.clock().astimezone(UTC).date()
    first, last, label = _analytics_range(lookback, startDate, endDate, today)
    cache_key = (key.account_id, f"{label}@{today}")
    result = services.billing.analytics_cache.get(cache_key)
    if result is None:
        def compute(session: Session) -> dict:
            return usage_analytics(session, services.catalog, key.account_id, first, last, label)

        result = await run_db(services, compute)
        services.billing.analytics_cache[cache_key] = result
    return json_response(ctx, result, compress=True)
