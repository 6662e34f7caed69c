"""The real Serve application on a local Ray instance, driven over HTTP."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

pytestmark = pytest.mark.integration


def test_models_answer_without_a_key_with_service_headers(platform):
    resp = httpx.get(f"{platform.base_url}/models")
    assert resp.status_code == 200
    assert resp.json()["object"] == "list"
    assert len(resp.headers.get_list("date")) == 1
    # Under Serve the id is the one Serve's own middleware made (a UUID) and sent as
    # X-Request-ID; the Gateway makes 32 hex digits where nothing made one before it.
    assert re.fullmatch(r"[0-9a-f]{32}|[0-9a-f-]{36}", resp.headers["cf-ray"])
    assert re.fullmatch(r"\d{8}\.\d{6}", resp.headers["x-service-version"])
    assert resp.headers["x-service-timestamp"]


def test_admin_creates_an_inference_key_that_authenticates(platform):
    created = httpx.post(f"{platform.base_url}/api_keys", headers=platform.auth(),
                         json={"apiKeyType": "INFERENCE", "description": "integration"})
    assert created.status_code == 200
    key = created.json()["data"]["apiKey"]
    # An authenticated route: the inference key is recognised, and refused as not admin.
    resp = httpx.get(f"{platform.base_url}/api_keys", headers=platform.auth(key))
    assert resp.status_code == 401
    assert resp.json()["error"] == "Admin API key required"
    unknown = httpx.get(f"{platform.base_url}/api_keys", headers=platform.auth("sk-nope"))
    assert unknown.json()["error"] == "Authentication failed"


def test_errors_have_the_spec_shapes_through_serve(platform):
    missing = httpx.get(f"{platform.base_url}/no-such-route")
    assert (missing.status_code, missing.json()) == (404, {"error": "Not found"})
    wrong_type = httpx.post(f"{platform.base_url}/api_keys", headers=platform.auth(),
                            content=b"apiKeyType=ADMIN",
                            )
    assert wrong_type.status_code == 415
    invalid = httpx.post(f"{platform.base_url}/api_keys", headers=platform.auth(),
                         json={"description": "x" * 65})
    assert invalid.status_code == 400
    assert invalid.json()["details"]["description"]["_errors"]
    assert httpx.get(f"{platform.base_url}/openapi.json").json()["info"]["version"]


def test_a_revoked_key_stops_working_on_every_replica_at_once(platform):
    first, second = platform.replica_urls[:2]
    created = httpx.post(f"{first}/api_keys", headers=platform.auth(),
                         json={"apiKeyType": "ADMIN", "description": "to revoke"}).json()["data"]
    headers = platform.auth(created["apiKey"])
    # Both replicas now hold the key in their caches.
    for url in (first, second):
        assert httpx.get(f"{url}/api_keys", headers=headers).status_code == 200
    revoked = httpx.delete(f"{first}/api_keys", params={"id": created["id"]},
                           headers=platform.auth())
    assert revoked.json() == {"success": True}
    for url in (second, first):
        assert httpx.get(f"{url}/api_keys", headers=headers).status_code == 401


def test_an_edited_key_changes_on_every_replica_at_once(platform):
    first, second = platform.replica_urls[:2]
    created = httpx.post(f"{first}/api_keys", headers=platform.auth(),
                         json={"apiKeyType": "ADMIN", "expiresAt": "2099-01-01"}).json()["data"]
    headers = platform.auth(created["apiKey"])
    assert httpx.get(f"{second}/api_keys", headers=headers).status_code == 200
    # 20 s ahead: still in the future when the edit lands, however slow the machine; then
    # waited out, whatever time the edit took
    soon = datetime.now(UTC) + timedelta(seconds=20)
    resp = httpx.patch(f"{first}/api_keys", headers=platform.auth(),
                       json={"id": created["id"], "expiresAt": soon.isoformat()})
    assert resp.status_code == 200
    time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.5)
    # The second replica cached the key with its 2099 expiry; the edit reached it.
    assert httpx.get(f"{second}/api_keys", headers=headers).status_code == 401


@pytest.mark.parametrize("sent", [None, "client-id-0042", "not usable"])
def test_the_request_id_goes_out_once_as_x_request_id_and_cf_ray(platform, sent):
    """Serve's own middleware sends X-Request-ID: the Gateway adopts the id it reads (the
    client's usable one, or Serve's own) and sends only CF-RAY beside it."""
    headers = {} if sent is None else {"X-Request-ID": sent}
    resp = httpx.get(f"{platform.base_url}/models", headers=headers)
    assert resp.status_code == 200
    request_ids, rays = resp.headers.get_list("x-request-id"), resp.headers.get_list("cf-ray")
    assert len(request_ids) == len(rays) == 1, resp.headers
    assert request_ids == rays
    if sent == "client-id-0042":
        assert rays == [sent]
    else:
        assert rays[0] != "not usable"


def test_health_and_ready_at_the_site_root(platform):
    root = platform.base_url.removesuffix("/api/v1")
    assert httpx.get(f"{root}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{root}/ready", timeout=30)
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert checks["database"] == "ok"
    # Serve's controller counts a running replica for each default model of a running
    # deployment (text-m, left down, serves no default model).
    assert [part for part, state in checks.items() if part.startswith("model:") and state == "ok"]
