"""`/api_keys`: every field rule of the spec, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlmodel import Session

from serve_app.accounts import key_store
from serve_app.accounts.keys import MAX_ACTIVE_KEYS
from serve_app.accounts.secrets import hash_secret
from serve_app.db.tables import ApiKey, utcnow

CREATE_FIELDS = {"apiKey", "id", "apiKeyType", "description", "consumptionLimit",
                 "limitPeriod", "modelPrivacy", "expiresAt"}
RECORD_FIELDS = {"id", "apiKeyType", "description", "consumptionLimits", "limitPeriod",
                 "modelPrivacy", "createdAt", "expiresAt", "last6Chars", "lastUsedAt"}


def test_create_returns_the_secret_once_with_the_published_fields(pg_gateway):
    resp = pg_gateway.client.post("/api/v1/api_keys", headers=pg_gateway.auth(), json={
        "apiKeyType": "INFERENCE", "description": "ci runner",
        "consumptionLimit": {"usd": 50, "diem": 10.5}, "limitPeriod": "MONTH",
        "modelPrivacy": "PRIVATE_TEXT", "expiresAt": "2099-01-31"})
    assert resp.status_code == 200
    body = resp.json()
    assert body["success"] is True
    data = body["data"]
    assert set(data) == CREATE_FIELDS
    assert data["apiKey"].startswith("sk-")
    assert data["consumptionLimit"] == {"usd": 50, "diem": 10.5, "vcu": None}
    assert data["limitPeriod"] == "MONTH"
    assert data["modelPrivacy"] == "PRIVATE_TEXT"
    assert data["expiresAt"] == "2099-01-31T00:00:00.000Z"

    listed = pg_gateway.client.get("/api/v1/api_keys", headers=pg_gateway.auth()).json()
    assert listed["object"] == "list"
    record = next(k for k in listed["data"] if k["id"] == data["id"])
    # List and get add the key's usage; the limited key also its current-period usage.
    assert set(record) == RECORD_FIELDS | {"usage", "currentPeriodUsage"}
    assert record["usage"] == {"trailingSevenDays": {"usd": "0.0000", "vcu": "0.0000",
                                                     "diem": "0.0000"}}
    assert record["currentPeriodUsage"] == {"usd": "0.0000", "diem": "0.0000"}
    assert record["last6Chars"] == data["apiKey"][-6:]
    assert "apiKey" not in record


def test_defaults_are_inference_epoch_all_and_no_expiry(gateway):
    data = gateway.create_key()
    assert (data["apiKeyType"], data["limitPeriod"], data["modelPrivacy"]) == (
        "INFERENCE", "EPOCH", "ALL")
    assert data["expiresAt"] is None


def test_description_longer_than_64_characters_is_refused(gateway):
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(),
                               json={"apiKeyType": "INFERENCE", "description": "x" * 65})
    assert resp.status_code == 400
    assert resp.json()["details"]["description"]["_errors"]
    ok = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(),
                             json={"apiKeyType": "INFERENCE", "description": "x" * 64})
    assert ok.status_code == 200


def test_enums_and_limits_are_validated(gateway):
    for body, field in (({"apiKeyType": "OWNER"}, "apiKeyType"),
                        ({"limitPeriod": "WEEK"}, "limitPeriod"),
                        ({"modelPrivacy": "SOME"}, "modelPrivacy"),
                        ({"consumptionLimit": {"diem": -5}}, "consumptionLimit"),
                        ({"consumptionLimit": {"usd": 10_000_000_000}}, "consumptionLimit"),
                        ({"consumptionLimit": {"usd": "lots"}}, "consumptionLimit")):
        resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(), json=body)
        assert resp.status_code == 400, body
        assert field in resp.json()["details"], body


def test_expiry_accepts_date_and_date_time_and_refuses_past_or_garbage(gateway):
    assert gateway.create_key(expiresAt="2099-05-01T10:20:30Z")["expiresAt"] == (
        "2099-05-01T10:20:30.000Z")
    assert gateway.create_key(expiresAt="")["expiresAt"] is None
    for value in ("2001-01-01", "next tuesday", 12345):
        resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(),
                                   json={"apiKeyType": "INFERENCE", "expiresAt": value})
        assert resp.status_code == 400, value
        assert resp.json()["details"]["expiresAt"]["_errors"], value


def test_update_changes_only_given_fields_and_names_consumption_limits(pg_gateway):
    created = pg_gateway.create_key(consumptionLimit={"usd": 5, "diem": 1},
                                    expiresAt="2099-01-01")
    resp = pg_gateway.client.patch("/api/v1/api_keys", headers=pg_gateway.auth(), json={
        "id": created["id"], "description": "renamed", "consumptionLimit": {"usd": 7},
        "limitPeriod": "LIFETIME"})
    assert resp.status_code == 200
    data = resp.json()["data"]
    assert set(data) == RECORD_FIELDS
    assert data["description"] == "renamed"
    assert data["consumptionLimits"] == {"usd": 7, "diem": 1, "vcu": None}
    assert data["limitPeriod"] == "LIFETIME"
    assert data["modelPrivacy"] == "ALL"
    assert data["expiresAt"] == "2099-01-01T00:00:00.000Z"
    assert data["last6Chars"] == created["apiKey"][-6:]
    assert data["createdAt"]


def test_update_with_empty_or_null_expiry_removes_it(gateway):
    for removal in ("", None):
        created = gateway.create_key(expiresAt="2099-01-01")
        resp = gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(),
                                    json={"id": created["id"], "expiresAt": removal})
        assert resp.status_code == 200
        assert resp.json()["data"]["expiresAt"] is None


def test_update_takes_effect_on_a_cached_key_at_once(gateway, monkeypatch):
    """The cached key gets its new expiry: an hour later (the key store's clock moved on,
    not a wait) it is refused, where its old expiry (2099) would still let it in."""
    created = gateway.create_key(apiKeyType="ADMIN", expiresAt="2099-01-01")
    headers = gateway.auth(created["apiKey"])
    assert gateway.client.get("/api/v1/api_keys", headers=headers).status_code == 200
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(),
                         json={"id": created["id"], "expiresAt": soon})
    monkeypatch.setattr(key_store, "utcnow", lambda: utcnow() + timedelta(hours=1, seconds=1))
    assert gateway.client.get("/api/v1/api_keys", headers=headers).status_code == 401


def test_update_unknown_key_is_404_and_missing_id_is_400(gateway):
    resp = gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(),
                                json={"id": "00000000-0000-0000-0000-000000000000"})
    assert resp.status_code == 404
    resp = gateway.client.patch("/api/v1/api_keys", headers=gateway.auth(),
                                json={"description": "x"})
    assert resp.status_code == 400
    assert resp.json()["details"]["id"]["_errors"] == ["Required"]


def test_get_by_id_and_delete(pg_gateway):
    created = pg_gateway.create_key(description="to delete")
    got = pg_gateway.client.get(f"/api/v1/api_keys/{created['id']}", headers=pg_gateway.auth())
    assert got.status_code == 200
    assert got.json()["data"]["description"] == "to delete"

    resp = pg_gateway.client.delete(f"/api/v1/api_keys?id={created['id']}",
                                    headers=pg_gateway.auth())
    assert resp.json() == {"success": True}
    listed = pg_gateway.client.get("/api/v1/api_keys", headers=pg_gateway.auth()).json()["data"]
    assert created["id"] not in {k["id"] for k in listed}
    assert pg_gateway.client.get(f"/api/v1/api_keys/{created['id']}",
                                 headers=pg_gateway.auth()).status_code == 404
    assert pg_gateway.client.delete(f"/api/v1/api_keys?id={created['id']}",
                                    headers=pg_gateway.auth()).status_code == 404
    missing = pg_gateway.client.delete("/api/v1/api_keys", headers=pg_gateway.auth())
    assert missing.status_code == 400
    assert missing.json()["details"]["id"]["_errors"]


def test_an_account_holds_at_most_500_active_keys(pg_gateway):
    with Session(pg_gateway.services.engine) as session:
        existing = len(pg_gateway.client.get("/api/v1/api_keys",
                                             headers=pg_gateway.auth()).json()["data"])
        for i in range(MAX_ACTIVE_KEYS - existing - 1):
            session.add(ApiKey(account_id=pg_gateway.account_id, key_hash=hash_secret(f"k{i}"),
                               last6=f"{i:06d}"))
        session.commit()
    assert pg_gateway.client.post("/api/v1/api_keys", headers=pg_gateway.auth(),
                                  json={"apiKeyType": "INFERENCE"}).status_code == 200
    resp = pg_gateway.client.post("/api/v1/api_keys", headers=pg_gateway.auth(),
                                  json={"apiKeyType": "INFERENCE"})
    assert resp.status_code == 400
    assert "500" in resp.json()["error"]


def test_keys_of_another_account_are_invisible(gateway):
    from serve_app.cli import run as cli
    from serve_app.db.tables import Account

    with Session(gateway.services.engine) as session:
        other = Account()
        session.add(other)
        session.commit()
        other_id = other.id
    foreign = cli(["create-key", "--type", "ADMIN", "--account", other_id],
                  settings=gateway.services.settings)
    mine = gateway.client.get("/api/v1/api_keys", headers=gateway.auth()).json()["data"]
    assert foreign["id"] not in {k["id"] for k in mine}
    assert gateway.client.get(f"/api/v1/api_keys/{foreign['id']}",
                              headers=gateway.auth()).status_code == 404
    assert gateway.client.delete(f"/api/v1/api_keys?id={foreign['id']}",
                                 headers=gateway.auth()).status_code == 404
