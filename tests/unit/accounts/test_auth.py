"""Bearer key authentication: missing, bad, revoked and expired keys; admin-only routes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, select

from serve_app.accounts import key_store
from serve_app.cli import run as cli
from serve_app.db.tables import ApiKey, utcnow


def test_missing_key_is_401(gateway):
    resp = gateway.client.get("/api/v1/api_keys")
    assert resp.status_code == 401
    assert resp.json()["code"] == "AUTHENTICATION_FAILED"
    assert "Bearer" in resp.json()["error"]


def test_non_bearer_scheme_is_401(gateway):
    resp = gateway.client.get("/api/v1/api_keys",
                              headers={"Authorization": f"Basic {gateway.admin_key}"})
    assert resp.status_code == 401


def test_unknown_key_is_401(gateway):
    resp = gateway.client.get("/api/v1/api_keys", headers=gateway.auth("sk-not-a-real-key"))
    assert resp.status_code == 401
    assert resp.json() == {"error": "Authentication failed", "code": "AUTHENTICATION_FAILED"}


def test_inference_key_cannot_use_admin_routes(gateway):
    key = gateway.create_key()["apiKey"]
    for method, path in (("GET", "/api/v1/api_keys"), ("POST", "/api/v1/api_keys"),
                         ("DELETE", "/api/v1/api_keys?id=x"), ("GET", "/api/v1/api_keys/x")):
        resp = gateway.client.request(method, path, headers=gateway.auth(key), json={})
        assert resp.status_code == 401, (method, path)
        assert resp.json()["error"] == "Admin API key required"


def test_revoked_key_stops_working_at_once(gateway):
    created = gateway.create_key(apiKeyType="ADMIN")
    assert gateway.client.get("/api/v1/api_keys",
                              headers=gateway.auth(created["apiKey"])).status_code == 200
    resp = gateway.client.delete(f"/api/v1/api_keys?id={created['id']}", headers=gateway.auth())
    assert resp.json() == {"success": True}
    again = gateway.client.get("/api/v1/api_keys", headers=gateway.auth(created["apiKey"]))
    assert again.status_code == 401


def test_expired_key_is_refused(gateway, monkeypatch):
    """An hour later (the key store's clock moved on, rather than a wait that a slow
    request could outlast either way), the key that expired meanwhile is refused."""
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    key = gateway.create_key(apiKeyType="ADMIN", expiresAt=soon)["apiKey"]
    assert gateway.client.get("/api/v1/api_keys", headers=gateway.auth(key)).status_code == 200
    monkeypatch.setattr(key_store, "utcnow", lambda: utcnow() + timedelta(hours=1, seconds=1))
    resp = gateway.client.get("/api/v1/api_keys", headers=gateway.auth(key))
    assert resp.status_code == 401
    assert resp.json()["error"] == "API key has expired"


def test_key_revoked_from_the_cli_stops_working_after_the_sync(gateway):
    created = gateway.create_key(apiKeyType="ADMIN")
    headers = gateway.auth(created["apiKey"])
    assert gateway.client.get("/api/v1/api_keys", headers=headers).status_code == 200
    cli(["revoke-key", created["id"]], settings=gateway.services.settings)
    deadline = time.monotonic() + 3 * gateway.services.settings.key_sync_interval_s + 120
    status = 200
    while time.monotonic() < deadline and status == 200:
        time.sleep(0.2)
        status = gateway.client.get("/api/v1/api_keys", headers=headers).status_code
    assert status == 401


def test_secrets_are_stored_only_as_hashes(gateway):
    secret = gateway.create_key()["apiKey"]
    with Session(gateway.services.engine) as session:
        rows = session.exec(select(ApiKey)).all()
    stored = " ".join(str(v) for row in rows for v in row.model_dump().values())
    assert secret not in stored
    assert gateway.admin_key not in stored
    assert secret[-6:] in stored  # only the last six characters, for display


def test_last_used_at_is_recorded(gateway):
    created = gateway.create_key(apiKeyType="ADMIN")
    gateway.client.get("/api/v1/api_keys", headers=gateway.auth(created["apiKey"]))
    deadline = time.monotonic() + 3 * gateway.services.settings.key_sync_interval_s + 120
    used = None
    while time.monotonic() < deadline and used is None:
        time.sleep(0.3)
        used = gateway.client.get(f"/api/v1/api_keys/{created['id']}",
                                  headers=gateway.auth()).json()["data"]["lastUsedAt"]
    assert used is not None
    assert datetime.fromisoformat(used) <= datetime.now(UTC)
