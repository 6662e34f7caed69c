"""`/billing/*` and `/characters` on the in-process gateway, against a ledger the test fills."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from serve_app.billing.ledger import Payer
from serve_app.billing.pricing import price
from serve_app.billing.service import Billing
from serve_app.cli import run as cli
from serve_app.errors import ApiError
from serve_app.models.catalog import CatalogModel
from serve_app.money import to_nanos
from serve_app.pipeline.admission import check_privacy

TEXT = CatalogModel(id="chat-a", type="text", name="Chat A", deployment="text-xs",
                    engine="vllm", size_class="XS",
                    pricing={"input": {"usd": 0.5}, "output": {"usd": 1.0}})
EMBED = CatalogModel(id="embed-b", type="embedding", name="Embed B", deployment="embedding",
                     engine="st", pricing={"input": {"usd": 0.1}})


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _fill(gateway, entries: list[tuple[datetime, str | None, CatalogModel, dict]]) -> None:
    """Charge the gateway's account through the billing service, one entry per request."""
    url = gateway.services.settings.resolved_database_url

    async def main():
        clock = Clock(entries[0][0])
        billing = Billing(url, clock=clock)
        try:
            for i, (when, key_id, model, units) in enumerate(entries):
                clock.now = when
                payer = Payer(gateway.account_id, api_key_id=key_id)
                hold = await billing.hold(f"fill-{i}-{when.timestamp()}", payer, to_nanos(5))
                await billing.settle(hold, price(model, units))
        finally:
            billing.close()

    asyncio.run(main())


def test_billing_routes_need_an_admin_key(gateway):
    inference = gateway.create_key()["apiKey"]
    for path in ("/billing/balance", "/billing/usage-history", "/billing/usage-analytics"):
        resp = gateway.client.get(f"/api/v1{path}", headers=gateway.auth(inference))
        assert resp.status_code == 401
        assert resp.json()["error"] == "Admin API key required"


def test_balance_answers_the_published_shape_and_headers_carry_it(gateway):
    resp = gateway.client.get("/api/v1/billing/balance", headers=gateway.auth())
    assert resp.status_code == 200
    assert resp.json() == {"canConsume": True, "consumptionCurrency": "USD",
                           "balances": {"diem": None, "usd": 10},
                           "diemEpochAllocation": 0}
    assert resp.headers["x-service-balance-usd"] == "10"
    assert resp.headers["x-service-balance-diem"] == "0"


def test_usage_is_sunset_with_410_naming_the_replacement(gateway):
    resp = gateway.client.get("/api/v1/billing/usage", headers=gateway.auth())
    assert resp.status_code == 410
    assert "/billing/usage-history" in resp.json()["error"]
    assert "successor-version" in resp.headers["link"]


def test_usage_history_walks_every_line_once_with_cursors(gateway):
    now = datetime.now(UTC)  # microseconds matter: a page must not end mid-millisecond
    _fill(gateway, [(now - timedelta(minutes=30 - i, microseconds=137 * i), None, TEXT,
                     {"input": 1000 + i, "output": 10}) for i in range(25)])
    seen, cursor, pages = [], None, 0
    while True:
        params = {"cursor": cursor} if cursor else {"pageSize": 10}
        resp = gateway.client.get("/api/v1/billing/usage-history", params=params,
                                  headers=gateway.auth())
        assert resp.status_code == 200, resp.text
        body = resp.json()
        seen += body["data"]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert pages == 5 and len(seen) == 50  # 25 requests x (input, output) lines
    lines = {(r["inferenceDetails"]["requestId"], r["sku"]) for r in seen}
    assert len(lines) == 50  # no line twice across page boundaries
    stamps = [r["timestamp"] for r in seen]
    assert stamps == sorted(stamps)
    first = seen[0]
    assert first["currency"] == "USD" and first["notes"] == "API Inference"
    assert first["sku"] == "chat-a-llm-input-mtoken" and first["pricePerUnitUsd"] == 0.5
    assert first["units"] == pytest.approx(0.001)
    assert first["amount"] == pytest.approx(-0.0005)
    assert first["inferenceDetails"]["promptTokens"] == 1000


def test_usage_history_refuses_bad_cursors_and_mixed_filters(gateway):
    now = datetime.now(UTC)
    _fill(gateway, [(now - timedelta(minutes=i), None, TEXT, {"input": 10, "output": 10})
                    for i in range(8)])
    first = gateway.client.get("/api/v1/billing/usage-history", params={"pageSize": 10},
                               headers=gateway.auth()).json()
    cursor = first["nextCursor"]
    assert cursor
    tampered = cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB")
    for params in ({"cursor": tampered}, {"cursor": cursor, "pageSize": 20}):
        resp = gateway.client.get("/api/v1/billing/usage-history", params=params,
                                  headers=gateway.auth())
        assert resp.status_code == 400
        assert resp.json()["details"]
    resp = gateway.client.get("/api/v1/billing/usage-history", params={"pageSize": 5},
                              headers=gateway.auth())
    assert resp.status_code == 400 and "pageSize" in resp.json()["details"]
    resp = gateway.client.get(
        "/api/v1/billing/usage-history",
        params={"startTimestamp": "2026-02-01T00:00:00Z", "endTimestamp": "2026-01-01T00:00:00Z"},
        headers=gateway.auth())
    assert resp.status_code == 400


def test_usage_history_filters_by_time_and_exports_csv(gateway):
    base = datetime(2026, 6, 1, tzinfo=UTC)
    _fill(gateway, [(base + timedelta(days=d), None, EMBED, {"input": 1000}) for d in range(4)])
    resp = gateway.client.get(
        "/api/v1/billing/usage-history",
        params={"startTimestamp": "2026-06-02T00:00:00Z", "endTimestamp": "2026-06-04T00:00:00Z"},
        headers={**gateway.auth(), "Accept": "text/csv"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/csv")
    assert resp.headers["content-disposition"].startswith(
        "attachment; filename=billing-usage-history-")
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert [r["timestamp"][:10] for r in rows] == ["2026-06-02", "2026-06-03"]
    assert rows[0]["sku"] == "embed-b-embedding-input-mtoken"
    assert "x-next-cursor" not in resp.headers


def test_usage_analytics_shapes(gateway):
    key_a = gateway.create_key(description="Production")["id"]
    key_b = gateway.create_key(description="Batch jobs")["id"]
    today = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    _fill(gateway, [
        (today, key_a, TEXT, {"input": 2_000_000, "output": 1_000_000}),  # 1 + 1 USD
        (today - timedelta(days=1), key_b, TEXT, {"input": 400_000}),     # 0.2 USD
        (today - timedelta(days=2), None, EMBED, {"input": 1_000_000}),   # 0.1 USD
    ])
    resp = gateway.client.get("/api/v1/billing/usage-analytics", params={"lookback": "3d"},
                              headers=gateway.auth())
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["lookback"] == "3d"
    assert [d["USD"] for d in body["byDate"]] == [2, 0.2, 0.1]
    assert body["byDate"][0]["date"] == f"{today.date().isoformat()}T00:00:00.000Z"
    chat, embed = body["byModel"]
    assert chat["modelName"] == "chat-a" and chat["totalUsd"] == 2.2
    assert chat["unitType"] == "tokens" and chat["modelType"] == "LLM"
    assert {b["type"] for b in chat["breakdown"]} == {"Input", "Output"}
    assert "breakdown" not in embed and embed["modelType"] is None
    assert body["topModels"] == ["chat-a", "embed-b"]
    assert [(k["apiKeyId"], k["description"]) for k in body["byKey"]] == [
        (key_a, "Production"), (key_b, "Batch jobs"), (None, "Web App")]
    assert body["topKeyNames"] == ["Production", "Batch jobs", "Web App"]
    assert len(body["byModelDaily"]) == 3 and body["byModelDaily"][-1]["date"] > \
        body["byModelDaily"][0]["date"]
    assert body["byKeyDaily"][-1]["Production"] == 2


@pytest.mark.parametrize("params", [
    {"lookback": "91d"}, {"lookback": "0d"}, {"lookback": "7"}, {"lookback": "7d\n"},
    {"startDate": "2026-01-01"},
    {"startDate": "2026-01-10", "endDate": "2026-01-01"},
    {"startDate": "2026-01-01", "endDate": "2026-06-01"}, {"startDate": "01-01-2026",
                                                           "endDate": "2026-01-02"},
])
def test_usage_analytics_refuses_bad_ranges(gateway, params):
    resp = gateway.client.get("/api/v1/billing/usage-analytics", params=params,
                              headers=gateway.auth())
    assert resp.status_code == 400
    assert resp.json()["details"]


def test_usage_analytics_takes_a_date_range(gateway):
    resp = gateway.client.get("/api/v1/billing/usage-analytics",
                              params={"startDate": "2026-01-01", "endDate": "2026-01-31"},
                              headers=gateway.auth())
    assert resp.status_code == 200
    body = resp.json()
    assert body["lookback"] == "2026-01-01:2026-01-31" and len(body["byDate"]) == 31


def test_privacy_tiers_name_the_rule():
    anon_text = TEXT.model_copy(update={"privacy": "anonymized"})
    anon_image = CatalogModel(id="img", type="image", name="img", deployment="image",
                              engine="x", privacy="anonymized", pricing={})

    class Key:
        def __init__(self, tier):
            self.model_privacy = tier

    check_privacy(Key("ALL"), anon_text)
    check_privacy(Key("PRIVATE_TEXT"), anon_image)
    check_privacy(Key("PRIVATE_ONLY"), TEXT)
    for tier, model in (("PRIVATE_TEXT", anon_text), ("PRIVATE_ONLY", anon_image)):
        with pytest.raises(ApiError) as err:
            check_privacy(Key(tier), model)
        assert err.value.status == 403 and err.value.code is None
        assert err.value.message.startswith(f"This API key is set to '{tier}', but `")


def test_characters_and_reviews(gateway):
    created = gateway.client.post("/api/v1/characters", headers=gateway.auth(), json={
        "slug": "sage", "name": "The Sage", "description": "Calm advice",
        "systemPrompt": "You are a calm sage.", "tags": ["wisdom"]})
    assert created.status_code == 200, created.text
    for i, rating in enumerate([5, 4, 3]):
        resp = gateway.client.post("/api/v1/characters/sage/reviews", headers=gateway.auth(),
                                   json={"username": f"user{i}", "rating": rating,
                                         "message": "ok"})
        assert resp.status_code == 200
    inference = gateway.create_key()["apiKey"]
    listed = gateway.client.get("/api/v1/characters", headers=gateway.auth(inference)).json()
    assert [c["slug"] for c in listed["data"]] == ["sage"]
    one = gateway.client.get("/api/v1/characters/sage", headers=gateway.auth(inference)).json()
    assert one["data"]["stats"]["ratingCount"] == 3 and one["data"]["stats"]["averageRating"] == 4
    page = gateway.client.get("/api/v1/characters/sage/reviews",
                              params={"page": 2, "pageSize": 2}, headers=gateway.auth(inference))
    assert page.status_code == 200
    body = page.json()
    assert body["object"] == "list" and len(body["data"]) == 1
    assert body["pagination"] == {"page": 2, "pageSize": 2, "total": 3, "totalPages": 2}
    assert body["summary"] == {"averageRating": 4, "totalReviews": 3}
    assert page.headers["x-pagination-total-pages"] == "2"
    assert page.headers["x-pagination-page"] == "2"
    for params in ({"pageSize": 101}, {"pageSize": 0}, {"page": 0}):
        bad = gateway.client.get("/api/v1/characters/sage/reviews", params=params,
                                 headers=gateway.auth(inference))
        assert bad.status_code == 400
    missing = gateway.client.get("/api/v1/characters/nobody/reviews",
                                 headers=gateway.auth(inference))
    assert missing.status_code == 404 and missing.json()["code"] == "CHARACTER_NOT_FOUND"
    refused = gateway.client.post("/api/v1/characters", headers=gateway.auth(inference),
                                  json={"slug": "x", "name": "x"})
    assert refused.status_code == 401
    # Another account's ADMIN key may not publish to every account.
    other = cli(["create-account", "--usd", "1"], settings=gateway.services.settings)["apiKey"]
    denied = gateway.client.post("/api/v1/characters", headers=gateway.auth(other),
                                 json={"slug": "x", "name": "x"})
    assert denied.status_code == 403 and denied.json()["code"] == "UNAUTHORIZED"
    huge = gateway.client.get("/api/v1/characters/sage/reviews",
                              params={"page": 10**20}, headers=gateway.auth(inference))
    assert huge.status_code == 400


def test_a_limit_set_after_spending_counts_what_was_spent(gateway):
    key = gateway.create_key(description="late limit")
    _fill(gateway, [(datetime.now(UTC), key["id"], TEXT, {"output": 30_000})])  # 0.03 USD
    resp = gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(), json={
        "id": key["id"], "consumptionLimit": {"usd": 0.04}, "limitPeriod": "EPOCH"})
    assert resp.status_code == 200

    async def attempt():
        billing = Billing(gateway.services.settings.resolved_database_url)
        try:
            payer = Payer(gateway.account_id, api_key_id=key["id"], limit_period="EPOCH",
                          limit_usd_nanos=to_nanos("0.04"))
            await billing.hold("after-limit", payer, to_nanos("0.02"))
        finally:
            billing.close()

    with pytest.raises(ApiError) as err:
        asyncio.run(attempt())
    assert err.value.code == "API_KEY_USD_SPEND_LIMIT_EXCEEDED"
