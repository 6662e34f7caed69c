"""`x-service-host-name` on every answer, errors included, and the client's request timestamp
echoed in `x-service-request-timestamp-ms`."""

from __future__ import annotations

import socket

from serve_app.middleware import MAX_BODY_BYTES


def test_every_answer_names_the_host_errors_included(gateway):
    host = socket.gethostname()
    answers = [
        gateway.client.get("/api/v1/models"),  # 200
        gateway.client.get("/api/v1/api_keys"),  # 401, no key
        gateway.client.get("/api/v1/api_keys", headers=gateway.auth()),  # 200 with a key
        gateway.client.get("/api/v1/no-such-route"),  # 404 of the API
        gateway.client.get("/elsewhere"),  # 404 of the site
        gateway.client.post("/api/v1/api_keys", headers=gateway.auth(),
                            json={"apiKeyType": "ROOT"}),  # 400
        gateway.client.post("/api/v1/api_keys", headers={
            **gateway.auth(), "content-type": "application/json",
            "content-length": str(MAX_BODY_BYTES + 1)}, content=b"{}"),  # 413
    ]
    assert [r.status_code for r in answers] == [200, 401, 200, 404, 404, 400, 413]
    assert {r.headers["x-service-host-name"] for r in answers} == {host}


def test_the_clients_request_timestamp_is_echoed(gateway):
    sent = "1767225600123"
    for resp in (gateway.client.get("/api/v1/models",
                                    headers={"x-service-request-timestamp-ms": sent}),
                 gateway.client.get("/api/v1/api_keys",  # an error answer echoes it too
                                    headers={"X-Service-Request-Timestamp-Ms": sent})):
        assert resp.headers["x-service-request-timestamp-ms"] == sent
    fraction = gateway.client.get("/api/v1/models",
                                  headers={"x-service-request-timestamp-ms": "1767225600123.5"})
    assert fraction.headers["x-service-request-timestamp-ms"] == "1767225600123.5"


def test_no_timestamp_or_one_that_is_not_milliseconds_is_not_echoed(gateway):
    assert "x-service-request-timestamp-ms" not in gateway.client.get("/api/v1/models").headers
    for bad in ("yesterday", "-5", "1e12", "12345678901234567890", "<script>"):
        resp = gateway.client.get("/api/v1/models",
                                  headers={"x-service-request-timestamp-ms": bad})
        assert resp.status_code == 200
        assert "x-service-request-timestamp-ms" not in resp.headers, bad
