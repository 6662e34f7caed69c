"""`x-ratelimit-*` on every authenticated answer, not only on the routes that count: a route
without a model (/models with a key, /api_keys, /billing, a video's retrieval) tells the key's
window nearest its limits, read without counting a request."""

from __future__ import annotations

import base64
import io
import time

from PIL import Image

RATE_HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests", "x-ratelimit-type")


def _embed(gateway, key: str):
    return gateway.client.post("/api/v1/embeddings", headers=gateway.auth(key),
                               json={"model": "embed-small", "input": "hello"})


def _upscale(gateway, key: str):
    image = io.BytesIO()
    Image.new("RGB", (256, 256), (200, 30, 30)).save(image, format="PNG")
    return gateway.client.post("/api/v1/image/upscale", headers=gateway.auth(key), json={
        "image": base64.b64encode(image.getvalue()).decode(), "scale": 2})


def _windows(resp) -> dict[str, str]:
    return {name: resp.headers.get(name) for name in RATE_HEADERS}


def test_routes_without_a_model_tell_the_keys_windows_without_counting(fake_gateway, key):
    gw = fake_gateway
    admin = gw.create_key(apiKeyType="ADMIN")["apiKey"]
    fresh = gw.client.get("/api/v1/models", headers=gw.auth(admin))
    assert fresh.status_code == 200
    # Nothing used yet: the catalog's first class (chat-primary, XS: 500 a minute), in full.
    assert fresh.headers["x-ratelimit-limit-requests"] == "500"
    assert fresh.headers["x-ratelimit-remaining-requests"] == "500"
    assert fresh.headers["x-ratelimit-limit-tokens"] == "5000000"
    assert fresh.headers["x-ratelimit-type"] == "api_key"
    assert int(fresh.headers["x-ratelimit-reset-requests"]) >= time.time()

    for _ in range(3):
        assert _embed(gw, admin).status_code == 200
    counted = _embed(gw, admin)
    assert counted.headers["x-ratelimit-remaining-requests"] == "496"
    reset = counted.headers["x-ratelimit-reset-requests"]

    routes = [("GET", "/api/v1/models"), ("GET", "/api/v1/api_keys"),
              ("GET", "/api/v1/api_keys/rate_limits"), ("GET", "/api/v1/billing/balance"),
              ("GET", "/api/v1/billing/usage-history"), ("GET", "/api/v1/api_keys/missing"),
              ("POST", "/api/v1/video/retrieve")]
    for _ in range(2):  # read twice: reading counts nothing
        for method, path in routes:
            resp = gw.client.request(method, path, headers=gw.auth(admin),
                                     json={} if method == "POST" else None)
            assert _windows(resp) == {
                "x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "496",
                "x-ratelimit-reset-requests": reset, "x-ratelimit-type": "api_key"}, (path, resp)
    # The next counted request is the fifth of the window.
    assert _embed(gw, admin).headers["x-ratelimit-remaining-requests"] == "495"


def test_the_window_nearest_its_limit_is_told(fake_gateway, key):
    gw = fake_gateway
    for _ in range(5):
        assert _embed(gw, key).status_code == 200  # 5 of 500
    assert _upscale(gw, key).status_code == 200  # 1 of 20: the nearer its limit
    resp = gw.client.get("/api/v1/api_keys/rate_limits", headers=gw.auth(key))
    assert resp.status_code == 200
    assert resp.headers["x-ratelimit-limit-requests"] == "20"
    assert resp.headers["x-ratelimit-remaining-requests"] == "19"
    assert "x-ratelimit-limit-tokens" not in resp.headers  # images count no tokens


def test_an_unauthenticated_answer_has_no_window_and_others_keep_theirs(fake_gateway, key):
    gw = fake_gateway
    public = gw.client.get("/api/v1/models")
    assert "x-ratelimit-limit-requests" not in public.headers
    bad_key = gw.auth("sk-not-a-key")
    public = gw.client.get("/api/v1/models", headers=bad_key)  # read as if no key was sent
    assert public.status_code == 200
    assert "x-ratelimit-limit-requests" not in public.headers
    refused = gw.client.get("/api/v1/api_keys", headers=bad_key)
    assert refused.status_code == 401
    assert "x-ratelimit-limit-requests" not in refused.headers
    # An answer that counted keeps the headers of its own decision.
    resp = _embed(gw, key)
    assert resp.headers["x-ratelimit-remaining-requests"] == "499"
