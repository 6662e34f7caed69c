"""Every response carries the service headers, and every error has the spec's shape."""

from __future__ import annotations

import logging
import re

from fastapi import APIRouter

from serve_app.middleware import MAX_BODY_BYTES
from serve_app.version import service_version

VERSION = re.compile(r"^\d{8}\.\d{6}$")


def _assert_service_headers(resp) -> None:
    assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["cf-ray"])
    assert VERSION.match(resp.headers["x-service-version"])
    assert re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$",
                    resp.headers["x-service-timestamp"])
    assert resp.headers["content-type"].startswith("application/json")


def test_success_error_and_404_responses_carry_service_headers(gateway):
    for resp in (gateway.client.get("/api/v1/models"),
                 gateway.client.get("/api/v1/api_keys"),
                 gateway.client.get("/api/v1/no-such-route"),
                 gateway.client.get("/elsewhere")):
        _assert_service_headers(resp)


def test_each_request_gets_its_own_request_id(gateway):
    ids = {gateway.client.get("/api/v1/models").headers["cf-ray"] for _ in range(5)}
    assert len(ids) == 5


def test_unknown_route_is_404_standard_error(gateway):
    for path in ("/api/v1/no-such-route", "/nothing/here"):
        resp = gateway.client.get(path)
        assert resp.status_code == 404
        assert resp.json() == {"error": "Not found"}


def test_wrong_content_type_is_415(gateway):
    resp = gateway.client.post("/api/v1/api_keys", headers={
        **gateway.auth(), "content-type": "text/plain"}, content=b'{"apiKeyType":"ADMIN"}')
    assert resp.status_code == 415
    assert resp.json()["code"] == "INVALID_CONTENT_TYPE"
    assert "application/json" in resp.json()["error"]


def test_malformed_json_is_400_detailed_error(gateway):
    resp = gateway.client.post("/api/v1/api_keys", headers={
        **gateway.auth(), "content-type": "application/json"}, content=b'{"apiKeyType": ')
    assert resp.status_code == 400
    body = resp.json()
    assert body["error"] == "Malformed JSON in request body"
    assert body["details"]["_errors"]


def test_validation_errors_nest_field_names_with_top_level_errors(gateway):
    resp = gateway.client.post("/api/v1/api_keys", headers=gateway.auth(), json={
        "apiKeyType": "ROOT", "description": "d" * 65, "consumptionLimit": {"usd": -1}})
    assert resp.status_code == 400
    details = resp.json()["details"]
    assert details["_errors"] == []
    assert details["apiKeyType"]["_errors"]
    assert details["description"]["_errors"] == ["String should have at most 64 characters"]
    assert details["consumptionLimit"]["usd"]["_errors"]
    assert details["consumptionLimit"]["_errors"] == []


def test_body_over_the_cap_is_413_before_it_is_read(gateway):
    resp = gateway.client.post("/api/v1/api_keys", headers={
        **gateway.auth(), "content-type": "application/json",
        "content-length": str(MAX_BODY_BYTES + 1)}, content=b"{}")
    assert resp.status_code == 413
    assert resp.json()["code"] == "PAYLOAD_TOO_LARGE"


def test_unexpected_exception_is_500_without_trace_and_logged_with_request_id(gateway, caplog):
    router = APIRouter()

    @router.get("/boom")
    async def boom() -> dict:
        raise RuntimeError("secret internal detail")

    inner = gateway.client.app.app.api  # the site (under its headers middleware) -> the API
    inner.include_router(router)
    caplog.set_level(logging.ERROR, logger="serve_app")
    resp = gateway.client.get("/api/v1/boom")
    assert resp.status_code == 500
    assert resp.json() == {"error": "An unknown error occurred", "code": "UNKNOWN_ERROR"}
    assert "secret internal detail" not in resp.text
    _assert_service_headers(resp)
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any(resp.headers["cf-ray"] in r.getMessage() for r in logged)


def test_openapi_document_carries_the_service_version(gateway):
    resp = gateway.client.get("/api/v1/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["info"]["version"] == service_version()
    assert VERSION.match(doc["info"]["version"])
    assert "/api_keys" in doc["paths"] and "/models" in doc["paths"]
    assert gateway.client.get("/api/v1/docs").status_code == 200



def test_json_log_lines_carry_the_request_id():
    """Serve's JSON log encoding (configs: `logging_config.encoding: JSON`) writes a record's
    extra fields: ours carry the request id as `cf_ray`, the `CF-RAY` the client got."""
    import json
    import logging

    from ray._common.formatters import JSONFormatter

    from serve_app.middleware import RequestIdLogFilter, request_id_var

    def line(message: str) -> dict:
        record = logging.LogRecord("serve_app.probe", logging.WARNING, __file__, 1, message,
                                   None, None)
        RequestIdLogFilter().filter(record)
        return json.loads(JSONFormatter().format(record))

    token = request_id_var.set("8f2a4c1d9e7b3a60")
    try:
        inside = line("inside a request")
    finally:
        request_id_var.reset(token)
    assert inside["cf_ray"] == "8f2a4c1d9e7b3a60" and inside["message"] == "inside a request"
    assert inside["levelname"] == "WARNING"
    assert line("between requests")["cf_ray"] == "-"
